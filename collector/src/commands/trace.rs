//! `collector trace`, `sweep` and `overhead`: their flags (a model's run is
//! [`protocol::ModelRun`], handed to `collector-capture` as a [`CaptureJob`]), and tracing
//! users' own programs (`collector trace -- COMMAND`), which needs no libtorch here.

use crate::pyrun::{self, CaptureMode, NodeIdentity, OpsMode, PyOptions};
use anyhow::Context;
use protocol::{CaptureJob, ChildLine, ModelRun};
use shared::export::ExportFormat;
use shared::ranks::merge::{absent_ranks, merge_with, InputRank, MergeInput, MergeOptions};
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
    /// Python programs: record who holds each tensor's memory (parameters, buffers, gradients,
    /// optimizer state, tensors saved for backward), for `collector why`; `--holders=python`
    /// also names the Python variables and attributes that hold tensors at each mark, backward
    /// and optimizer step.
    #[arg(long, value_name = "WHAT", num_args = 0..=1, require_equals = true, default_missing_value = "on", value_parser = ["on", "python"])]
    pub holders: Option<String>,
    /// Python programs on CUDA: the device ledger, every byte the driver hands the process by
    /// the library that asked (PyTorch's segments, NCCL, cuBLAS, cuDNN, Triton, raw
    /// cudaMalloc), beside NVML's figure for the process (`collector ledger`). It holds CUPTI:
    /// a torch.profiler run in the same process gets no CUDA activity.
    #[arg(long)]
    pub ledger: bool,
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
    /// With --serve: the job this run is one node of. Every node naming it streams into one
    /// live trace, stored as the merge of all nodes' ranks once each node's part came. Under
    /// torchrun with --nnodes over 1 it is derived from the rendezvous (--rdzv-id, else
    /// --rdzv-endpoint or --master-addr and --master-port), alike on every node.
    #[arg(long, value_name = "NAME")]
    pub job: Option<String>,
    /// With --serve: how many nodes run the job. Default: torchrun's --nnodes (its largest
    /// for a range), else 1.
    #[arg(long, value_name = "N")]
    pub nnodes: Option<u32>,
    /// With --serve: this node's rank in the job. Default: torchrun's --node-rank, else 0.
    #[arg(long, value_name = "K")]
    pub node_rank: Option<u32>,
    /// With --serve and a job of several nodes: how long the server waits for the other
    /// nodes' parts once the first came (seconds); then it stores what it has, naming the
    /// absent nodes' ranks as missing.
    #[arg(long, value_name = "S", default_value_t = 300)]
    pub node_wait_s: u64,
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
    let module = command.windows(2).filter(|w| w[0] == "-m" && !LAUNCHERS.contains(&w[1].as_str())).map(|w| w[1].replace('.', "_")).next();
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
    let node = node_identity(&a.command, a.job.as_deref(), a.nnodes, a.node_rank).map_err(anyhow::Error::msg)?;
    let mut live = a.serve.as_deref().and_then(|server| start_live(&a, server, node.as_ref(), &output));
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
    if let Some(n) = &node {
        written.other_nodes = other_nodes_ranks(n, written.local_world);
    }
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
    if let Some(c) = live.take_if(|_| written.count > 0) {
        // Traces were written but none could be stored (the ranks' merge failed): the server
        // hears why instead of waiting for this node.
        let why = written.notes.last().cloned().unwrap_or_else(|| "no trace could be built".into());
        let _ = c.finish(None, &format!("nothing to store: {why}"));
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
        holders: match a.holders.as_deref() {
            None => 0,
            Some("python") => 2,
            Some(_) => 1,
        },
        ledger: a.ledger,
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

/// `--serve URL`: a live trace in the server, followed in its viewer while the program runs
/// (for a node of a job of several, the job's one live trace, joined).
fn start_live(a: &TraceArgs, server: &str, node: Option<&NodeIdentity>, output: &Path) -> Option<pyrun::LiveClient> {
    let what = output.file_stem().map_or_else(|| "program".into(), |s| s.to_string_lossy().trim_end_matches(".mtrace").to_owned());
    match pyrun::LiveClient::start(server, a.serve_token.as_deref(), &what, node, Some(a.node_wait_s)) {
        Ok(c) => {
            match node {
                Some(n) => eprintln!(
                    "collector: node {} of {} of job {}: follow every node's ranks live at {}",
                    n.node_rank,
                    n.nnodes,
                    n.job,
                    c.viewer_link()
                ),
                None => eprintln!("collector: follow it live at {}", c.viewer_link()),
            }
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
    ranks: Vec<MergeInput>,
    /// World size, when a process said it was a rank of one.
    world: Option<u32>,
    /// Ranks without a trace, and why.
    missing: std::collections::BTreeMap<u32, String>,
    /// Processes per node (`LOCAL_WORLD_SIZE`), when a process said it.
    local_world: Option<u32>,
    /// In a job of several nodes: the ranks that run on the other nodes (not missing here:
    /// the server merges every node's part), and why they are absent from this node's trace.
    other_nodes: Option<(std::ops::Range<u32>, String)>,
    notes: Vec<String>,
    /// Which capture ran, one line per kind (`capture: native (torch 2.11)`, with the count of
    /// processes when several ran it).
    captures: Vec<String>,
}

/// Builds and writes each traced process's trace (`FILE.rankN.ext` or `FILE.pidN.ext` when
/// there are several).
fn write_processes(outcome: pyrun::Outcome, opts: &PyOptions, format: ExportFormat, output: &Path) -> anyhow::Result<Written> {
    let mut w = Written { notes: outcome.processes.iter().flat_map(pyrun::notes_text).collect(), ..Written::default() };
    for p in outcome.processes.iter().filter(|p| pyrun::history::is_recorder(p)) {
        let who = format!("process {} ({})", p.pid().unwrap_or(0), pyrun::program_name(p));
        w.notes.extend(pyrun::history::stderr_notes(p).into_iter().skip(1).map(|n| format!("{who}: {n}")));
    }
    // A recorder process that recorded nothing gets a trace (saying why) only when it is the
    // command's one process: torchrun's launcher imports torch but never uses CUDA.
    let lone = outcome.processes.iter().filter(|p| p.hello.is_some()).count() == 1;
    let keep = |p: &pyrun::wire::ProcessStream| {
        pyrun::has_capture(p) && (lone || !pyrun::history::is_recorder(p) || !pyrun::history::recorded_nothing(p))
    };
    let mut traced: Vec<_> = outcome.processes.into_iter().filter(keep).collect();
    traced.sort_by_key(|p| (pyrun::rank(p).unwrap_or(u64::MAX), p.pid().unwrap_or(0)));
    w.captures = capture_lines(&traced);
    // Ranks of a torchrun job are merged even when only one could be traced, so that the
    // merged trace names the missing ones.
    w.world = traced.iter().find_map(pyrun::world_size);
    w.local_world = traced.iter().find_map(|p| p.hello.as_ref()?.env.get("LOCAL_WORLD_SIZE")?.parse().ok());
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
            w.ranks.extend(MergeInput::of(trace, &out.display().to_string(), InputRank::Given(rank))?);
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
    let absent = absent_ranks(&w.ranks, w.world.unwrap_or(0), |r| {
        let elsewhere = w.other_nodes.as_ref().filter(|(here, _)| !here.contains(&r)).map(|(_, why)| why.clone());
        elsewhere.unwrap_or_else(|| "its process streamed no trace (it did not start, did not import torch, or died before)".into())
    });
    for (r, why) in absent {
        w.missing.entry(r).or_insert(why);
    }
    let merge_opts = MergeOptions { missing_reasons: std::mem::take(&mut w.missing), ..Default::default() };
    match merge_with(std::mem::take(&mut w.ranks), &merge_opts) {
        Ok(merged) => {
            let bytes = write_export(&merged, format, output)?;
            eprintln!(
                "collector: wrote {} ({}, {} ranks merged, {} events) to {}",
                shared::units::format_bytes(bytes),
                format.name(),
                shared::ranks::ranks(&merged).len(),
                merged.events.len(),
                output.display()
            );
            let here = w.other_nodes.as_ref().map(|(here, _)| here.clone());
            for r in merged.meta.missing_ranks.iter().filter(|r| here.as_ref().is_none_or(|h| h.contains(r))) {
                let why = merge_opts.missing_reasons.get(r).map_or("no trace of it", String::as_str);
                w.notes.push(format!("rank {r} is missing from the merged trace: {why}"));
            }
            w.finals.push((merged, program, output.to_owned()));
        }
        Err(e) => w.notes.push(format!("the ranks' traces could not be merged: {e}")),
    }
    Ok(())
}

/// `--serve`: uploads the trace (ending the live trace, or this node's part of it, when there
/// is one) and prints its link.
fn store_in_server(server: &str, token: Option<&str>, live: Option<pyrun::LiveClient>, out: &Path) {
    let stored = match live {
        Some(c) => c.finish(Some(out), ""),
        None => pyrun::upload(server, token, out, None).map(|(id, link)| pyrun::Uploaded { id, link, waiting_for: Vec::new(), wait_s: 0 }),
    };
    match stored {
        Ok(u) if u.waiting_for.is_empty() => eprintln!("collector: stored in {server}; open {}", u.link),
        Ok(u) => eprintln!(
            "collector: this node's part is in {server}; the trace is stored once node(s) {} send theirs (or in {} s without them); follow it at {}",
            u.waiting_for.iter().map(u32::to_string).collect::<Vec<_>>().join(", "),
            u.wait_s,
            u.link
        ),
        Err(e) => eprintln!("collector: {e:#} (the trace is still in {})", out.display()),
    }
}

/// The ranks that run on this node, given its processes per node, and why the others are
/// absent from its own trace; `None` when the processes did not say how many run per node.
fn other_nodes_ranks(node: &NodeIdentity, local_world: Option<u32>) -> Option<(std::ops::Range<u32>, String)> {
    let per_node = local_world.filter(|&l| l > 0)?;
    let first = node.node_rank.checked_mul(per_node)?;
    let why = format!("it runs on another node of job {} (the server merges the nodes' parts)", node.job);
    Some((first..first.saturating_add(per_node), why))
}

/// torchrun's launchers when run as modules (`python -m torch.distributed.run`).
const LAUNCHERS: [&str; 2] = ["torch.distributed.run", "torch.distributed.launch"];

/// The launcher's options of a torchrun command (`torchrun ...` or `python -m
/// torch.distributed.run ...`): its arguments up to the script it runs (the first `.py`),
/// so the program's own arguments are not read; `None` when the command is no torchrun.
fn torchrun_options(command: &[String]) -> Option<&[String]> {
    let program = Path::new(command.first()?).file_name()?.to_string_lossy();
    let start =
        if program == "torchrun" { 1 } else { command.windows(2).position(|w| w[0] == "-m" && LAUNCHERS.contains(&w[1].as_str()))? + 2 };
    let rest = &command[start..];
    let end = rest.iter().position(|a| a.ends_with(".py")).unwrap_or(rest.len());
    Some(&rest[..end])
}

/// The value of a launcher option, spelled `--name value` or `--name=value`, with dashes or
/// underscores (`name` with dashes); the last one given wins, as in torchrun.
fn launcher_option<'a>(options: &'a [String], name: &str) -> Option<&'a str> {
    let mut found = None;
    let mut it = options.iter();
    while let Some(arg) = it.next() {
        let Some(flag) = arg.strip_prefix("--") else { continue };
        let (key, inline) = match flag.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (flag, None),
        };
        if key.replace('_', "-") == name {
            found = inline.or_else(|| it.next().map(String::as_str));
        }
    }
    found
}

