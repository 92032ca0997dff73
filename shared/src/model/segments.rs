//! The caching allocator's state: segments, their blocks, and memory pools' ids.

use serde::{Deserialize, Serialize};

/// State of one allocator block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    Allocated,
    Free,
    /// Freed by the program, not yet reusable: its free waits for work on other streams
    /// (PyTorch's `active_pending_free`). Not counted as allocated; takes its space.
    PendingFree,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockInfo {
    pub address: u64,
    pub size_bytes: u64,
    pub state: BlockState,
}

/// A segment of the caching allocator and its blocks, in address order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentInfo {
    pub address: u64,
    pub size_bytes: u64,
    /// Index into [`Trace::devices`](super::Trace::devices).
    pub device: u8,
    pub stream: u16,
    /// `small` (2 MiB segments for requests ≤ 1 MiB) or `large`.
    pub pool: Pool,
    pub blocks: Vec<BlockInfo>,
    /// The private memory pool that owns the segment (index into
    /// [`Trace::pools`](super::Trace::pools)); `None` for the device's default pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_pool: Option<u16>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pool {
    Small,
    Large,
}

/// A memory pool's id as PyTorch gives it (`MempoolId_t`): `(0, 0)` is a device's default
/// pool; CUDA graph captures and `torch.cuda.MemPool`s own private ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PoolId(pub i64, pub i64);

impl std::fmt::Display for PoolId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "({}, {})", self.0, self.1)
    }
}
