//! Named stretches and moments of a run: layer scopes (module paths), iterations, marks.

use super::{Phase, StrId};
use serde::{Deserialize, Serialize};

/// The layer scope the collector creates the input batch in; analyses tell data from weights
/// by it.
pub const INPUT_LAYER: &str = "input";

/// A named scope: a module path such as `layer1.0.conv1`, `optimizer.step`, an iteration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerScope {
    pub name: StrId,
    pub start_ns: u64,
    pub end_ns: u64,
    /// Nesting depth, 0 for outermost.
    pub depth: u16,
    pub phase: Phase,
    pub thread: u64,
}

/// One iteration of the traced loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IterationSpan {
    pub index: u32,
    pub start_ns: u64,
    pub end_ns: u64,
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
