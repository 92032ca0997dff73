//! The one line a `collector serve-worker` child prints: what it imported or exported, or why
//! it could not.

use crate::trace::TraceInfo;
use serde::{Deserialize, Serialize};

/// What a worker prints: one line of this.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerAnswer {
    Imported(Box<TraceInfo>),
    Exported { file_size_bytes: u64 },
    Error(String),
}
