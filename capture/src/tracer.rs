//! `MemoryTracer`: the library API for people embedding the capture in Rust, mirroring the seed
//! service's Python class. Wrap any tch code in [`MemoryTracer::trace`], name layers with
//! [`MemoryTracer::scope`] or [`MemoryTracer::trace_module`], then query or export.
//!
//! ```no_run
//! use capture::tracer::MemoryTracer;
//! use tch::{nn, nn::Module, Device, Kind, Tensor};
//! let tracer = MemoryTracer::new(100_000, "cpu", true).unwrap();
//! let vs = nn::VarStore::new(Device::Cpu);
//! let fc = nn::linear(vs.root() / "fc", 784, 10, Default::default());
//! let x = Tensor::randn([64, 784], (Kind::Float, Device::Cpu));
//! tracer.trace(|| tracer.trace_module("fc", &fc, &x)).unwrap();
//! println!("{:?}", tracer.get_peak_memory_per_layer());
//! tracer.print_summary();
//! ```
//!
//! Thread-safe: the tracer is `Send + Sync`; traces taken from several threads run one after
//! another (libtorch's callbacks are process-wide), each replacing the last result.

use crate::run::DeviceChoice;
use crate::session::{self, assemble, CaptureConfig, CaptureError, Session};
use shared::analysis::{self, FragmentationStats, LayerMemoryStats};
use shared::export::{self, ExportFormat};
use shared::model::{SourceFormat, TraceMeta};
use shared::Trace;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

/// Records allocations, operators and layers of the code it traces.
#[derive(Debug)]
pub struct MemoryTracer {
    max_events: u64,
    device: DeviceChoice,
    enable_fragmentation_tracking: bool,
    last: Mutex<Option<Trace>>,
}

/// Why a tracer call failed.
#[derive(Debug, thiserror::Error)]
pub enum TracerError {
    #[error("invalid device: {0}")]
    Device(String),
    #[error(transparent)]
    Capture(#[from] CaptureError),
    #[error("nothing traced yet: call MemoryTracer::trace first")]
    NoTrace,
    #[error("cannot write {path}: {source}")]
    Write { path: String, source: std::io::Error },
    #[error(transparent)]
    Export(#[from] export::ExportError),
}

impl MemoryTracer {
    /// `device` is `cpu`, `cuda` or `cuda:N` (the device whose allocator counters are read).
    pub fn new(max_events: u64, device: &str, enable_fragmentation_tracking: bool) -> Result<Self, TracerError> {
        let device: DeviceChoice = device.parse().map_err(TracerError::Device)?;
        if max_events == 0 {
            return Err(TracerError::Device("max_events must be at least 1".into()));
        }
        Ok(Self { max_events, device, enable_fragmentation_tracking, last: Mutex::new(None) })
    }

    /// Runs `f` on this thread while recording; the trace replaces the previous one.
    pub fn trace<T>(&self, f: impl FnOnce() -> T) -> Result<T, TracerError> {
        let cuda = match self.device {
            DeviceChoice::Cuda(i) => Some(i as i8),
            DeviceChoice::Cpu => None,
        };
        let session = Session::start_waiting(CaptureConfig {
            max_events: self.max_events,
            max_ops: self.max_events,
            capture_tensors: true,
            capture_ops: true,
            cuda_device: cuda,
        })?;
        let out = f();
        let captured = session.finish();
        let mut meta = TraceMeta::new(SourceFormat::MemoryTracer);
        meta.fragmentation_tracked = self.enable_fragmentation_tracking;
        meta.pytorch_version = Some(crate::run::TORCH_VERSION.into());
        let trace = assemble::assemble(&captured, meta);
        *self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(trace);
        Ok(out)
    }

    /// A layer scope named `name` until the guard drops (nest them for module paths).
    pub fn scope(&self, name: &str) -> session::ScopeGuard {
        session::scope(session::intern(name))
    }

    /// Runs a tch module's forward inside a layer scope named `name`.
    pub fn trace_module(&self, name: &str, module: &impl tch::nn::Module, xs: &tch::Tensor) -> tch::Tensor {
        let _g = self.scope(name);
        module.forward(xs)
    }

    fn with<R>(&self, f: impl FnOnce(&Trace) -> R) -> Result<R, TracerError> {
        let last = self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        last.as_ref().map(f).ok_or(TracerError::NoTrace)
    }

    /// A copy of the last trace.
    pub fn trace_data(&self) -> Result<Trace, TracerError> {
        self.with(Trace::clone)
    }

    pub fn get_layer_stats(&self) -> Result<BTreeMap<String, LayerMemoryStats>, TracerError> {
        self.with(analysis::layer_stats)
    }

    pub fn get_peak_memory_per_layer(&self) -> Result<BTreeMap<String, u64>, TracerError> {
        self.with(analysis::peak_memory_per_layer)
    }

    pub fn get_fragmentation_stats(&self) -> Result<FragmentationStats, TracerError> {
        self.with(analysis::fragmentation_stats)
    }

    /// Writes a speedscope flame graph (layers and ops over time, bytes live at the peak).
    pub fn export_flame_graph(&self, path: impl AsRef<Path>) -> Result<(), TracerError> {
        self.export(path.as_ref(), ExportFormat::Speedscope)
    }

    /// Writes the timeline JSON (`events`, `layer_stats`, `summary`).
    pub fn export_timeline(&self, path: impl AsRef<Path>) -> Result<(), TracerError> {
        self.export(path.as_ref(), ExportFormat::Timeline)
    }

    fn export(&self, path: &Path, format: ExportFormat) -> Result<(), TracerError> {
        self.with(|t| -> Result<(), TracerError> {
            traceio::files::write_export(t, format, path)
                .map(drop)
                .map_err(|e| TracerError::Write { path: path.display().to_string(), source: std::io::Error::other(format!("{e:#}")) })
        })?
    }

    /// Prints peak, fragmentation and top layers to stdout.
    pub fn print_summary(&self) {
        let printed = self.with(|t| traceio::text::print_summary(t, 10, false, std::io::stdout().lock()));
        match printed {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("cannot print the summary: {e:#}"),
            Err(e) => eprintln!("{e}"),
        }
    }
}
