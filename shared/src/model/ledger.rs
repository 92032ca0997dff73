//! The device ledger (`collector trace --ledger`): device memory the driver handed this process
//! outside PyTorch's view of it, by the library that asked, and NVML's figures for the process.

use super::StrId;
use serde::{Deserialize, Serialize};

/// One driver allocation (`bytes` > 0) or its release (`bytes` < 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerEvent {
    pub ts_ns: u64,
    /// Index into `Trace::devices`.
    pub device: u8,
    /// The library that asked: `pytorch` (the caching allocator's own segments), `nccl`,
    /// `cublas`, `cublaslt`, `cudnn`, `triton`, `raw_cuda <library>`.
    pub source: StrId,
    pub bytes: i64,
    /// The address, or a `cuMemCreate` handle with bit 63 set.
    pub address: u64,
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
