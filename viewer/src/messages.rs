//! Messages between the page and the worker (`src/bin/worker.rs`), one enum per direction:
//! [`ToWorker`] (open a file, files, a URL or bytes; compare with a file; answer a request)
//! and [`ToPage`] (ready, progress, loaded, a prefetched answer, failed, compared, an answer,
//! the warm-up). Each
//! converts to and from the JS value posted in one place here: a [`ToWorker`] is a plain JS
//! object, because a `File` cannot travel as JSON; a [`ToPage`] is JSON text.

use serde::{Deserialize, Serialize};
use shared::analysis::diff::TraceDiff;
use shared::explore::{Overview, Request, Response};
use wasm_bindgen::{JsCast, JsValue};

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
        /// The first screen's answers (the timeline's full window at the width the page gave
        /// with the file), made before this message, as `(its request's key, the JSON of its
        /// Response)`: the chart is drawn in the task that builds the report, and painted in its
        /// first frame. (Sent after it, the answer reached a page that had laid out and painted
        /// the report without it: a frame more before the timeline showed.)
        #[serde(default)]
        answered: Vec<(requests::Key, String)>,
        /// The keys of the other requests the report asks first (the charts below the first
        /// screen), each answered in a [`ToPage::Prefetched`] once the page says the first
        /// screen is painted ([`ToWorker::FirstScreenShown`]), so that making them does not take
        /// a core from the page's first paint. The page waits for these answers instead of
        /// asking.
        #[serde(default)]
        coming: Vec<requests::Key>,
        /// When each stage of opening began, milliseconds since the epoch on the worker's
        /// clock, for the benchmark's breakdown (`crate::perf::worker_stages`).
        #[serde(default)]
        stages: Vec<(String, f64)>,
        /// Milliseconds of those the worker spent reading the file.
        #[serde(default)]
        read_ms: f64,
    },
    /// The answer to one of [`ToPage::Loaded`]'s `coming` requests, as the JSON of its
    /// [`Response`]: the page reads it when a view asks for it ([`read_answer`]), so reading an
    /// answer for a view below the first screen (a 0.47 MB snapshot's Active Memory answer is
    /// 140 KB) does not hold up the first screen's paint.
    Prefetched {
        key: requests::Key,
        response: String,
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

impl ToPage {
    /// The message as the worker posts it: JSON text.
    pub fn to_js(&self) -> JsValue {
        let text = serde_json::to_string(self).unwrap_or_else(|e| {
            let failed = ToPage::Failed {
                file_name: String::new(),
                message: format!("the worker's message is unwritable: {e}"),
                merge_anyway: false,
            };
            serde_json::to_string(&failed).unwrap_or_default()
        });
        JsValue::from_str(&text)
    }

    /// The message in the text the worker posted.
    pub fn from_text(text: &str) -> Result<ToPage, String> {
        serde_json::from_str(text).map_err(|e| format!("unreadable message from the worker: {e}"))
    }
}

/// A [`ToPage::Prefetched`] answer read; one that does not read is an error answer saying so.
pub fn read_answer(json: &str) -> Response {
    serde_json::from_str(json).unwrap_or_else(|e| Response::Error { message: format!("unreadable answer from the worker: {e}") })
}

/// Pixel widths of the charts whose first requests depend on them ([`ToPage::Loaded`]'s
/// `coming`), as the page's warm-up report laid them out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChartWidths {
    pub timeline: u32,
    pub active: u32,
    pub fragmentation: u32,
    pub pools: u32,
}

/// What the page tells the worker.
#[derive(Clone, Debug)]
pub enum ToWorker {
    /// Open a local file, holding at most `memory_budget_bytes` once it is open; answer the
    /// report's first requests for charts `widths` wide. With a `ring`, the page reads the file
    /// into it ([`crate::ring`]) and the worker takes its bytes from there; without, the worker
    /// reads the file itself.
    OpenFile { file: web_sys::File, memory_budget_bytes: f64, widths: Option<ChartWidths>, ring: Option<crate::ring::Ring> },
    /// Merge files, the ranks of one job; `allow_disjoint`: although recorded far apart.
    OpenFiles { files: Vec<web_sys::File>, allow_disjoint: bool },
    /// Download and open a trace.
    OpenUrl { url: String },
    /// Open bytes the page has (a single-file report's trace).
    OpenBytes { name: String, bytes: js_sys::Uint8Array },
    /// Compare the open trace with a file.
    CompareFile { file: web_sys::File },
    /// Answer `request` with [`ToPage::Answer`] of the same `id`.
    Request { id: u32, request: Request },
    /// The report's first screen is painted (or its views below are built without it): send
    /// the rest of [`ToPage::Loaded`]'s `coming` answers.
    FirstScreenShown,
}

/// A message the worker cannot read: why, and the id of the request it was (to answer with
/// the error), if it was one.
#[derive(Clone, Debug, PartialEq)]
pub struct Unreadable {
    pub request_id: Option<u32>,
    pub message: String,
}

