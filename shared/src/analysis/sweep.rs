//! The combined result of a batch-size sweep (`collector sweep`): one run per batch size with
//! its peak, its latency and its memory-vs-rank curve, in one JSON file the viewer overlays.

use crate::model::Phase;
use serde::{Deserialize, Serialize};

/// The `format` tag of a sweep file.
pub const SWEEP_FORMAT: &str = "memory_tracer_sweep";
pub const SWEEP_VERSION: u32 = 1;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepReport {
    /// Always [`SWEEP_FORMAT`].
    pub format: String,
    pub version: u32,
    pub model: String,
    pub mode: String,
    pub device: String,
    pub runs: Vec<SweepRun>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SweepStatus {
    Ok,
    /// The allocator could not satisfy a request; `error` holds its message.
    OutOfMemory,
    /// Any other failure of the run; `error` says what.
    Failed,
}

impl SweepStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            SweepStatus::Ok => "ok",
            SweepStatus::OutOfMemory => "out_of_memory",
            SweepStatus::Failed => "failed",
        }
    }
}

/// One batch size of a sweep. The numbers are absent when the run failed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepRun {
    pub batch_size: u64,
    pub status: SweepStatus,
    pub error: Option<String>,
    /// Peak over the whole run, warm-up included.
    pub peak_allocated_bytes: Option<u64>,
    pub peak_reserved_bytes: Option<u64>,
    /// `torch.cuda.max_memory_allocated()` read in the same process (CUDA runs), to check
    /// `peak_allocated_bytes` against.
    #[serde(default)]
    pub pytorch_max_allocated_bytes: Option<u64>,
    /// Median wall time of the steady iterations.
    pub median_iteration_s: Option<f64>,
    /// The trace of this run, relative to the sweep file.
    pub trace_file: Option<String>,
    pub curve: Vec<RankPoint>,
}

/// One rank of a memory-vs-rank curve.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankPoint {
    pub rank: u32,
    pub gtype: Phase,
    pub allocated_bytes: u64,
    pub peak_bytes: u64,
}

/// What went wrong reading a sweep file.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("not a sweep file: {0}")]
    Json(#[from] serde_json::Error),
    #[error("not a sweep file: expected format \"{SWEEP_FORMAT}\", found \"{0}\"")]
    Format(String),
    #[error("sweep file version {0} is newer than this tool reads ({SWEEP_VERSION})")]
    Version(u32),
}

/// Reads a sweep file.
pub fn read_sweep(bytes: &[u8]) -> Result<SweepReport, SweepError> {
    let r: SweepReport = serde_json::from_slice(bytes)?;
    if r.format != SWEEP_FORMAT {
        return Err(SweepError::Format(r.format));
    }
    if r.version > SWEEP_VERSION {
        return Err(SweepError::Version(r.version));
    }
    Ok(r)
}
