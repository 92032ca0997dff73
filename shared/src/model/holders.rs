//! Who held each allocation and when ([`EventHolder`], by [`HolderKind`]).

use super::StrId;
use serde::{Deserialize, Serialize};

/// What keeps an allocation alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HolderKind {
    /// A module's parameter.
    Parameter,
    /// A module's buffer (batch norm's running statistics, ...).
    Buffer,
    /// A parameter's `.grad`.
    Gradient,
    /// An optimizer's state of a parameter (`exp_avg`, `momentum_buffer`, ...).
    OptimizerState,
    /// Saved by an autograd node for backward.
    SavedForBackward,
    /// Freed by the program, not yet reusable: another stream still uses it (`record_stream`).
    PendingFree,
    /// Reserved by the caching allocator, allocated to nothing; or allocated and kept by a
    /// library for its next call (a cuBLAS handle's workspace), which no tensor holds.
    Cache,
    /// Referenced by a Python variable or attribute.
    Python,
    /// Made by an operator of the forward, backward or optimizer step under way and taken by
    /// no holder yet: a gradient autograd passes from one node to the next, an operator's
    /// temporary (an optimizer's foreach buffers). Named by the operator that made it, from the
    /// capture's records (never sent by the capture as a holder of its own).
    Temporary,
    /// No holder recorded or inferred.
    Unknown,
}

impl HolderKind {
    pub const ALL: [HolderKind; 10] = [
        HolderKind::Parameter,
        HolderKind::Buffer,
        HolderKind::Gradient,
        HolderKind::OptimizerState,
        HolderKind::SavedForBackward,
        HolderKind::PendingFree,
        HolderKind::Cache,
        HolderKind::Python,
        HolderKind::Temporary,
        HolderKind::Unknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            HolderKind::Parameter => "parameter",
            HolderKind::Buffer => "buffer",
            HolderKind::Gradient => "gradient",
            HolderKind::OptimizerState => "optimizer_state",
            HolderKind::SavedForBackward => "saved_for_backward",
            HolderKind::PendingFree => "pending_free",
            HolderKind::Cache => "cache",
            HolderKind::Python => "python",
            HolderKind::Temporary => "temporary",
            HolderKind::Unknown => "unknown",
        }
    }

    /// The kind a capture's code names (`record`'s `HOLDER_*`): 1 parameter to 7 python.
    pub fn from_code(code: u8) -> Option<HolderKind> {
        Some(match code {
            1 => HolderKind::Parameter,
            2 => HolderKind::Buffer,
            3 => HolderKind::Gradient,
            4 => HolderKind::OptimizerState,
            5 => HolderKind::SavedForBackward,
            6 => HolderKind::PendingFree,
            7 => HolderKind::Python,
            8 => HolderKind::Cache,
            _ => return None,
        })
    }

    /// Which of two holders of one block names it: the one that outlives the step (a
    /// parameter over the Python variable that also points at it).
    pub fn rank(self) -> u8 {
        match self {
            HolderKind::Parameter => 0,
            HolderKind::Buffer => 1,
            HolderKind::OptimizerState => 2,
            HolderKind::Gradient => 3,
            HolderKind::SavedForBackward => 4,
            HolderKind::Python => 5,
            HolderKind::PendingFree => 6,
            HolderKind::Cache => 7,
            HolderKind::Temporary => 8,
            HolderKind::Unknown => 9,
        }
    }
}

/// One holder of one allocation, from when it took the block until it let go of it (or the
/// block was freed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventHolder {
    /// The `Alloc` event of the block.
    pub event: u32,
    pub kind: HolderKind,
    /// The parameter or buffer (`weight`), the optimizer's state key (`exp_avg`), the operator
    /// that saved it (`aten::convolution`), the Python variable (`trainer.last_batch`).
    pub name: StrId,
    /// The module path: of the parameter (also for its gradient and optimizer state), of the
    /// forward that saved it.
    pub module: StrId,
    /// When it took the block, on the trace's clock.
    pub taken_ns: u64,
    /// When it let go, if before the block's free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_ns: Option<u64>,
}
