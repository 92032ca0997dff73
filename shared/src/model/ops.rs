//! Operator executions and the tensors they read and wrote.

use super::{Phase, StrId};
use serde::{Deserialize, Serialize};

/// A tensor an operator read or wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorRef {
    /// Storage pointer (or another stable id of the storage); 0 when the source has none.
    pub storage_id: u64,
    pub size_bytes: u64,
    /// Index into [`Trace::shapes`](super::Trace::shapes); `u32::MAX` when unknown.
    pub shape: u32,
}

/// An operator execution (forward op, autograd node, optimizer kernel ...).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OperatorEvent {
    pub name: StrId,
    pub phase: Phase,
    /// Autograd sequence number; -1 when the op has none.
    pub seq_nr: i64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub thread: u64,
    /// The forward thread of a backward node (pairs it with its forward op); 0 when unknown.
    pub fwd_thread: u64,
    /// Innermost layer scope (module path) the op ran in.
    pub layer: StrId,
    /// Range into [`Trace::tensors`](super::Trace::tensors).
    pub inputs: (u32, u32),
    /// Range into [`Trace::tensors`](super::Trace::tensors).
    pub outputs: (u32, u32),
}