/// `obj[name]`, undefined where it is missing.
fn field(obj: &JsValue, name: &str) -> JsValue {
    js_sys::Reflect::get(obj, &JsValue::from_str(name)).unwrap_or(JsValue::UNDEFINED)
}

/// A plain JS object of these fields.
fn object(pairs: &[(&str, JsValue)]) -> JsValue {
    let o = js_sys::Object::new();
    for (k, v) in pairs {
        let _ = js_sys::Reflect::set(&o, &JsValue::from_str(k), v);
    }
    o.into()
}

impl ChartWidths {
    fn to_js(self) -> JsValue {
        object(&[
            ("timeline", self.timeline.into()),
            ("active", self.active.into()),
            ("fragmentation", self.fragmentation.into()),
            ("pools", self.pools.into()),
        ])
    }

    /// The widths in `value`, when each is a plausible canvas width.
    fn from_js(value: &JsValue) -> Option<ChartWidths> {
        let px = |name: &str| field(value, name).as_f64().filter(|v| *v >= 1.0 && *v <= 20_000.0).map(|v| v as u32);
        Some(ChartWidths { timeline: px("timeline")?, active: px("active")?, fragmentation: px("fragmentation")?, pools: px("pools")? })
    }
}

impl ToWorker {
    /// The message as the page posts it: `{kind: "open_file", file, memory_budget, widths,
    /// ring_data, ring_control}` (the ring's fields where there is one),
    /// `{kind: "open_files", files, allow_disjoint}`, `{kind: "open_url", url}`, `{kind:
    /// "open_bytes", name, bytes}`, `{kind: "compare_file", file}`, `{kind: "request", id, body}`
    /// (the request as JSON), `{kind: "first_screen_shown"}`.
    pub fn to_js(&self) -> JsValue {
        match self {
            ToWorker::OpenFile { file, memory_budget_bytes, widths, ring } => {
                let mut fields =
                    vec![("kind", "open_file".into()), ("file", file.into()), ("memory_budget", (*memory_budget_bytes).into())];
                fields.extend(widths.map(|w| ("widths", w.to_js())));
                if let Some(ring) = ring {
                    fields.extend([("ring_data", ring.data.clone().into()), ("ring_control", ring.control.clone().into())]);
                }
                object(&fields)
            }
            ToWorker::OpenFiles { files, allow_disjoint } => {
                let array: js_sys::Array = files.iter().collect();
                object(&[("kind", "open_files".into()), ("files", array.into()), ("allow_disjoint", (*allow_disjoint).into())])
            }
            ToWorker::OpenUrl { url } => object(&[("kind", "open_url".into()), ("url", url.into())]),
            ToWorker::OpenBytes { name, bytes } => object(&[("kind", "open_bytes".into()), ("name", name.into()), ("bytes", bytes.into())]),
            ToWorker::CompareFile { file } => object(&[("kind", "compare_file".into()), ("file", file.into())]),
            ToWorker::Request { id, request } => {
                let body = serde_json::to_string(request).unwrap_or_default();
                object(&[("kind", "request".into()), ("id", (*id).into()), ("body", body.into())])
            }
            ToWorker::FirstScreenShown => object(&[("kind", "first_screen_shown".into())]),
        }
    }

    /// The message in what the page posted. A budget that is missing or not above 0 is
    /// [`WORKER_MEMORY_BYTES`]; widths that are missing or implausible are none.
    pub fn from_js(data: &JsValue) -> Result<ToWorker, Unreadable> {
        let unreadable = |message: String| Unreadable { request_id: None, message };
        let file = |name: &str| field(data, name).dyn_into::<web_sys::File>().map_err(|_| unreadable(format!("`{name}` is not a file")));
        let kind = field(data, "kind").as_string().unwrap_or_default();
        Ok(match kind.as_str() {
            "open_file" => ToWorker::OpenFile {
                file: file("file")?,
                memory_budget_bytes: field(data, "memory_budget").as_f64().filter(|b| *b > 0.0).unwrap_or(WORKER_MEMORY_BYTES as f64),
                widths: ChartWidths::from_js(&field(data, "widths")),
                ring: crate::ring::Ring::from_parts(field(data, "ring_data"), field(data, "ring_control")),
            },
            "open_files" => {
                let files = field(data, "files").dyn_into::<js_sys::Array>().map(|a| a.iter().filter_map(|f| f.dyn_into().ok()).collect());
                ToWorker::OpenFiles { files: files.unwrap_or_default(), allow_disjoint: field(data, "allow_disjoint").is_truthy() }
            }
            "open_url" => ToWorker::OpenUrl { url: field(data, "url").as_string().ok_or_else(|| unreadable("`url` is not text".into()))? },
            "open_bytes" => ToWorker::OpenBytes {
                name: field(data, "name").as_string().unwrap_or_else(|| "trace".into()),
                bytes: field(data, "bytes").dyn_into().map_err(|_| unreadable("`bytes` is not a Uint8Array".into()))?,
            },
            "compare_file" => ToWorker::CompareFile { file: file("file")? },
            "request" => {
                let id = field(data, "id").as_f64().ok_or_else(|| unreadable("a request without an id".into()))? as u32;
                let body = field(data, "body").as_string().unwrap_or_default();
                let request = serde_json::from_str(&body).map_err(|e| Unreadable { request_id: Some(id), message: e.to_string() })?;
                ToWorker::Request { id, request }
            }
            "first_screen_shown" => ToWorker::FirstScreenShown,
            other => return Err(unreadable(format!("unknown message kind `{other}`"))),
        })
    }
}

