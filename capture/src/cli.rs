//! The commands `collector-capture` runs: `trace --model`/`--torchscript` (also as a server's
//! trace child, `--progress-json`), `sweep` and `overhead`, as `collector` hands them over
//! ([`protocol::CaptureJob`]).

use crate::run;
use anyhow::Context;
use protocol::{ModelRun, OverheadRun};
use shared::units::format_seconds;
use std::path::{Path, PathBuf};
use traceio::files::{parse_format, resolve_format, write_export};
use traceio::text::emit;
use traceio::text::print_summary;

/// `collector trace --model`/`--torchscript` ([`protocol::CaptureJob::Trace`]).
#[derive(Debug)]
pub struct TraceJob {
    pub run: ModelRun,
    pub output: Option<PathBuf>,
    /// The export format's name.
    pub format: Option<String>,
    pub top: usize,
    pub quiet: bool,
    pub progress_json: bool,
}

/// The export format the job names, else the output file's.
fn format_of(a: &TraceJob, output: &Path) -> anyhow::Result<shared::export::ExportFormat> {
    let named = a.format.as_deref().map(parse_format).transpose().map_err(anyhow::Error::msg)?;
    resolve_format(named, output)
}

/// `collector trace --model`/`--torchscript`.
pub fn trace_command(a: TraceJob) -> anyhow::Result<()> {
    if a.progress_json {
        return trace_json_command(a);
    }
    let opts = run_options(a.run.clone())?;
    let output = a.output.clone().unwrap_or_else(|| {
        let stem = opts
            .torchscript
            .as_ref()
            .and_then(|p| p.file_stem())
            .map_or_else(|| opts.model.name.clone(), |s| s.to_string_lossy().into_owned());
        PathBuf::from(format!("{stem}.mtrace.json"))
    });
    let format = format_of(&a, &output)?;
    let quiet = a.quiet;
    eprintln!("tracing {} on {} ...", opts.torchscript.as_ref().map_or(opts.model.name.clone(), |p| p.display().to_string()), opts.device);
    let mut bar = ProgressBar::new(quiet);
    let trace = run::trace_model(&opts, &mut |p| bar.update(p))?;
    bar.finish();
    let bytes = write_export(&trace, format, &output)?;
    print_summary(&trace, a.top, false, std::io::stdout().lock()).context("cannot print the summary")?;
    let f = trace.memory_footprint();
    eprintln!(
        "in memory: {:.1} B per memory event ({} events), {} for the whole trace with {} ops and {} tensor references",
        f.event_bytes_per_event(),
        f.events,
        shared::units::format_bytes(f.total() as u64),
        trace.ops.len(),
        trace.tensors.len()
    );
    eprintln!("wrote {} ({}) to {}", shared::units::format_bytes(bytes), format.name(), output.display());
    Ok(())
}

/// `collector trace --progress-json`: what `collector serve` runs; JSON lines on stdout.
fn trace_json_command(a: TraceJob) -> anyhow::Result<()> {
    use protocol::ChildLine;
    use protocol::FailureClass;
    let fail = |class: FailureClass, detail: String| -> anyhow::Result<()> {
        emit(&ChildLine::Error { class, detail: detail.clone() });
        anyhow::bail!(detail)
    };
    let mut opts = match run_options(a.run.clone()) {
        Ok(o) => o,
        Err(e) => return fail(FailureClass::Invalid, format!("{e:#}")),
    };
    opts.live_memory = true;
    let Some(output) = a.output.clone() else {
        return fail(FailureClass::Invalid, "--progress-json needs --output".into());
    };
    let format = match format_of(&a, &output) {
        Ok(f) => f,
        Err(e) => return fail(FailureClass::Invalid, format!("{e:#}")),
    };
    let started = std::time::Instant::now();
    let trace = crate::run::trace_model(&opts, &mut |line| emit(&line));
    let trace = match trace {
        Ok(t) => t,
        Err(e) => return fail(error_class(&e), e.to_string()),
    };
    let ms = started.elapsed().as_secs_f64() * 1e3;
    if let Err(e) = write_export(&trace, format, &output) {
        return fail(FailureClass::Internal, format!("{e:#}"));
    }
    emit(&ChildLine::Done { info: protocol::trace_info(&trace, &opts.model.name, ms) });
    Ok(())
}

/// The class of a failed run, for `collector serve` to answer with (503, 422 or 500).
fn error_class(e: &crate::run::RunError) -> protocol::FailureClass {
    use crate::models::ModelError;
    use crate::run::RunError;
    use protocol::FailureClass;
    match e {
        RunError::NoCuda(_) => FailureClass::NoCuda,
        RunError::Invalid(_) | RunError::Model(ModelError::Unknown(_) | ModelError::BadShape { .. } | ModelError::BadOption { .. }) => {
            FailureClass::Invalid
        }
        RunError::Model(ModelError::TorchScript { .. }) => FailureClass::Model,
        RunError::Torch(m) => FailureClass::of_torch_error(m),
        RunError::Capture(_) => FailureClass::Internal,
    }
}

