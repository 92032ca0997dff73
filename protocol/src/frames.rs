//! The frames a traced Python process sends the collector (`collector/src/pyrun/wire.rs` reads
//! them; `memory_tracer/_capture.py`, `_history.py` and `_auto.py` write them), and the options
//! the collector hands the process (`MEMORY_TRACER_OPTIONS`, read by `_auto.py`).
//!
//! Every field may be missing (an older package leaves out what it did not know; the recorder
//! fallback sends a hello of its own) and unknown fields are ignored, so a frame is refused
//! only when a field it has is of the wrong type.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The first frame: who is talking and from when.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Hello {
    /// `native` (the shim) or `recorder` (PyTorch's recorder, the fallback).
    pub capture: Option<String>,
    /// Why the recorder runs instead of the native capture.
    pub reason: Option<String>,
    /// `auto` (`collector trace -- …`) or `api` (`MemoryTracer`).
    pub mode: Option<String>,
    /// The device the `MemoryTracer` API keeps (`cpu`, `cuda:N`); `collector trace` sends none.
    pub device: Option<String>,
    /// How the native capture's library came: carried, or built on first use.
    pub library: Option<String>,
    pub pid: Option<u64>,
    pub ppid: Option<u64>,
    pub argv: Vec<String>,
    pub executable: Option<String>,
    pub python_version: Option<String>,
    pub torch_version: Option<String>,
    pub cwd: Option<String>,
    /// The wall clock at the start.
    pub start_unix_ns: Option<u64>,
    /// The shim's clock at the start (CLOCK_MONOTONIC): records are timed from it.
    pub start_ns: Option<u64>,
    /// Whether torch was built for CUDA or ROCm (the recorder's hello).
    pub cuda_built: Option<bool>,
    /// Each CUDA device's allocated and reserved bytes when the capture started.
    pub base_totals: Vec<BaseTotals>,
    /// The options the process runs with, as it received them.
    pub options: Option<CaptureOptions>,
    /// torchrun's variables (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, …) the process had.
    pub env: BTreeMap<String, String>,
    /// The caching allocator's variables the process started with (`PYTORCH_CUDA_ALLOC_CONF`,
    /// `PYTORCH_ALLOC_CONF`, `PYTORCH_HIP_ALLOC_CONF`).
    pub alloc_conf_env: BTreeMap<String, String>,
}

impl Hello {
    /// The process's `RANK` under torchrun.
    pub fn rank(&self) -> Option<u32> {
        self.env.get("RANK")?.parse().ok()
    }

    /// The process's `WORLD_SIZE` under torchrun.
    pub fn world_size(&self) -> Option<u32> {
        self.env.get("WORLD_SIZE")?.parse().ok()
    }
}

/// What the process says of its caching allocator at its end (`_allocator.py`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AllocatorEnd {
    /// `torch.cuda.memory._snapshot()`'s `allocator_settings`, when it could be read.
    pub settings: Option<shared::model::AllocatorSettings>,
    /// `_set_allocator_settings` and `set_per_process_memory_fraction` calls, in order, on the
    /// shim's clock.
    pub changes: Vec<shared::model::AllocatorChange>,
}

/// One CUDA device's totals at the capture's start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct BaseTotals {
    pub device: i64,
    pub allocated: u64,
    pub reserved: u64,
}

/// The last frame: what the process counted, PyTorch's own counters, and what it noticed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct End {
    /// `exit`, or what ended the capture.
    pub reason: Option<String>,
    /// The shim's counters (`mt_counters`).
    pub counters: Counters,
    pub steps: Option<u64>,
    pub iterations: Option<u64>,
    /// Warnings for the trace (no optimizer step seen, a marker never called, …).
    pub notes: Vec<String>,
    /// Why allocations outside every module are not named by their lines (a Python before 3.12).
    #[serde(default)]
    pub lines_unnamed: Option<String>,
    /// The optimizers' names, as scopes name them.
    pub optimizers: Vec<String>,
    /// `torch.cuda.memory_stats` of each device the process used.
    pub cuda: Vec<CudaDevice>,
    /// The private pools' segments at the end (CUDA graphs, `torch.cuda.MemPool`).
    pub private_pools: Vec<PoolSegment>,
    /// The driver's samples: `[ts_ns (shim clock), device, used bytes, total bytes]`.
    pub device_samples: Vec<(u64, i64, u64, u64)>,
    /// The device ledger's NVML samples: (time, device, this process's bytes, the other
    /// processes' bytes).
    #[serde(default)]
    pub process_samples: Vec<(u64, i64, u64, u64)>,
    /// Why the device ledger, or a part of it, is missing.
    #[serde(default)]
    pub ledger_missing: Vec<String>,
    /// The recorder: whether it recorded CUDA memory at all, and how many snapshots it wrote.
    pub cuda_used: Option<bool>,
    pub snapshots: Option<u64>,
    /// torch.compile's generated code and what of it was attributed to modules.
    pub compiled: Option<shared::model::CompiledCode>,
    /// The allocator's effective settings at the end and the program's changes to them.
    pub allocator: Option<AllocatorEnd>,
}

