//! The device ledger (`collector trace --ledger`): device memory the driver handed this process
//! outside PyTorch's view of it, by the library that asked, and NVML's figures for the process.

use super::{StrId, Trace};
use serde::{Deserialize, Serialize};

/// The source of the caching allocator's own segments among the driver's allocations.
pub const PYTORCH_SOURCE: &str = "pytorch";

/// One driver allocation (`bytes` > 0) or its release (`bytes` < 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerEvent {
    pub ts_ns: u64,
    /// Index into `Trace::devices`.
    pub device: u8,
    /// The library that asked: `pytorch` (the caching allocator's own segments), `nccl`,
    /// `cublas`, `cublaslt`, `cudnn`, `triton`, `raw_cuda <library>`; or the driver's growth
    /// around a call that allocates without an allocation call: `kernels <library>` (a
    /// function's first launch, a module load), `streams`, `cuda_graphs`.
    pub source: StrId,
    pub bytes: i64,
    /// The address, or a `cuMemCreate` handle with bit 63 set.
    pub address: u64,
    /// The line of the program's own code its thread was at when it was made
    /// (`train.py:40 in main`; Python 3.12 and later), or none.
    #[serde(default = "no_frame", skip_serializing_if = "StrId::is_none_ref")]
    pub frame: StrId,
}

fn no_frame() -> StrId {
    StrId::NONE
}

/// NVML's count of one device's memory for this process and for every other one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessSample {
    pub ts_ns: u64,
    /// Index into `Trace::devices`.
    pub device: u8,
    pub process_bytes: u64,
    pub other_processes_bytes: u64,
}

/// What the ledger recorded; empty for a trace recorded without it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceLedger {
    /// In time order.
    #[serde(default)]
    pub events: Vec<LedgerEvent>,
    /// In time order.
    #[serde(default)]
    pub process: Vec<ProcessSample>,
    /// Why the ledger, or a part of it, was not recorded (no NVML, another CUPTI subscriber).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<String>,
}

impl DeviceLedger {
    pub fn is_empty(&self) -> bool {
        self.events.is_empty() && self.process.is_empty() && self.missing.is_empty()
    }
}

/// The most of `device`'s memory this process held outside PyTorch's caching allocator during
/// the run (the CUDA context, NCCL, cuBLAS, kernels, raw allocations), for a trace with a
/// ledger: NVML's figure for the process less PyTorch's reserved bytes at each sample, else the
/// driver allocations the ledger named. What a device must hold beside PyTorch's peak.
pub fn outside_pytorch_peak(trace: &Trace, device: u8) -> Option<u64> {
    if trace.ledger.is_empty() {
        return None;
    }
    let samples: Vec<&ProcessSample> = trace.ledger.process.iter().filter(|p| p.device == device).collect();
    if !samples.is_empty() {
        let reserved = reserved_at_samples(trace, device, &samples);
        let most = samples.iter().zip(reserved).map(|(p, r)| p.process_bytes.saturating_sub(r)).max().unwrap_or(0);
        return Some(most);
    }
    let (mut now, mut most) = (0i64, 0i64);
    for e in trace.ledger.events.iter().filter(|e| e.device == device && trace.str(e.source) != PYTORCH_SOURCE) {
        now += e.bytes;
        most = most.max(now);
    }
    Some(most.max(0) as u64)
}

/// PyTorch's reserved bytes on `device` at each of `samples`' times (in time order), in one
/// pass over the events.
pub fn reserved_at_samples(trace: &Trace, device: u8, samples: &[&ProcessSample]) -> Vec<u64> {
    let mut reserved = 0u64;
    let mut cursor = trace.events.cursor();
    let mut i = 0usize;
    samples
        .iter()
        .map(|p| {
            while i < trace.events.len() && trace.events.ts_ns[i] <= p.ts_ns {
                let totals = cursor.advance();
                if trace.events.device[i] == device {
                    reserved = totals.reserved_bytes;
                }
                i += 1;
            }
            reserved
        })
        .collect()
}