/// `collector sweep`.
pub fn sweep_command(run: ModelRun, batch_sizes: &[u64], output: &Path) -> anyhow::Result<()> {
    use crate::sweep::{sweep, SweepProgress};
    use shared::units::format_bytes;
    anyhow::ensure!(!batch_sizes.is_empty(), "--batch-sizes needs at least one batch size");
    anyhow::ensure!(batch_sizes.iter().all(|&b| b > 0), "--batch-sizes must all be at least 1");
    let opts = run_options(run)?;
    let started = std::time::Instant::now();
    let report = sweep(&opts, batch_sizes, output, &mut |p| match p {
        SweepProgress::Start { batch_size } => eprintln!("batch size {batch_size}: tracing {} on {} ...", opts.model.name, opts.device),
        SweepProgress::Done { run } => match (&run.error, run.peak_allocated_bytes) {
            (None, Some(peak)) => eprintln!(
                "batch size {}: peak allocated {}, iteration {:.1} ms",
                run.batch_size,
                format_bytes(peak),
                run.median_iteration_s.unwrap_or(0.0) * 1e3
            ),
            (Some(e), _) => eprintln!("batch size {}: {}: {e}", run.batch_size, run.status.as_str()),
            (None, None) => {}
        },
    })?;
    let files = traceio::folders::write_sweep(&report, output)?;
    println!("batch_size  status          peak_allocated   peak_reserved   iteration");
    for r in &report.runs {
        println!(
            "{:>10}  {:<14}  {:>14}  {:>14}  {:>9}",
            r.batch_size,
            r.status.as_str(),
            r.peak_allocated_bytes.map(format_bytes).unwrap_or_default(),
            r.peak_reserved_bytes.map(format_bytes).unwrap_or_default(),
            r.median_iteration_s.map(|s| format!("{:.1} ms", s * 1e3)).unwrap_or_default()
        );
    }
    eprintln!("sweep took {:.1} s; wrote {} files to {}", started.elapsed().as_secs_f64(), files.len(), output.display());
    Ok(())
}

/// `--device`, or the first GPU if there is one, else the CPU.
fn device_arg(device: Option<&str>) -> anyhow::Result<crate::run::DeviceChoice> {
    match device {
        Some(d) => d.parse().map_err(anyhow::Error::msg),
        None => Ok(crate::run::default_device()),
    }
}

/// The run the flags describe.
pub fn run_options(a: ModelRun) -> anyhow::Result<crate::run::RunOptions> {
    let mut opts = crate::run::RunOptions::new(&a.model);
    opts.model.layers = a.layers;
    opts.model.width = a.width;
    opts.model.heads = a.heads;
    opts.model.vocab = a.vocab;
    opts.model.classes = a.classes;
    opts.torchscript = a.torchscript;
    opts.input_shape = a.input_shape;
    opts.batch_size = a.batch_size;
    opts.mode = a.mode;
    opts.optimizer = a.optimizer;
    opts.learning_rate = a.lr;
    opts.iterations = a.iterations;
    opts.amp = a.amp;
    opts.device = device_arg(a.device.as_deref())?;
    opts.max_events = a.max_events;
    opts.fragmentation = !a.no_fragmentation;
    opts.capture_tensors = !a.no_tensors;
    opts.capture_ops = !a.memory_only;
    opts.seed = a.seed;
    Ok(opts)
}

/// `collector overhead`: prints the medians as JSON.
pub fn overhead_command(a: OverheadRun) -> anyhow::Result<()> {
    let mut opts = run::RunOptions::new(&a.model);
    opts.input_shape = a.input_shape;
    opts.batch_size = Some(a.batch_size);
    opts.capture_tensors = !a.no_tensors;
    opts.capture_ops = !a.memory_only;
    opts.device = device_arg(a.device.as_deref())?;
    let report = run::overhead_benchmark(&opts, a.steps, a.warmup)?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

/// A one-line progress bar over iterations on stderr.
#[derive(Debug)]
pub struct ProgressBar {
    quiet: bool,
    drawn: bool,
}

impl ProgressBar {
    pub fn new(quiet: bool) -> Self {
        Self { quiet, drawn: false }
    }

    pub fn update(&mut self, p: crate::run::Progress) {
        use crate::run::Progress;
        if self.quiet {
            return;
        }
        if let Progress::Iteration { done, of, seconds } = p {
            const WIDTH: u32 = 30;
            let filled = (done * WIDTH).checked_div(of).unwrap_or(WIDTH) as usize;
            eprint!(
                "\r  [{}{}] {done}/{of} iterations, last {}",
                "#".repeat(filled),
                " ".repeat(WIDTH as usize - filled),
                format_seconds(seconds)
            );
            self.drawn = true;
        }
    }

    pub fn finish(&mut self) {
        if self.drawn {
            eprintln!();
            self.drawn = false;
        }
    }
}
