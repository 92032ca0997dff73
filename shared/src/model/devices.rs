//! Devices as the source names them, and the driver's samples of their memory.

use serde::{Deserialize, Serialize};

/// A device as the source names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Device {
    /// `cuda`, `cpu`, or what the source says.
    pub kind: String,
    pub index: i32,
    /// The process's rank in a distributed job (traces merged by `shared::ranks::merge`), so that
    /// two ranks' `cuda:0` on different hosts stay two devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
}

impl Device {
    /// The kind of pinned host memory's device (`CachingHostAllocator`, in snapshots of torch
    /// 2.14+ recorded with `record_pinned_host_memory=True`).
    pub const PINNED_HOST: &'static str = "pinned host";

    /// Pinned host memory: its totals are its own, never added to a GPU's.
    pub fn is_pinned_host(&self) -> bool {
        self.kind == Self::PINNED_HOST
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.index < 0 {
            write!(f, "{}", self.kind)?;
        } else {
            write!(f, "{}:{}", self.kind, self.index)?;
        }
        match self.rank {
            Some(r) => write!(f, " (rank {r})"),
            None => Ok(()),
        }
    }
}

/// The driver's view of a device's memory at one moment (`cuMemGetInfo`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSample {
    pub ts_ns: u64,
    /// Index into `Trace::devices`.
    pub device: u8,
    pub used_bytes: u64,
    pub total_bytes: u64,
}