/// The shim's counters at the end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Counters {
    pub mem_kept: u64,
    pub mem_dropped: u64,
    pub op_kept: u64,
    pub op_dropped: u64,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    pub buffer_dropped: u64,
}

/// One CUDA device's facts and `torch.cuda.memory_stats` at the end (`error` instead, when
/// asking failed).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CudaDevice {
    pub device: Option<i64>,
    pub name: Option<String>,
    pub total_memory: Option<u64>,
    pub allocated_current: Option<u64>,
    pub allocated_peak: Option<u64>,
    pub reserved_current: Option<u64>,
    pub reserved_peak: Option<u64>,
    pub num_alloc_retries: Option<u64>,
    pub num_ooms: Option<u64>,
    pub error: Option<String>,
}

/// A segment of a private memory pool alive at the end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PoolSegment {
    pub device: i64,
    pub address: u64,
    pub size: u64,
    /// The pool's id as PyTorch gives it (`(a, b)`).
    pub pool: (i64, i64),
}

/// A frame a process sends outside its capture: why nothing was traced, or (the recorder) a
/// snapshot file it wrote. `kind` says which; the other fields belong to some kinds only.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Note {
    /// `no_torch`, `torch_mismatch`, `capture_failed`, or the recorder's snapshot note.
    pub kind: String,
    pub pid: Option<u64>,
    pub executable: Option<String>,
    pub detail: Option<String>,
    /// `torch_mismatch`: the torch found and the releases supported.
    pub found: Option<String>,
    pub supported: Vec<String>,
    /// A snapshot: its file (in the process's snapshot folder), size, entries, order, why it
    /// was taken, and the pieces it was cut into.
    pub file: Option<String>,
    pub bytes: Option<u64>,
    pub entries: Option<u64>,
    pub index: Option<u64>,
    pub why: Option<String>,
    pub pieces: Option<Vec<SnapshotPiece>>,
}

/// One pickle of a recorder snapshot file: what it holds and where (`[offset, offset + bytes)`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotPiece {
    /// `entries` (of `device`), `annotations`, `segments` or `settings`.
    pub what: String,
    pub device: Option<usize>,
    pub offset: u64,
    pub bytes: u64,
}

/// What the collector asks of a traced process (`MEMORY_TRACER_OPTIONS`, JSON).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CaptureOptions {
    /// Allocations and frees kept at most (past it, counted as dropped).
    pub max_events: u64,
    /// Operators kept at most.
    pub max_ops: u64,
    /// Record operators' input and output tensors.
    pub capture_tensors: bool,
    /// 0: no operators, 1: every operator, 2: autograd nodes only.
    pub capture_ops: u8,
    /// Name allocations by the module they happen in.
    pub module_scopes: bool,
    /// A module (path or class name) whose calls are the iterations.
    pub iteration_marker: Option<String>,
    /// Records a process may hold before the collector drains them.
    pub buffer_records: u64,
    /// How often the process's drain thread sends what was recorded.
    pub interval_ms: u32,
    /// `auto`, `native` or `recorder`.
    pub capture: String,
    /// Who holds each storage: 0 not recorded, 1 parameters, buffers, gradients, optimizer
    /// state and tensors saved for backward, 2 also the Python variables at marks.
    pub holders: u8,
    /// The device ledger (driver allocations by library, NVML's figures for the process).
    #[serde(default)]
    pub ledger: bool,
}

/// What `collector ingest --stats-json` prints for the Python `MemoryTracer` API (one JSON
/// object on stdout), which reads `summary`, `layer_stats`, `peak_memory_per_layer` and
/// `fragmentation.per_layer` from it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IngestStats {
    pub summary: shared::analysis::Summary,
    pub layer_stats: std::collections::BTreeMap<String, shared::analysis::LayerMemoryStats>,
    pub peak_memory_per_layer: std::collections::BTreeMap<String, u64>,
    pub fragmentation: shared::analysis::FragmentationStats,
    pub warnings: Vec<String>,
    /// Which capture recorded the trace (`native`, `recorder`, …).
    pub capture: Option<String>,
    /// PyTorch's own counters in the traced process (`cuda.max_memory_allocated`, …).
    pub reported: std::collections::BTreeMap<String, u64>,
    /// Where the trace was written (own format).
    pub trace_path: std::path::PathBuf,
    /// Memory scalars per iteration, for `MemoryTracer.to_tensorboard(writer)`.
    pub tensorboard: Vec<shared::export::tensorboard::Step>,
}

impl IngestStats {
    /// The statistics of `trace`, written at `trace_path`.
    pub fn of(trace: &shared::Trace, trace_path: &std::path::Path) -> Self {
        use shared::analysis;
        let layer_stats = analysis::layer_stats(trace);
        Self {
            summary: analysis::summary(trace),
            peak_memory_per_layer: analysis::peak_memory_per_layer(trace),
            fragmentation: analysis::fragmentation_stats_with_layers(trace, &layer_stats),
            layer_stats,
            warnings: trace.meta.warnings.clone(),
            capture: trace.meta.capture.clone(),
            reported: trace.meta.reported.clone(),
            trace_path: trace_path.to_path_buf(),
            tensorboard: shared::export::tensorboard::steps(trace),
        }
    }
}
