//! Messages between the page and the worker (`src/bin/worker.rs`).
//!
//! The page sends plain JS objects (`{kind: "open_file", file}`, `{kind: "open_files", files,
//! allow_disjoint}`, `{kind: "open_url", url}`, `{kind: "compare_file", file}`, `{kind:
//! "request", id, body}`), because a `File` cannot travel as JSON. The worker answers with
//! [`ToPage`] as a JSON string.

use serde::{Deserialize, Serialize};
use shared::analysis::diff::TraceDiff;
use shared::explore::{Overview, Response};

/// What the worker tells the page.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ToPage {
    /// The worker's wasm is running; messages sent before this are lost.
    Ready,
    /// A stage of opening a file began.
    Progress {
        stage: String,
    },
    Loaded {
        overview: Box<Overview>,
        worker_memory_bytes: u64,
    },
    /// Opening (or comparing) failed; the previously loaded trace (if any) is still there.
    Failed {
        file_name: String,
        message: String,
        /// The files are ranks recorded far apart in time: they merge when asked to.
        #[serde(default)]
        merge_anyway: bool,
    },
    /// The open trace (A) compared with another file (B).
    Compared {
        a_name: String,
        b_name: String,
        diff: Box<TraceDiff>,
        worker_memory_bytes: u64,
    },
    Answer {
        id: u32,
        response: Box<Response>,
        worker_memory_bytes: u64,
    },
    /// A small real snapshot the worker opened at start, before any file is chosen, and holds
    /// until one is: the page draws its report where nobody sees it, so that the first file
    /// chosen runs compiled code (V8 first runs wasm in its baseline compiler; a file opened
    /// cold took twice as long as one opened second).
    Warmup {
        overview: Box<Overview>,
    },
}