/// The requests the charts make, built in one place: by the views, and by the worker for a
/// report's first requests ([`ToPage::Loaded`]'s `coming`, looked up by their [`Key`]), so both
/// build the same ones.
pub mod requests {
    use shared::explore::{Overview, Request};

    /// A request the worker answers first, as the page looks its answer up: by kind and fields,
    /// times by their bits (the same function with the same inputs built both). Requests of
    /// other kinds have no key (a kind added to the first answers needs one here).
    ///
    /// The messages name these, not the requests: the page never reads a [`Request`] otherwise,
    /// and the first message that did ran its deserialiser (large: every kind of request) cold,
    /// 5-20 ms of the first screen of a 0.47 MB snapshot.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
    #[serde(rename_all = "snake_case")]
    pub enum Key {
        Timeline { start_bits: u64, end_bits: u64, buckets: usize },
        Active { start_bits: u64, end_bits: u64, columns: usize },
        Segments { t_bits: u64 },
        Pools { buckets: usize },
        Flame { all_frames: bool },
    }

    impl Key {
        /// The kind of its request as the request's JSON names it, for the timing marks.
        pub fn kind(self) -> &'static str {
            match self {
                Key::Timeline { .. } => "timeline",
                Key::Active { .. } => "active",
                Key::Segments { .. } => "segments",
                Key::Pools { .. } => "pools",
                Key::Flame { .. } => "flame",
            }
        }

        pub fn of(request: &Request) -> Option<Key> {
            Some(match *request {
                Request::Timeline { start_s, end_s, buckets } => {
                    Key::Timeline { start_bits: start_s.to_bits(), end_bits: end_s.to_bits(), buckets }
                }
                Request::Active { start_s, end_s, columns } => {
                    Key::Active { start_bits: start_s.to_bits(), end_bits: end_s.to_bits(), columns }
                }
                Request::Segments { t_s } => Key::Segments { t_bits: t_s.to_bits() },
                Request::Pools { buckets } => Key::Pools { buckets },
                Request::Flame { all_frames } => Key::Flame { all_frames },
                Request::At { .. }
                | Request::Allocations { .. }
                | Request::Export { .. }
                | Request::RankCurves { .. }
                | Request::ShowRank { .. }
                | Request::DiffDevices { .. }
                | Request::Advice { .. }
                | Request::Allocation { .. }
                | Request::Find { .. }
                | Request::SimulatedSegments { .. }
                | Request::Holders { .. } => return None,
            })
        }
    }

    /// A request's kind as its JSON names it, for the timing marks.
    pub fn kind(request: &Request) -> &'static str {
        match request {
            Request::Timeline { .. } => "timeline",
            Request::At { .. } => "at",
            Request::Allocations { .. } => "allocations",
            Request::Segments { .. } => "segments",
            Request::Export { .. } => "export",
            Request::RankCurves { .. } => "rank_curves",
            Request::ShowRank { .. } => "show_rank",
            Request::DiffDevices { .. } => "diff_devices",
            Request::Advice { .. } => "advice",
            Request::Active { .. } => "active",
            Request::Allocation { .. } => "allocation",
            Request::Pools { .. } => "pools",
            Request::Find { .. } => "find",
            Request::SimulatedSegments { .. } => "simulated_segments",
            Request::Holders { .. } => "holders",
            Request::Flame { .. } => "flame",
        }
    }

    /// A report's whole time window.
    pub fn full_window(o: &Overview) -> (f64, f64) {
        (0.0, o.duration_s.max(1e-9))
    }

    /// The timeline over `window` on a canvas `width` pixels wide.
    pub fn timeline(window: (f64, f64), width: u32) -> Request {
        Request::Timeline { start_s: window.0, end_s: window.1, buckets: width.max(200) as usize }
    }

    /// The Active Memory Timeline over `window` on a canvas `width` pixels wide (less its axis).
    pub fn active(window: (f64, f64), width: u32) -> Request {
        Request::Active { start_s: window.0, end_s: window.1, columns: (width as usize).saturating_sub(90).max(100) }
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

    /// The Pools view's curves on a canvas `width` pixels wide.
    pub fn pools(width: u32) -> Request {
        Request::Pools { buckets: width.max(200) as usize }
    }

    /// The allocator's segments at `t_s` (the Segments view starts at the peak's time).
    pub fn segments(t_s: f64) -> Request {
        Request::Segments { t_s }
    }

    /// The allocator's segments at `t_s` replayed under the setting `alloc_conf`.
    pub fn simulated_segments(t_s: f64, alloc_conf: &str) -> Request {
        Request::SimulatedSegments { t_s, alloc_conf: alloc_conf.trim().to_owned() }
    }
}
