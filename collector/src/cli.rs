//! The `collector` command line: [`Cli`] and its [`Command`]s, each run by its module in
//! [`crate::commands`]. `collector` itself never loads libtorch: the commands
//! that run models in-process (`trace --model`/`--torchscript`, `sweep`, `overhead`) are
//! handed to the `collector-capture` binary beside it as a typed [`protocol::CaptureJob`]
//! ([`run_in_capture`]).

use crate::commands::{
    advise, analyze, check, convert, diff, find, ingest, leaks, ledger, mcp, merge, python_package, report, serve, serve_worker, summary,
    trace, whatif, why,
};
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
    Ingest(ingest::IngestArgs),
    /// Measure tracing overhead: training steps traced and untraced, interleaved in one
    /// process; prints the medians as JSON.
    Overhead(protocol::OverheadRun),
    /// Convert a trace (snapshot pickle, profiler Chrome trace, DFTracer .pfw, Memory Tracer
    /// trace; gzip or not) to another format.
    Convert(convert::ConvertArgs),
    /// Leaks across iterations: steady growth of allocated memory from one iteration's end to
    /// the next after warm-up, and the allocations born after it that are never freed, by
    /// layer, operator and innermost frame.
    Leaks(leaks::LeaksArgs),
    /// Compare two traces of any formats (B against A): peaks and when they happen, layers by
    /// change of peak, memory by tensor class, operators on one side only, and notes on what
    /// cannot be compared.
    Diff(diff::DiffArgs),
    /// What to change so the run needs less memory: checkpointing (which layers), AMP, a smaller
    /// batch, set_to_none gradients, the optimizer's state, expandable_segments; each judged by
    /// what runs out (its predicted reserved peak, a replay of the trace; the allocated peak
    /// beside it) with its extra time per iteration, and those that save nothing here apart.
    Advise(advise::AdviseArgs),
    /// What another allocator setting would do: the trace replayed through PyTorch's caching
    /// allocator under each `--alloc-conf` (PYTORCH_CUDA_ALLOC_CONF), with the peaks, the
    /// cache's share, the segments and the first out-of-memory at the device's memory;
    /// `--verify -- python train.py` runs it under each setting to check.
    #[command(name = "whatif")]
    WhatIf(whatif::WhatIfArgs),
    /// Merge one trace per rank of a distributed job (snapshots, profiler traces, Memory Tracer
    /// traces; from one node or several) into one trace with a device per rank, clocks aligned.
    Merge(merge::MergeArgs),
    /// The graph profile of a trace: operator ranks, node statistics, activation liveness and
    /// the memory breakdown per rank, as CSV and JSON, with memory-vs-rank charts (PNG, SVG).
    Analyze(analyze::AnalyzeArgs),
    /// Trace a model at several batch sizes: peak memory, iteration time and memory per rank
    /// for each, as CSV, JSON (the viewer overlays it) and charts. Out-of-memory batch sizes
    /// are reported and the sweep goes on.
    Sweep(Box<trace::SweepArgs>),
    /// A static report: the viewer and the trace in a folder any static host serves (open
    /// its index.html through the host), or with `--single-file` one HTML file to mail.
    Report(report::ReportArgs),
    /// Serve the tracing API, the trace store and the viewer: open the printed URL.
    Serve(Box<serve::ServeArgs>),
    /// Import (or export) one file for `collector serve` under a memory limit and print the
    /// answer as one JSON line: what the server runs for each upload and export.
    #[command(hide = true)]
    ServeWorker(serve_worker::ServeWorkerArgs),
    /// Print peak memory, fragmentation and the top layers of a trace.
    Summary(summary::SummaryArgs),
    /// Hold a trace to memory budgets for CI: exits 0 when every one holds, 1 when one does
    /// not (`--max-peak 6GiB`, `--max-reserved`, `--no-leak`, `--baseline OLD --max-growth 5%`).
    Check(check::CheckArgs),
    /// An MCP server for AI assistants on stdin/stdout: tools that answer questions about
    /// traces (summary, top allocations at the peak, layers, leaks, OOM, diff, advice, find,
    /// what-if, why, ledger).
    Mcp(mcp::McpArgs),
    /// Who holds the live bytes at the peak, the out-of-memory, a mark or any time: parameters,
    /// gradients, optimizer state, tensors saved for backward (by operator and module), buffers,
    /// Python variables, pending frees and the allocator's cache, each with when it is released.
    Why(why::WhyArgs),
    /// The process's device memory by source at a moment (a trace recorded with `collector
    /// trace --ledger`): PyTorch's reserved bytes, NCCL, cuBLAS, cuDNN, Triton, raw cudaMalloc,
    /// other processes, and what NVML counts beyond them.
    Ledger(ledger::LedgerArgs),
    /// Find allocations: by address (`0x7f3a…`, anywhere inside the block), stack frame or
    /// `file:line`, module path, or user metadata and annotation text.
    Find(find::FindArgs),
}

