//! Traces a model: builds it inside a capture session, runs the training or inference loop,
//! and assembles the trace with the device facts and PyTorch's own counters.

use crate::models::{self, ModelError, ModelSpec};
use crate::session::{self, assemble, CaptureConfig, Session};
use record::live::{LiveDevice, LiveTotals};
use shared::model::{DeviceSample, Phase, SourceFormat, TraceMeta};
use shared::Trace;
use std::path::PathBuf;
use std::time::Instant;
use tch::nn::{self, OptimizerConfig};

pub use protocol::TORCH_VERSION;

pub use protocol::{Mode, OptimizerKind};

/// How a built-in model ran, kept in the trace's `allocator_settings` (a snapshot keeps the
/// allocator's settings there).
#[derive(serde::Serialize)]
struct RunSettings {
    mode: Mode,
    optimizer: OptimizerKind,
    iterations: u32,
    amp: bool,
    device: String,
    max_events: u64,
    iteration_seconds: Vec<f64>,
}

/// Where to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceChoice {
    Cpu,
    Cuda(i32),
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("unknown device `{s}`; expected cpu, cuda or cuda:N");
        match s {
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda(0)),
            _ => {
                let n = s.strip_prefix("cuda:").ok_or_else(bad)?;
                n.parse::<i32>().ok().filter(|n| (0..=255).contains(n)).map(Self::Cuda).ok_or_else(bad)
            }
        }
    }
}

impl std::fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceChoice::Cpu => f.write_str("cpu"),
            DeviceChoice::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// The first GPU if libtorch sees one, else the CPU.
pub fn default_device() -> DeviceChoice {
    if tch::Cuda::is_available() {
        DeviceChoice::Cuda(0)
    } else {
        DeviceChoice::Cpu
    }
}

/// Everything `collector trace` and `POST /api/trace/memory` can ask for.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub model: ModelSpec,
    pub torchscript: Option<PathBuf>,
    pub input_shape: Option<Vec<i64>>,
    pub batch_size: Option<i64>,
    pub mode: Mode,
    pub optimizer: OptimizerKind,
    pub learning_rate: f64,
    pub iterations: u32,
    pub amp: bool,
    pub device: DeviceChoice,
    pub max_events: u64,
    pub fragmentation: bool,
    pub capture_tensors: bool,
    /// Record operators (false: memory and layer scopes only).
    pub capture_ops: bool,
    pub seed: i64,
    /// Report memory totals while the model runs ([`Progress::Memory`], a few times per
    /// iteration) for live views.
    pub live_memory: bool,
}

impl RunOptions {
    pub fn new(model: &str) -> Self {
        Self {
            model: ModelSpec::named(model),
            torchscript: None,
            input_shape: None,
            batch_size: None,
            mode: Mode::Train,
            optimizer: OptimizerKind::Sgd,
            learning_rate: 0.01,
            iterations: 3,
            amp: false,
            device: DeviceChoice::Cpu,
            max_events: 5_000_000,
            fragmentation: true,
            capture_tensors: true,
            capture_ops: true,
            seed: 0,
            live_memory: false,
        }
    }
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("{0}")]
    NoCuda(String),
    #[error("invalid option: {0}")]
    Invalid(String),
    #[error(transparent)]
    Capture(#[from] session::CaptureError),
    /// libtorch raised an error while running the model (out of memory, a TorchScript model
    /// that does not take the input, ...).
    #[error("the model failed while running: {0}")]
    Torch(String),
}

/// A libtorch error as a [`RunError`], without the C++ backtrace.
fn torch_err(e: impl std::fmt::Display) -> RunError {
    RunError::Torch(models::torch_message(&e.to_string()))
}

/// Progress of a run, for progress bars and live streams: the lines `--progress-json` prints
/// (`Started`, `Iteration`, and `Memory` with the totals since the last report, only with
/// [`RunOptions::live_memory`]: at most [`LIVE_POINTS_PER_REPORT`] points, decimated keeping
/// each bucket's highest allocated total; `rank` is `None`).
pub use protocol::ChildLine as Progress;

pub use record::live::{LivePoint, LIVE_POINTS_PER_REPORT};

/// Checks the device is usable and turns it into a tch device.
pub fn resolve_device(choice: DeviceChoice) -> Result<tch::Device, RunError> {
    match choice {
        DeviceChoice::Cpu => Ok(tch::Device::Cpu),
        DeviceChoice::Cuda(i) => {
            if !tch::Cuda::is_available() {
                let driver = device::count();
                return Err(RunError::NoCuda(format!(
                    "CUDA device cuda:{i} was asked for, but libtorch sees no CUDA device (the driver reports {driver}); use --device cpu"
                )));
            }
            let n = tch::Cuda::device_count();
            if i64::from(i) >= n {
                return Err(RunError::NoCuda(format!("CUDA device cuda:{i} was asked for, but there are {n} (cuda:0..cuda:{})", n - 1)));
            }
            Ok(tch::Device::Cuda(i as usize))
        }
    }
}

