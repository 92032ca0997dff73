//! `collector trace`, `sweep` and `overhead`: their flags (a model's run is
//! [`protocol::ModelRun`], handed to `collector-capture` as a [`CaptureJob`]), and tracing
//! users' own programs (`collector trace -- COMMAND`), which needs no libtorch here.

use crate::pyrun::{self, CaptureMode, OpsMode, PyOptions};
use anyhow::Context;
use protocol::{CaptureJob, ChildLine, ModelRun};
use shared::export::ExportFormat;
use std::path::{Path, PathBuf};
use traceio::files::{parse_format, resolve_format, write_export};
use traceio::text::emit;
use traceio::text::print_summary;

/// `collector trace` options.
#[derive(clap::Args)]
pub struct TraceArgs {
    #[command(flatten)]
    pub run: ModelRun,
    /// Output file; written atomically. Default: <model>.mtrace.json.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// native, timeline, speedscope, chrome, csv or dftracer (.pfw.gz). Default: from the output file name.
    #[arg(long, value_parser = parse_format)]
    pub format: Option<ExportFormat>,
    /// How many layers the summary lists.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
    /// Report progress, live memory totals, the summary and errors as JSON lines on stdout
    /// (what `collector serve` reads from its trace processes).
    #[arg(long, hide = true)]
    pub progress_json: bool,
    /// Programs without an optimizer (inference loops): each call of this module (its path,
    /// e.g. `encoder`, or class name, e.g. `GPT2LMHeadModel`) is one iteration.
    #[arg(long, value_name = "MODULE")]
    pub iteration_marker: Option<String>,
    /// Records a traced program may hold before the collector drains them; past this, records
    /// are dropped and counted (the trace says how many).
    #[arg(long, default_value_t = 8_000_000)]
    pub buffer_records: u64,
    /// How often a traced program sends its records, in milliseconds.
    #[arg(long, default_value_t = 20, hide = true)]
    pub drain_interval_ms: u32,
    /// Python programs: which operators to record. `backward` (default): autograd nodes only,
    /// enough to give every allocation its module, phase and iteration at a fraction of the
    /// cost; `all`: every operator with its tensors (needed by `collector analyze`); `none`:
    /// allocations, module scopes and phases only. Built-in models record every operator
    /// unless --memory-only.
    #[arg(long, value_name = "MODE", value_enum)]
    pub ops: Option<OpsMode>,
    /// Python programs: no module scopes. Allocations keep their phase and iteration but not
    /// the module that made them; with `--ops none`, the cheapest capture.
    #[arg(long)]
    pub no_module_scopes: bool,
    /// Python programs: which capture runs. `auto` (default): the native capture when a capture
    /// library fits the program's torch (or can be built for it), else PyTorch's recorder;
    /// `native`: the native capture or the program does not run (exit 97); `recorder`: PyTorch's
    /// recorder (`torch.cuda.memory._record_memory_history`), which needs no compiled code but
    /// records CUDA memory only, no operators, and delivers the trace when the process ends.
    #[arg(long, value_name = "CAPTURE", value_enum, default_value_t = CaptureMode::Auto)]
    pub capture: CaptureMode,
    /// Also store each trace in a running `collector serve` at this URL (http://HOST:PORT) and
    /// print the viewer's link to it.
    #[arg(long, value_name = "URL")]
    pub serve: Option<String>,
    /// The server's token for --serve.
    #[arg(long, env = "MEMORY_TRACER_TOKEN", hide_env_values = true)]
    pub serve_token: Option<String>,
    /// The program to trace and its arguments, after `--` (python, torchrun, accelerate, ...).
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// `collector sweep` options.
#[derive(clap::Args)]
pub struct SweepArgs {
    #[command(flatten)]
    pub run: ModelRun,
    /// Batch sizes to run, in order.
    #[arg(long, value_delimiter = ',', num_args = 1.., default_value = "4,8,16,32,64")]
    pub batch_sizes: Vec<u64>,
    /// Output folder for the traces, CSV, JSON and charts (created if missing).
    #[arg(short, long, default_value = "sweep")]
    pub output: PathBuf,
}

impl TraceArgs {
    /// The job `collector-capture` runs for `trace --model`/`--torchscript`.
    pub fn capture_job(&self) -> CaptureJob {
        CaptureJob::Trace {
            run: self.run.clone(),
            output: self.output.clone(),
            format: self.format.map(|f| f.name().to_owned()),
            top: self.top,
            quiet: self.quiet,
            progress_json: self.progress_json,
        }
    }
}

/// What to name a command's trace: its script (`train.py` → `train`, also under torchrun), else
/// its `-m` module (`memory_tracer.zoo` → `memory_tracer_zoo`), else its program.
fn program_stem(command: &[String]) -> String {
    let stem = |s: &str| std::path::Path::new(s).file_stem().map_or_else(|| s.to_owned(), |f| f.to_string_lossy().into_owned());
    if let Some(script) = command.iter().skip(1).find(|s| s.ends_with(".py")) {
        return stem(script);
    }
    let launchers = ["torch.distributed.run", "torch.distributed.launch"];
    let module = command.windows(2).filter(|w| w[0] == "-m" && !launchers.contains(&w[1].as_str())).map(|w| w[1].replace('.', "_")).next();
    module.unwrap_or_else(|| command.first().map_or_else(|| "program".into(), |p| stem(p)))
}

/// `run.mtrace.json` → (`run`, `mtrace.json`); `run.json` → (`run`, `json`): where a rank's tag
/// goes in a file name.
fn split_extension(name: &str) -> (&str, &str) {
    if let Some(stem) = name.strip_suffix(".mtrace.json.gz") {
        return (stem, "mtrace.json.gz");
    }
    if let Some((_, suffix)) = ExportFormat::from_file_name(name) {
        let stem = &name[..name.len() - suffix.len()];
        return (stem, &name[stem.len() + 1..]);
    }
    name.rsplit_once('.').unwrap_or((name, "mtrace.json"))
}

/// `collector trace -- COMMAND`: runs the program with the capture injected, writes one trace
/// per traced process (the ranks of a torchrun job also merged into one), and exits with the
/// program's exit code.
pub fn python_trace_command(a: TraceArgs) -> anyhow::Result<()> {
    let opts = py_options(&a)?;
    let output = output_path(&a)?;
    let format = resolve_format(a.format, &output)?;
    if a.progress_json {
        emit(&ChildLine::Started { iterations: 0 });
    }
    let started = std::time::Instant::now();
    let mut live = a.serve.as_deref().and_then(|server| start_live(server, a.serve_token.as_deref(), &output));
    let outcome = pyrun::run(&a.command, &opts, &mut |rank, points| {
        if a.progress_json {
            emit(&ChildLine::Memory { points: points.to_vec(), rank });
        }
        if let Some(c) = &live {
            c.send(rank, points);
        }
    })?;
    let code = outcome.exit_code();
    let interrupted = outcome.interrupted;
    let mut written = write_processes(outcome, &opts, format, &output)?;
    if !written.ranks.is_empty() {
        merge_ranks(&mut written, format, &output)?;
    }
    for line in &written.captures {
        eprintln!("collector: {line}");
    }
    for (trace, program, out) in &written.finals {
        if a.progress_json {
            emit(&ChildLine::Done { info: protocol::trace_info(trace, program, started.elapsed().as_secs_f64() * 1e3) });
        } else if !a.quiet {
            print_summary(trace, a.top, false, std::io::stderr().lock()).context("cannot print the summary")?;
        }
        if let Some(server) = &a.serve {
            store_in_server(server, a.serve_token.as_deref(), live.take(), out);
        }
    }
    for n in &written.notes {
        eprintln!("collector: {n}");
    }
    if written.count == 0 {
        nothing_traced(&a, &written.notes, live.take(), code);
    }
    if interrupted {
        eprintln!("collector: interrupted; the trace holds what ran until then");
    }
    std::process::exit(code);
}

/// The capture's options from the flags.
fn py_options(a: &TraceArgs) -> anyhow::Result<PyOptions> {
    Ok(PyOptions {
        max_events: a.run.max_events,
        capture_tensors: !a.run.no_tensors,
        ops: if a.run.memory_only { OpsMode::None } else { a.ops.unwrap_or(OpsMode::Backward) },
        module_scopes: !a.no_module_scopes,
        iteration_marker: a.iteration_marker.clone(),
        buffer_records: a.buffer_records,
        drain_interval_ms: a.drain_interval_ms.max(1),
        fragmentation: !a.run.no_fragmentation,
        device: a.run.device.as_deref().map(str::parse).transpose().map_err(anyhow::Error::msg)?,
        capture: a.capture,
        ..PyOptions::default()
    })
}

/// `-o FILE`; `-o run/` (or an existing folder): the traces go in it, named after the program;
/// no `-o`: named after the program in the current folder.
fn output_path(a: &TraceArgs) -> anyhow::Result<PathBuf> {
    let default_name = || PathBuf::from(format!("{}.mtrace.json", program_stem(&a.command)));
    Ok(match a.output.clone() {
        Some(o) if o.is_dir() || o.as_os_str().to_string_lossy().ends_with('/') => {
            std::fs::create_dir_all(&o).with_context(|| format!("cannot create the folder {}", o.display()))?;
            o.join(default_name())
        }
        Some(o) => o,
        None => default_name(),
    })
}

/// `--serve URL`: a live trace in the server, followed in its viewer while the program runs.
fn start_live(server: &str, token: Option<&str>, output: &Path) -> Option<pyrun::LiveClient> {
    let what = output.file_stem().map_or_else(|| "program".into(), |s| s.to_string_lossy().trim_end_matches(".mtrace").to_owned());
    match pyrun::LiveClient::start(server, token, &what) {
        Ok(c) => {
            eprintln!("collector: follow it live at {}", c.viewer_link());
            Some(c)
        }
        Err(e) => {
            eprintln!("collector: {e:#}; tracing without the server");
            None
        }
    }
}

/// What the traced processes left: the traces to report, each rank's trace to merge, and why
/// some could not be built.
#[derive(Default)]
struct Written {
    /// Files written, one per traced process.
    count: usize,
    /// (trace, program, file) to report and store: the one process's trace, or the merged ranks.
    finals: Vec<(shared::Trace, String, PathBuf)>,
    /// The ranks of a torchrun job (or the processes of a program that started several).
    ranks: Vec<shared::merge::MergeInput>,
    /// World size, when a process said it was a rank of one.
    world: Option<u32>,
    /// Ranks without a trace, and why.
    missing: std::collections::BTreeMap<u32, String>,
    notes: Vec<String>,
    /// Which capture ran, one line per kind (`capture: native (torch 2.11)`, with the count of
    /// processes when several ran it).
    captures: Vec<String>,
}

/// Builds and writes each traced process's trace (`FILE.rankN.ext` or `FILE.pidN.ext` when
/// there are several).
fn write_processes(outcome: pyrun::Outcome, opts: &PyOptions, format: ExportFormat, output: &Path) -> anyhow::Result<Written> {
    let mut w = Written { notes: outcome.processes.iter().flat_map(pyrun::notes_text).collect(), ..Written::default() };
    for p in outcome.processes.iter().filter(|p| pyrun::recorder::is_recorder(p)) {
        let who = format!("process {} ({})", p.pid().unwrap_or(0), pyrun::program_name(p));
        w.notes.extend(pyrun::recorder::stderr_notes(p).into_iter().skip(1).map(|n| format!("{who}: {n}")));
    }
    // A recorder process that recorded nothing gets a trace (saying why) only when it is the
    // command's one process: torchrun's launcher imports torch but never uses CUDA.
    let lone = outcome.processes.iter().filter(|p| p.hello.is_some()).count() == 1;
    let keep = |p: &pyrun::wire::ProcessStream| {
        pyrun::has_capture(p) && (lone || !pyrun::recorder::is_recorder(p) || !pyrun::recorder::recorded_nothing(p))
    };
    let mut traced: Vec<_> = outcome.processes.into_iter().filter(keep).collect();
    traced.sort_by_key(|p| (pyrun::rank(p).unwrap_or(u64::MAX), p.pid().unwrap_or(0)));
    w.captures = capture_lines(&traced);
    // Ranks of a torchrun job are merged even when only one could be traced, so that the
    // merged trace names the missing ones.
    w.world = traced.iter().find_map(pyrun::world_size);
    let many = traced.len() > 1 || w.world.is_some();
    for (k, p) in traced.into_iter().enumerate() {
        let rank = pyrun::rank(&p);
        let pid = p.pid().unwrap_or(0);
        let out = if many {
            let name = output.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
            let tag = rank.map_or_else(|| format!("pid{pid}"), |r| format!("rank{r}"));
            let (stem, ext) = split_extension(&name);
            output.with_file_name(format!("{stem}.{tag}.{ext}"))
        } else {
            output.to_owned()
        };
        let program = pyrun::program_name(&p);
        let rank = rank.and_then(|r| u32::try_from(r).ok()).unwrap_or(k as u32);
        let trace = match pyrun::build_trace(p, opts) {
            Ok(t) => t,
            Err(e) => {
                w.notes.push(format!("process {pid}: {e}"));
                w.missing.insert(rank, format!("its trace could not be built: {e}"));
                continue;
            }
        };
        let bytes = write_export(&trace, format, &out)?;
        let size = shared::units::format_bytes(bytes);
        eprintln!("collector: wrote {size} ({}, {} events) to {}", format.name(), trace.events.len(), out.display());
        w.count += 1;
        if many {
            w.ranks.push(shared::merge::MergeInput { trace, rank, label: out.display().to_string() });
        } else {
            w.finals.push((trace, program, out));
        }
    }
    Ok(w)
}

/// One line per capture that ran (`capture: native (torch 2.11)`), with how many processes ran
/// it when more than one did.
fn capture_lines(traced: &[pyrun::wire::ProcessStream]) -> Vec<String> {
    let mut lines: Vec<(String, usize)> = Vec::new();
    for p in traced {
        let line = pyrun::capture_line(p);
        match lines.iter_mut().find(|(l, _)| *l == line) {
            Some((_, n)) => *n += 1,
            None => lines.push((line, 1)),
        }
    }
    lines.into_iter().map(|(l, n)| if n > 1 { format!("{l} ({n} processes)") } else { l }).collect()
}

/// Merges the ranks' traces into `output`, naming the ranks that streamed nothing.
fn merge_ranks(w: &mut Written, format: ExportFormat, output: &Path) -> anyhow::Result<()> {
    let program = w.ranks[0].trace.meta.model.clone().unwrap_or_else(|| "program".into());
    for r in 0..w.world.unwrap_or(0) {
        if !w.ranks.iter().any(|i| i.rank == r) {
            w.missing
                .entry(r)
                .or_insert_with(|| "its process streamed no trace (it did not start, did not import torch, or died before)".into());
        }
    }
    let merge_opts = shared::merge::MergeOptions { missing_reasons: std::mem::take(&mut w.missing), ..Default::default() };
    match shared::merge::merge_with(std::mem::take(&mut w.ranks), &merge_opts) {
        Ok(merged) => {
            let bytes = write_export(&merged, format, output)?;
            eprintln!(
                "collector: wrote {} ({}, {} ranks merged, {} events) to {}",
                shared::units::format_bytes(bytes),
                format.name(),
                shared::merge::ranks(&merged).len(),
                merged.events.len(),
                output.display()
            );
            for r in &merged.meta.missing_ranks {
                let why = merge_opts.missing_reasons.get(r).map_or("no trace of it", String::as_str);
                w.notes.push(format!("rank {r} is missing from the merged trace: {why}"));
            }
            w.finals.push((merged, program, output.to_owned()));
        }
        Err(e) => w.notes.push(format!("the ranks' traces could not be merged: {e}")),
    }
    Ok(())
}

/// `--serve`: uploads the trace (ending the live trace, when there is one) and prints its link.
fn store_in_server(server: &str, token: Option<&str>, live: Option<pyrun::LiveClient>, out: &Path) {
    let stored = match live {
        Some(c) => c.finish(Some(out), ""),
        None => pyrun::upload(server, token, out, None).map(|(_, link)| link),
    };
    match stored {
        Ok(link) => eprintln!("collector: stored in {server}; open {link}"),
        Err(e) => eprintln!("collector: {e:#} (the trace is still in {})", out.display()),
    }
}

/// No process was traced: says why (to the server too) and exits non-zero.
fn nothing_traced(a: &TraceArgs, notes: &[String], live: Option<pyrun::LiveClient>, code: i32) -> ! {
    let why = "no process of the command imported torch with the capture (is it a Python program using torch? `python -I`/`-E` ignore PYTHONPATH)";
    if a.progress_json {
        emit(&ChildLine::Error { class: protocol::FailureClass::Invalid, detail: notes.first().cloned().unwrap_or_else(|| why.into()) });
    }
    eprintln!("collector: nothing was traced: {why}");
    if let Some(c) = live {
        let _ = c.finish(None, &format!("nothing was traced: {why}"));
    }
    std::process::exit(if code == 0 { 1 } else { code });
}

#[cfg(test)]
mod tests {
    use super::{program_stem, split_extension};

    #[test]
    fn rank_tags_go_before_the_formats_ending() {
        assert_eq!(split_extension("run.mtrace.json"), ("run", "mtrace.json"));
        assert_eq!(split_extension("run.pfw.gz"), ("run", "pfw.gz"));
        assert_eq!(split_extension("Run.Speedscope.JSON"), ("Run", "Speedscope.JSON"));
        assert_eq!(split_extension("run.mtrace.json.gz"), ("run", "mtrace.json.gz"));
        assert_eq!(split_extension("run.json"), ("run", "json"));
        assert_eq!(split_extension("run"), ("run", "mtrace.json"));
    }

    #[test]
    fn traces_are_named_after_the_script_or_module() {
        let cmd = |s: &str| s.split(' ').map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(program_stem(&cmd("python train.py --lr 1")), "train");
        assert_eq!(program_stem(&cmd("python -m torch.distributed.run --nproc-per-node 2 -m memory_tracer.zoo")), "memory_tracer_zoo");
        assert_eq!(program_stem(&cmd("/usr/bin/python3")), "python3");
    }
}
