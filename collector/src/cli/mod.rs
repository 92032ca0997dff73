//! The `collector` command line, one file per family of commands: [`trace`] (the program
//! tracer, and the flags `collector-capture` shares), [`traces`] (reading, converting and
//! analysing trace files) and [`serve`]. `collector` itself never loads libtorch: the commands
//! that run models in-process (`trace --model`/`--torchscript`, `sweep`, `overhead`) are
//! handed to the `collector-capture` binary beside it ([`run_in_capture`]), which parses the
//! same [`Cli`].

pub mod serve;
pub mod trace;
pub mod traces;

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// Memory Tracer: where GPU memory goes when a PyTorch model runs.
#[derive(Parser)]
#[command(name = "collector", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Record every allocation, operator and layer of a Python program
    /// (`collector trace -o run.mtrace.json -- python train.py ARGS`) or of a built-in or
    /// TorchScript model run through libtorch.
    Trace(Box<trace::TraceArgs>),
    /// Write the `memory_tracer` Python package this collector carries (sources and the
    /// capture library) into a folder, for building the wheel.
    #[command(hide = true)]
    PythonPackage {
        #[arg(long)]
        out: PathBuf,
    },
    /// Read one capture stream from an inherited socket and build its trace (what the Python
    /// `memory_tracer.MemoryTracer` API runs).
    #[command(hide = true)]
    Ingest(traces::IngestArgs),
    /// Measure tracing overhead: training steps traced and untraced, interleaved in one
    /// process; prints the medians as JSON.
    Overhead(trace::OverheadArgs),
    /// Convert a trace (snapshot pickle, profiler Chrome trace, DFTracer .pfw, Memory Tracer
    /// trace; gzip or not) to another format.
    Convert(traces::ConvertArgs),
    /// Leaks across iterations: steady growth of allocated memory from one iteration's end to
    /// the next after warm-up, and the allocations born after it that are never freed, by
    /// layer, operator and innermost frame.
    Leaks(traces::LeaksArgs),
    /// Compare two traces of any formats (B against A): peaks and when they happen, layers by
    /// change of peak, memory by tensor class, operators on one side only, and notes on what
    /// cannot be compared.
    Diff(traces::DiffArgs),
    /// What to change so the run needs less memory: checkpointing (which layers), AMP, a smaller
    /// batch, set_to_none gradients, the optimizer's state, expandable_segments; each with its
    /// predicted peak (a replay of the trace) and extra time per iteration.
    Advise(traces::AdviseArgs),
    /// Merge one trace per rank of a distributed job (snapshots, profiler traces, Memory Tracer
    /// traces; from one node or several) into one trace with a device per rank, clocks aligned.
    Merge(traces::MergeArgs),
    /// The graph profile of a trace: operator ranks, node statistics, activation liveness and
    /// the memory breakdown per rank, as CSV and JSON, with memory-vs-rank charts (PNG, SVG).
    Analyze(traces::AnalyzeArgs),
    /// Trace a model at several batch sizes: peak memory, iteration time and memory per rank
    /// for each, as CSV, JSON (the viewer overlays it) and charts. Out-of-memory batch sizes
    /// are reported and the sweep goes on.
    Sweep(Box<trace::SweepArgs>),
    /// A static report: the viewer and the trace in a folder any static host serves (open
    /// its index.html through the host), or with `--single-file` one HTML file to mail.
    Report(traces::ReportArgs),
    /// Serve the tracing API, the trace store and the viewer: open the printed URL.
    Serve(Box<serve::ServeArgs>),
    /// Import (or export) one file for `collector serve` under a memory limit and print the
    /// answer as one JSON line: what the server runs for each upload and export.
    #[command(hide = true)]
    ServeWorker(serve::ServeWorkerArgs),
    /// Print peak memory, fragmentation and the top layers of a trace.
    Summary(traces::SummaryArgs),
    /// Find allocations: by address (`0x7f3a…`, anywhere inside the block), stack frame or
    /// `file:line`, module path, or user metadata and annotation text.
    Find(traces::FindArgs),
}

/// How much a gzip'd input may inflate to (every command that reads a trace).
#[derive(clap::Args, Clone, Copy)]
pub struct ImportArgs {
    /// Largest decompressed size accepted from gzip input, in MiB.
    #[arg(long, default_value_t = 4096)]
    pub max_decompressed_mib: u64,
}

impl ImportArgs {
    pub fn options(self) -> shared::ImportOptions {
        let mut o = shared::ImportOptions::default();
        o.max_decompressed_bytes = self.max_decompressed_mib.saturating_mul(1 << 20);
        o
    }
}

impl Command {
    /// Whether this command runs a model in-process (libtorch): `collector-capture` runs it.
    pub fn runs_in_capture(&self) -> bool {
        match self {
            Command::Trace(a) => a.command.is_empty(),
            Command::Sweep(_) | Command::Overhead(_) => true,
            _ => false,
        }
    }
}

/// Runs one `collector` command.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    if cli.command.runs_in_capture() {
        return run_in_capture();
    }
    match cli.command {
        Command::Trace(a) => trace::python_trace_command(*a),
        Command::PythonPackage { out } => traces::python_package_command(&out),
        Command::Ingest(a) => traces::ingest_command(a),
        Command::Convert(a) => traces::convert_command(a),
        Command::Analyze(a) => traces::analyze_command(a),
        Command::Report(a) => traces::report_command(a),
        Command::Serve(a) => serve::serve_command(*a),
        Command::ServeWorker(a) => serve::serve_worker_command(a),
        Command::Leaks(a) => traces::leaks_command(a),
        Command::Diff(a) => traces::diff_command(a),
        Command::Advise(a) => traces::advise_command(a),
        Command::Merge(a) => traces::merge_command(a),
        Command::Summary(a) => traces::summary_command(a),
        Command::Find(a) => traces::find_command(a),
        Command::Sweep(_) | Command::Overhead(_) => unreachable!("runs_in_capture"),
    }
}

/// Replaces this process with `collector-capture` and the same arguments (its exit status,
/// output and signals are then the command's own).
fn run_in_capture() -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    let Some(capture) = crate::capture::binary() else {
        anyhow::bail!(
            "this command runs a model through libtorch, which `collector-capture` does, and there is none beside this collector (or in MEMORY_TRACER_CAPTURE); build it with `cargo build -p collector-capture`, or trace a Python program instead: `collector trace -- python train.py`"
        );
    };
    let err = std::process::Command::new(&capture).args(std::env::args_os().skip(1)).exec();
    Err(err).with_context(|| format!("cannot run {}", capture.display()))
}