thread_local! {
    static QUIET_PANICS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` catching panics (tch panics on libtorch errors such as CUDA out of memory) without
/// the default hook printing them: the error is reported once, as a [`RunError`].
fn catch_quietly<T>(f: impl FnOnce() -> T) -> std::thread::Result<T> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET_PANICS.with(std::cell::Cell::get) {
                previous(info);
            }
        }));
    });
    QUIET_PANICS.with(|q| q.set(true));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    QUIET_PANICS.with(|q| q.set(false));
    r
}

fn panic_message(p: Box<dyn std::any::Any + Send>) -> String {
    let msg = p
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "unknown error".into());
    // tch panics with the whole C++ backtrace; the first lines say what happened.
    models::torch_message(&msg)
}

/// Traces a model as `opts` says. Runs on the calling thread.
pub fn trace_model(opts: &RunOptions, progress: &mut dyn FnMut(Progress)) -> Result<Trace, RunError> {
    if opts.iterations == 0 || opts.iterations > 100_000 {
        return Err(RunError::Invalid("--iterations must be between 1 and 100000".into()));
    }
    if opts.max_events == 0 {
        return Err(RunError::Invalid("--max-events must be at least 1".into()));
    }
    if opts.torchscript.is_none() && !models::ZOO.contains(&opts.model.name.as_str()) {
        return Err(ModelError::Unknown(opts.model.name.clone()).into());
    }
    let device = resolve_device(opts.device)?;
    let cuda = match opts.device {
        DeviceChoice::Cuda(i) => Some(i),
        DeviceChoice::Cpu => None,
    };
    tch::manual_seed(opts.seed);
    let facts = cuda.and_then(device::facts);
    let sampler = cuda.and_then(|i| {
        device::UsedMemorySampler::start(i, std::time::Duration::from_millis(5), || {
            // SAFETY: reads the steady clock.
            unsafe { crate::shim::mt_now_ns() }
        })
    });
    let start_unix_ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let session = Session::start(CaptureConfig {
        max_events: opts.max_events,
        max_ops: opts.max_events,
        capture_tensors: opts.capture_tensors,
        capture_ops: opts.capture_ops,
        cuda_device: cuda.map(|i| i as i8),
    })?;
    session::set_torchscript(opts.torchscript.is_some());

    let mut input_shape = Vec::new();
    let mut iteration_s = Vec::new();
    let mut session = session;
    let mut live = opts.live_memory.then(|| {
        let device = cuda.map_or(LiveDevice::Cpu, |i| LiveDevice::Cuda(i as i8));
        (LiveTotals::new(session.start_ns(), device), 0usize)
    });
    let outcome = catch_quietly(|| {
        let mut checkpoint = || {
            let (live, seen) = live.as_mut()?;
            session.drain();
            let records = session.records();
            let points = live.points(&records[(*seen).min(records.len())..]);
            *seen = records.len();
            (!points.is_empty()).then_some(Progress::Memory { points, rank: None })
        };
        run_loop(opts, device, &mut input_shape, &mut iteration_s, progress, &mut checkpoint)
    });
    session::set_torchscript(false);
    let captured = session.finish();
    // The model, optimizer and batch outlive the recording: their teardown is not part of
    // the run (the trace ends with what the loop left allocated).
    let outcome = outcome.map(|r| r.map(drop));
    let samples = sampler.map(device::UsedMemorySampler::finish).unwrap_or_default();
    let failure = match outcome {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e),
        Err(p) => Some(RunError::Torch(panic_message(p))),
    };
    if let Some(e) = failure {
        if cuda.is_some() {
            session::cuda_empty_cache();
        }
        return Err(e);
    }

    let mut meta = TraceMeta::new(SourceFormat::MemoryTracer);
    meta.model = Some(match &opts.torchscript {
        Some(p) => p.display().to_string(),
        None => opts.model.name.clone(),
    });
    meta.batch_size = input_shape.first().map(|&b| b as u64);
    meta.input_shape = Some(input_shape);
    meta.pytorch_version = Some(TORCH_VERSION.into());
    meta.start_unix_ns = Some(start_unix_ns);
    meta.fragmentation_tracked = opts.fragmentation;
    meta.device_name = Some(match (&facts, cuda) {
        (Some(f), _) => f.name.clone(),
        (None, Some(i)) => format!("cuda:{i}"),
        (None, None) => "CPU".into(),
    });
    meta.device_total_memory_bytes = facts.as_ref().map(|f| f.total_bytes);
    let settings = RunSettings {
        mode: opts.mode,
        optimizer: opts.optimizer,
        iterations: opts.iterations,
        amp: opts.amp,
        device: opts.device.to_string(),
        max_events: opts.max_events,
        iteration_seconds: iteration_s,
    };
    meta.allocator_settings = serde_json::to_value(&settings).ok();
    let start_ns = captured.start_ns;
    let mut trace = assemble::assemble(&captured, meta);
    if let Some(i) = cuda {
        let d = trace.device_index(shared::model::Device { kind: "cuda".into(), index: i, rank: None });
        trace.device_samples = samples
            .iter()
            .map(|s| DeviceSample {
                ts_ns: s.ts_ns.saturating_sub(start_ns),
                device: d,
                used_bytes: s.used_bytes,
                total_bytes: s.total_bytes,
            })
            .collect();
    }
    Ok(trace)
}

/// A model ready to step: weights, optimizer (when training) and one batch on the device.
struct Workload {
    /// Owns the variables; dropped with the workload, after recording has stopped.
    _vs: nn::VarStore,
    model: models::Model,
    optimizer: Option<nn::Optimizer>,
    x: tch::Tensor,
    y: Option<tch::Tensor>,
    input_shape: Vec<i64>,
    device: tch::Device,
    amp: bool,
    loss_scope: session::Name,
    step_scope: session::Name,
    zero_scope: session::Name,
}

impl Workload {
    /// Builds the model (inside its scopes), the optimizer and the batch.
    fn prepare(opts: &RunOptions, device: tch::Device) -> Result<Self, RunError> {
        let mut vs = nn::VarStore::new(device);
        let model = match &opts.torchscript {
            Some(path) => {
                let _g = session::scope(session::intern("model.load"));
                models::load_torchscript(path, &vs)?
            }
            None => {
                // Transformer embeddings (batch, sequence, width) give the width.
                let mut spec = opts.model.clone();
                if let Some([_, _, w]) = opts.input_shape.as_deref() {
                    if spec.name == "transformer" && spec.width.is_none() {
                        spec.width = Some(*w);
                    }
                }
                models::build(&spec, &vs)?
            }
        };
        let input_shape = model.resolve_shape(opts.input_shape.as_deref(), opts.batch_size)?;
        let optimizer = if opts.mode == Mode::Train {
            let lr = opts.learning_rate;
            let built = match opts.optimizer {
                OptimizerKind::Sgd => nn::Sgd { momentum: 0.9, ..Default::default() }.build(&vs, lr),
                OptimizerKind::Adam => nn::Adam::default().build(&vs, lr),
                OptimizerKind::Adamw => nn::AdamW::default().build(&vs, lr),
            };
            Some(built.map_err(torch_err)?)
        } else {
            vs.freeze();
            None
        };
        let (x, y) = {
            let _g = session::scope(session::intern(shared::model::INPUT_LAYER));
            (model.input(&input_shape, device), model.targets(&input_shape, device))
        };
        Ok(Self {
            _vs: vs,
            model,
            optimizer,
            x,
            y,
            input_shape,
            device,
            amp: opts.amp,
            loss_scope: session::intern("loss"),
            step_scope: session::intern("optimizer.step"),
            zero_scope: session::intern("optimizer.zero_grad"),
        })
    }

    /// One iteration: forward and loss, then (training) backward, optimizer step and zero_grad,
    /// each under its phase. `phase_done` runs after each phase (live reports).
    fn step(&mut self, phase_done: &mut dyn FnMut()) -> Result<(), RunError> {
        let train = self.optimizer.is_some();
        session::set_phase(Phase::Forward);
        let forward = || -> Result<tch::Tensor, RunError> {
            let out = self.model.net.forward(&self.x, train).map_err(torch_err)?;
            let _g = session::scope(self.loss_scope);
            Ok(self.model.loss(&out, self.y.as_ref()))
        };
        // tch::autocast toggles libtorch's (deprecated, warning) global switch even when off.
        let amp = |f: &dyn Fn() -> Result<tch::Tensor, RunError>| if self.amp { tch::autocast(true, f) } else { f() };
        if train {
            let loss = amp(&forward)?;
            phase_done();
            session::set_phase(Phase::Backward);
            loss.f_backward().map_err(torch_err)?;
            drop(loss);
            phase_done();
            session::set_phase(Phase::Optimizer);
            if let Some(opt) = self.optimizer.as_mut() {
                {
                    let _g = session::scope(self.step_scope);
                    opt.step();
                }
                let _g = session::scope(self.zero_scope);
                opt.zero_grad();
            }
        } else {
            drop(tch::no_grad(|| amp(&forward))?);
        }
        session::set_phase(Phase::Other);
        phase_done();
        Ok(())
    }

    /// Waits for the device to finish the work queued so far.
    fn sync(&self) {
        if let tch::Device::Cuda(i) = self.device {
            tch::Cuda::synchronize(i as i64);
        }
    }
}

fn run_loop(
    opts: &RunOptions,
    device: tch::Device,
    input_shape: &mut Vec<i64>,
    iteration_s: &mut Vec<f64>,
    progress: &mut dyn FnMut(Progress),
    checkpoint: &mut dyn FnMut() -> Option<Progress>,
) -> Result<Workload, RunError> {
    let mut work = Workload::prepare(opts, device)?;
    input_shape.clone_from(&work.input_shape);
    let begin = session::intern(assemble::ITERATION_BEGIN);
    let end = session::intern(assemble::ITERATION_END);
    progress(Progress::Started { iterations: opts.iterations });
    for it in 0..opts.iterations {
        let t0 = Instant::now();
        session::mark(begin, i64::from(it));
        work.step(&mut || {
            if let Some(p) = checkpoint() {
                progress(p);
            }
        })?;
        work.sync();
        session::mark(end, i64::from(it));
        let seconds = t0.elapsed().as_secs_f64();
        iteration_s.push(seconds);
        progress(Progress::Iteration { done: it + 1, of: opts.iterations, seconds });
    }
    Ok(work)
}

/// Step times of the same model with and without tracing, measured in one process.
#[derive(Clone, Debug, serde::Serialize)]
pub struct OverheadReport {
    pub model: String,
    pub input_shape: Vec<i64>,
    pub device: String,
    pub capture_tensors: bool,
    pub capture_ops: bool,
    pub steps_each: u32,
    pub traced_s: Vec<f64>,
    pub untraced_s: Vec<f64>,
    pub median_traced_s: f64,
    pub median_untraced_s: f64,
    /// (median traced / median untraced - 1) in percent.
    pub overhead_percent: f64,
    /// Records the shim wrote per traced step (memory events, ops, tensors).
    pub records_per_step: f64,
    pub memory_events_per_step: f64,
    pub ops_per_step: f64,
}

/// Runs `steps` traced and `steps` untraced training steps interleaved (ABBA order, after
/// warm-up) and reports their medians.
pub fn overhead_benchmark(opts: &RunOptions, steps: u32, warmup: u32) -> Result<OverheadReport, RunError> {
    let device = resolve_device(opts.device)?;
    tch::manual_seed(opts.seed);
    let mut train = opts.clone();
    train.mode = Mode::Train;
    let mut work = Workload::prepare(&train, device)?;
    // The same step `collector trace` runs, timed from an idle device to an idle device.
    let mut step = || -> Result<f64, RunError> {
        work.sync();
        let t0 = Instant::now();
        work.step(&mut || {})?;
        work.sync();
        Ok(t0.elapsed().as_secs_f64())
    };
    let mut session = Session::start(CaptureConfig {
        max_events: u64::MAX,
        max_ops: u64::MAX,
        capture_tensors: opts.capture_tensors,
        capture_ops: opts.capture_ops,
        cuda_device: None,
    })?;
    session.pause();
    for _ in 0..warmup {
        step()?;
    }
    let (mut traced, mut untraced) = (Vec::new(), Vec::new());
    let (mut records, mut mem, mut ops) = (0usize, 0usize, 0usize);
    for i in 0..2 * steps {
        // A B B A A B B A ...: neither side always runs first.
        let traced_now = matches!(i % 4, 0 | 3);
        if traced_now {
            session.resume()?;
            traced.push(step()?);
            session.pause();
            session.drain();
            let r = session.records();
            records += r.len();
            mem += r.iter().filter(|r| r.kind == session::ffi::MT_MEM).count();
            ops += r.iter().filter(|r| r.kind == session::ffi::MT_OP_ENTER).count();
            session.clear_records();
        } else {
            untraced.push(step()?);
        }
    }
    drop(session.finish());
    let median = |v: &[f64]| shared::analysis::median_f64(&mut v.to_vec()).unwrap_or(f64::NAN);
    let (mt, mu) = (median(&traced), median(&untraced));
    let n = traced.len().max(1) as f64;
    Ok(OverheadReport {
        model: work.model.name.clone(),
        input_shape: work.input_shape.clone(),
        device: opts.device.to_string(),
        capture_tensors: opts.capture_tensors,
        capture_ops: opts.capture_ops,
        steps_each: steps,
        median_traced_s: mt,
        median_untraced_s: mu,
        overhead_percent: (mt / mu - 1.0) * 100.0,
        traced_s: traced,
        untraced_s: untraced,
        records_per_step: records as f64 / n,
        memory_events_per_step: mem as f64 / n,
        ops_per_step: ops as f64 / n,
    })
}