/// Which node of which job this run is: `--job` (with `--nnodes`/`--node-rank`, else
/// torchrun's), or, for a torchrun command of several nodes (`--nnodes N` with N over 1, or a
/// range `MIN:MAX` whose largest is), a name every node derives alike: `torchrun:` and its
/// `--rdzv-id` (unless `none`), else its `--rdzv-endpoint`, else `--master-addr:--master-port`
/// (torchrun's defaults 127.0.0.1 and 29500). `None`: a run of one node with no job.
pub fn node_identity(
    command: &[String],
    job: Option<&str>,
    nnodes: Option<u32>,
    node_rank: Option<u32>,
) -> Result<Option<NodeIdentity>, String> {
    let torchrun = torchrun_options(command);
    let options = torchrun.unwrap_or(&[]);
    let nnodes = match (nnodes, launcher_option(options, "nnodes")) {
        (Some(n), _) => n,
        (None, Some(v)) => {
            let largest = v.rsplit(':').next().unwrap_or(v);
            largest.trim().parse().map_err(|_| format!("torchrun's --nnodes {v}: expected a count (2) or a range (1:4)"))?
        }
        (None, None) => 1,
    };
    let node_rank = match (node_rank, launcher_option(options, "node-rank")) {
        (Some(k), _) => k,
        (None, Some(v)) => v.trim().parse().map_err(|_| format!("torchrun's --node-rank {v}: expected a number (0, 1, ...)"))?,
        (None, None) => 0,
    };
    let derived = || {
        if let Some(id) = launcher_option(options, "rdzv-id").filter(|id| !id.is_empty() && *id != "none") {
            return format!("torchrun:{id}");
        }
        if let Some(endpoint) = launcher_option(options, "rdzv-endpoint").filter(|e| !e.is_empty()) {
            return format!("torchrun:{endpoint}");
        }
        let addr = launcher_option(options, "master-addr").unwrap_or("127.0.0.1");
        let port = launcher_option(options, "master-port").unwrap_or("29500");
        format!("torchrun:{addr}:{port}")
    };
    let job = match job {
        Some(j) => j.to_owned(),
        None if nnodes > 1 && torchrun.is_some() => derived(),
        None if nnodes > 1 => {
            return Err(format!("--nnodes {nnodes} needs --job NAME (the same on every node) unless the command is torchrun"))
        }
        None => return Ok(None),
    };
    if nnodes == 0 || node_rank >= nnodes {
        return Err(format!("node rank {node_rank} of {nnodes} nodes: expected a node rank from 0 to {}", nnodes.max(1) - 1));
    }
    Ok(Some(NodeIdentity { job, nnodes, node_rank }))
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
    use super::{node_identity, program_stem, split_extension, NodeIdentity};

    fn cmd(s: &str) -> Vec<String> {
        s.split(' ').map(str::to_owned).collect()
    }

    fn node(job: &str, nnodes: u32, node_rank: u32) -> Option<NodeIdentity> {
        Some(NodeIdentity { job: job.into(), nnodes, node_rank })
    }

    #[test]
    fn torchrun_of_several_nodes_names_its_job_alike_on_every_node() {
        let id = |s: &str| node_identity(&cmd(s), None, None, None);
        assert_eq!(
            id("torchrun --nnodes 2 --node-rank 1 --nproc-per-node 2 --master-addr 10.0.0.1 --master-port 29400 train.py"),
            Ok(node("torchrun:10.0.0.1:29400", 2, 1))
        );
        assert_eq!(
            id("python -m torch.distributed.run --nnodes=2 --node_rank=0 --master_addr=10.0.0.1 --master_port=29400 train.py --nnodes 9"),
            Ok(node("torchrun:10.0.0.1:29400", 2, 0)),
            "underscores, `=`, and the program's own arguments are not the launcher's"
        );
        assert_eq!(id("/usr/bin/torchrun --nnodes 1:4 --rdzv-id job7 --rdzv-endpoint h:1 train.py"), Ok(node("torchrun:job7", 4, 0)));
        assert_eq!(id("torchrun --nnodes 2 --rdzv_id none --rdzv_endpoint h:29400 --node-rank 1 t.py"), Ok(node("torchrun:h:29400", 2, 1)));
        assert_eq!(id("torchrun --nnodes 2 --node-rank 1 t.py"), Ok(node("torchrun:127.0.0.1:29500", 2, 1)), "torchrun's defaults");
        assert_eq!(id("python -m torch.distributed.launch --nnodes 3 --node-rank 2 -m mod"), Ok(node("torchrun:127.0.0.1:29500", 3, 2)));
    }

    #[test]
    fn one_node_has_no_job_unless_named() {
        let id = |s: &str, job: Option<&str>| node_identity(&cmd(s), job, None, None);
        assert_eq!(id("torchrun --standalone --nproc-per-node 2 train.py", None), Ok(None));
        assert_eq!(id("torchrun --nnodes 1 train.py", None), Ok(None));
        assert_eq!(id("python train.py --nnodes 2", None), Ok(None), "not torchrun: its arguments are the program's");
        assert_eq!(id("python train.py", Some("mine")), Ok(node("mine", 1, 0)));
        assert_eq!(id("torchrun --nnodes 2 --node-rank 1 train.py", Some("mine")), Ok(node("mine", 2, 1)));
        assert_eq!(node_identity(&cmd("accelerate launch t.py"), Some("j"), Some(3), Some(2)), Ok(node("j", 3, 2)));
    }

    #[test]
    fn bad_node_counts_and_ranks_say_what_is_expected() {
        let id = |s: &str| node_identity(&cmd(s), None, None, None);
        assert!(id("torchrun --nnodes two t.py").unwrap_err().contains("expected a count (2) or a range (1:4)"));
        assert!(id("torchrun --nnodes 2 --node-rank x t.py").unwrap_err().contains("expected a number"));
        assert!(id("torchrun --nnodes 2 --node-rank 2 t.py").unwrap_err().contains("from 0 to 1"));
        assert!(node_identity(&cmd("python t.py"), Some("j"), Some(0), None).is_err());
        assert!(node_identity(&cmd("python t.py"), None, Some(2), None).unwrap_err().contains("needs --job NAME"));
    }

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
