//! Messages between the page and the worker (`src/bin/worker.rs`).
//!
//! The page sends plain JS objects (`{kind: "open_file", file, memory_budget}`, the budget in
//! bytes the worker may hold once the file is open; `{kind: "open_files", files,
//! allow_disjoint}`, `{kind: "open_url", url}`, `{kind: "compare_file", file}`, `{kind:
//! "request", id, body}`), because a `File` cannot travel as JSON. With a file or URL comes
//! `widths`: the pixel widths of the timeline, active memory and fragmentation charts, for
//! [`ToPage::Loaded`]'s first answers. The worker answers with
//! [`ToPage`] as a JSON string.

use serde::{Deserialize, Serialize};
use shared::analysis::diff::TraceDiff;
use shared::explore::{Overview, Request, Response};

/// The largest file a page opens itself. What a snapshot needs in the worker depends on its
/// entries more than its bytes (measured: a 3.08 GB one of 15.4 M entries, with a real
/// `stacks="all"` recording's structure, 1.51 GiB; a 1.46 GB one of 19.2 M entries with short
/// stacks, 1.91 GiB), and wasm32 gives the worker [`WORKER_MEMORY_BYTES`] at most: files
/// under this limit that would not fit are stopped while read (`worker.rs`, `check_memory`).
pub const PAGE_FILE_LIMIT_BYTES: f64 = 4e9;

/// The most memory a worker's wasm can have: wasm32 addresses 4 GiB.
pub const WORKER_MEMORY_BYTES: u64 = 4 << 30;

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
        /// The answers to the requests the report asks first (the charts' full windows at the
        /// widths the page gave with the file), so that it draws without waiting on the worker.
        #[serde(default)]
        first: Vec<(Request, Response)>,
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

/// The requests the charts make, built in one place: by the views, and by the worker for a
/// report's first requests ([`ToPage::Loaded`]'s `first`, matched by their JSON), so both
/// build the same ones.
pub mod requests {
    use shared::explore::{Overview, Request};

    /// How many allocations the Active Memory Timeline draws one by one at first.
    pub const ACTIVE_DETAIL: usize = 2000;

    /// A report's whole time window.
    pub fn full_window(o: &Overview) -> (f64, f64) {
        (0.0, o.duration_s.max(1e-9))
    }

    /// The timeline over `window` on a canvas `width` pixels wide.
    pub fn timeline(window: (f64, f64), width: u32) -> Request {
        Request::Timeline { start_s: window.0, end_s: window.1, buckets: width.max(200) as usize }
    }

    /// The Active Memory Timeline over `window` on a canvas `width` pixels wide (less its axis).
    pub fn active(window: (f64, f64), width: u32, detail: usize) -> Request {
        Request::Active { start_s: window.0, end_s: window.1, columns: (width as usize).saturating_sub(90).max(100), detail }
    }

    /// Whether a report of `o` draws the fragmentation chart: only where memory was reserved
    /// (a CPU trace reserves nothing: its chart would be a flat 0 %).
    pub fn draws_fragmentation(o: &Overview) -> bool {
        o.summary.total_events > 0 && o.summary.peak_reserved_bytes > 0
    }

    /// The fragmentation chart's timeline (the whole trace) on a canvas `width` pixels wide.
    pub fn fragmentation(window: (f64, f64), width: u32) -> Request {
        Request::Timeline { start_s: window.0, end_s: window.1, buckets: width as usize }
    }

    /// The allocator's segments at `t_s` (the Segments view starts at the peak's time).
    pub fn segments(t_s: f64) -> Request {
        Request::Segments { t_s }
    }
}
