//! What events carry besides memory, as lists sorted by event: holders ([`EventHolder`]), private
//! pools, notes; and the trace's marks, iteration spans and device samples.

use super::*;

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
    /// No holder recorded or inferred.
    Unknown,
}

impl HolderKind {
    pub const ALL: [HolderKind; 9] = [
        HolderKind::Parameter,
        HolderKind::Buffer,
        HolderKind::Gradient,
        HolderKind::OptimizerState,
        HolderKind::SavedForBackward,
        HolderKind::PendingFree,
        HolderKind::Cache,
        HolderKind::Python,
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
            HolderKind::Unknown => 8,
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

/// The value a list sorted by event index gives event `i`.
pub(super) fn of_event<T: Copy>(list: &[(u32, T)], i: usize) -> Option<T> {
    list.binary_search_by_key(&(i as u32), |&(e, _)| e).ok().map(|k| list[k].1)
}

/// The value a list sorted by event index ([`Trace::event_pools`], [`Trace::event_requested`])
/// gives each of `events` events, in event order.
pub fn per_event<T: Copy>(list: &[(u32, T)], events: usize) -> impl Iterator<Item = Option<T>> + '_ {
    let mut listed = list.iter().peekable();
    (0..events).map(move |i| {
        let mut value = None;
        while let Some(&&(e, v)) = listed.peek() {
            if e as usize > i {
                break;
            }
            if e as usize == i {
                value = Some(v);
            }
            listed.next();
        }
        value
    })
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

/// What kind of text an [`EventNote`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoteKind {
    /// The thread's metadata when the event happened (`torch.cuda.memory._set_memory_metadata`):
    /// text, or compact JSON text when a dict was set.
    UserMetadata,
    /// Attached later to the live allocation the event made
    /// (`torch.cuda.memory._annotate_tensor`), at `ts_ns`, from the stack `stack`.
    Annotation,
    /// A tag of the allocator's own (`internal_metadata`, e.g. `mallocWithAddress`).
    Internal,
}

/// Text attached to one event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventNote {
    /// Index of the event: for an annotation, the allocation it names.
    pub event: u32,
    pub kind: NoteKind,
    pub text: StrId,
    /// When the text was attached (the event's own time, or the annotation's).
    pub ts_ns: u64,
    /// The annotating call's stack (index into [`StackTable::stacks`]), for annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<u32>,
}

/// A named moment of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    pub ts_ns: u64,
    pub name: StrId,
    /// The program's value for it (a counter unless it gave one).
    pub value: i64,
    /// The rank that marked it, in a merged trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
}

/// One iteration of the traced loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IterationSpan {
    pub index: u32,
    pub start_ns: u64,
    pub end_ns: u64,
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