impl Command {
    /// The job `collector-capture` runs for this command, when it runs a model in-process
    /// (libtorch).
    pub fn capture_job(&self) -> Option<protocol::CaptureJob> {
        use protocol::CaptureJob;
        match self {
            Command::Trace(a) if a.command.is_empty() => Some(a.capture_job()),
            Command::Sweep(a) => {
                Some(CaptureJob::Sweep { run: a.run.clone(), batch_sizes: a.batch_sizes.clone(), output: a.output.clone() })
            }
            Command::Overhead(a) => Some(CaptureJob::Overhead(a.clone())),
            _ => None,
        }
    }
}

/// Runs one `collector` command.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    if let Some(job) = cli.command.capture_job() {
        return run_in_capture(&job);
    }
    match cli.command {
        Command::Trace(a) => trace::python_trace_command(*a),
        Command::PythonPackage { out } => python_package::python_package_command(&out),
        Command::Ingest(a) => ingest::ingest_command(a),
        Command::Convert(a) => convert::convert_command(a),
        Command::Analyze(a) => analyze::analyze_command(a),
        Command::Report(a) => report::report_command(a),
        Command::Serve(a) => serve::serve_command(*a),
        Command::ServeWorker(a) => serve_worker::serve_worker_command(a),
        Command::Leaks(a) => leaks::leaks_command(a),
        Command::Why(a) => why::why_command(a),
        Command::Ledger(a) => ledger::ledger_command(a),
        Command::Diff(a) => diff::diff_command(a),
        Command::Advise(a) => advise::advise_command(a),
        Command::WhatIf(a) => whatif::whatif_command(a),
        Command::Merge(a) => merge::merge_command(a),
        Command::Summary(a) => summary::summary_command(a),
        Command::Find(a) => find::find_command(a),
        Command::Mcp(a) => mcp::mcp_command(a),
        // 0: every budget holds; 1: one does not; 2: it could not be checked.
        Command::Check(a) => match check::check_command(a) {
            Ok(true) => Ok(()),
            Ok(false) => std::process::exit(1),
            Err(e) => {
                eprintln!("error: {e:#}");
                std::process::exit(2)
            }
        },
        Command::Sweep(_) | Command::Overhead(_) => unreachable!("capture_job"),
    }
}

/// Replaces this process with `collector-capture --job JOB` (its exit status, output and
/// signals are then the command's own).
fn run_in_capture(job: &protocol::CaptureJob) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    let Some(capture) = crate::capture_binary::binary() else {
        anyhow::bail!(
            "this command runs a model through libtorch, which `collector-capture` does, and there is none beside this collector (or in MEMORY_TRACER_CAPTURE); build it with `cargo build -p capture`, or trace a Python program instead: `collector trace -- python train.py`"
        );
    };
    let job = serde_json::to_string(job).context("cannot write the capture's job")?;
    let err = std::process::Command::new(&capture).arg("--job").arg(job).exec();
    Err(err).with_context(|| format!("cannot run {}", capture.display()))
}
