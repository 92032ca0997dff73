//! The viewer's questions and their answers, computed next to the trace.
//!
//! The viewer keeps a [`Session`] (the imported trace and its one-off analyses) in a Web Worker
//! and asks it [`Request`]s as the user zooms, hovers and clicks; the answers are small and
//! serialisable. Keeping this here, and not in the viewer, lets native tests check exactly what
//! the page shows.
//!
//! Several files opened together are the ranks of one job ([`Session::open_ranks`]): they are
//! merged into one trace ([`crate::merge`]), and the page may show any one rank in every view
//! ([`Request::ShowRank`]) or compare two ranks ([`Request::DiffDevices`]). Any trace can be
//! compared with another file ([`Session::compare_with`]).
//!
//! Files: `opening.rs` (opening files and ranks, the overview), `moments.rs` (the timeline, the
//! bands and what is live at a moment); this one the messages and [`Session::answer`].

mod moments;
mod opening;

pub use moments::*;
pub use opening::*;

use crate::analysis::diff::{diff, diff_devices, TraceDiff};
use crate::analysis::flame::{flame_graph, innermost_ops, FlameGraph};
use crate::analysis::iterations::is_iteration_scope;
use crate::analysis::profile::{graph_profile, GraphProfile};
use crate::analysis::sweep::{read_sweep, RankPoint, SWEEP_FORMAT};
use crate::analysis::timeline_index::TimelineIndex;
use crate::analysis::{self, FragmentationStats, LayerMemoryStats, Summary, TimelineOptions, TimelinePoint};
use crate::merge::{merge_with, rank_trace, MergeError, MergeInput, MergeOptions};
use crate::model::{EventType, Phase, SegmentInfo, StrId, Trace};
use serde::{Deserialize, Serialize};

/// Subtrees of the flame graph below this share of the root (in both weights) are left out.
pub const FLAME_MIN_SHARE: f64 = 1e-4;

/// What the page asks.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Request {
    /// The timeline decimated to `buckets` points over a window.
    Timeline { start_s: f64, end_s: f64, buckets: usize },
    /// Totals, layer and operator at a moment (hover).
    At { t_s: f64 },
    /// The largest allocations live at a moment (click), with lifetimes and stacks.
    Allocations { t_s: f64, limit: usize },
    /// The allocator's segments at a moment (snapshots).
    Segments { t_s: f64 },
    /// The trace in another format, as text.
    Export { format: String },
    /// One allocated-memory curve per rank's device over the whole merged trace, all on the
    /// same time axis.
    RankCurves { buckets: usize },
    /// Show one rank in every view (its own trace, [`crate::merge::rank_trace`]), or every
    /// rank again (`None`): answered with the new [`Overview`].
    ShowRank { rank: Option<u32> },
    /// Compare two devices of the whole trace (indices into its devices), e.g. two ranks.
    DiffDevices { a: u8, b: u8 },
    /// What to change so the shown trace needs less memory, under a budget when given.
    Advice { budget_bytes: Option<u64> },
    /// The Active Memory Timeline of a window: `detail` largest allocations as bands over
    /// `columns` pixel columns.
    Active { start_s: f64, end_s: f64, columns: usize, detail: usize },
    /// One allocation (an allocation event's index) with its lifetime and stack: answered as
    /// `Allocations` with it alone.
    Allocation { event_index: usize },
    /// Allocated and reserved memory per (device, pool, stream) over the whole trace.
    Pools { buckets: usize },
    /// Allocations by address, stack frame, module path or note text
    /// ([`analysis::search::find`]).
    Find { query: String, limit: usize },
    /// The allocator's segments at a moment as PyTorch's caching allocator would have had them
    /// under `alloc_conf` (a `PYTORCH_CUDA_ALLOC_CONF` string on top of the run's own
    /// settings; empty: the run's own), replayed by [`crate::whatif::segments_after`].
    SimulatedSegments { t_s: f64, alloc_conf: String },
    /// Who holds the live bytes at a moment ([`analysis::holders::why`]).
    Holders { t_s: f64 },
}

/// The answers, one per [`Request`] kind.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Response {
    /// `points` in columns ([`analysis::timeline_columns`]).
    Timeline {
        start_s: f64,
        end_s: f64,
        #[serde(with = "analysis::timeline_columns")]
        points: Vec<TimelinePoint>,
        driver: Vec<(f64, u64)>,
    },
    At(Moment),
    Allocations {
        t_s: f64,
        allocations: Vec<Allocation>,
    },
    Segments {
        t_s: f64,
        event_index: Option<usize>,
        segments: Vec<SegmentInfo>,
    },
    Export {
        file_name: String,
        mime: String,
        text: String,
    },
    RankCurves {
        end_s: f64,
        curves: Vec<RankCurve>,
    },
    Pools {
        end_s: f64,
        curves: Vec<analysis::pools::PoolCurve>,
    },
    /// The answer to [`Request::SimulatedSegments`]: the segments, or why there are none
    /// (`error`: a setting that does not parse, or a device the allocator model does not hold).
    SimulatedSegments {
        t_s: f64,
        alloc_conf: String,
        event_index: Option<usize>,
        segments: Vec<SegmentInfo>,
        error: Option<String>,
    },
    Found(Box<analysis::search::FindResult>),
    Overview(Box<Overview>),
    Diff(Box<TraceDiff>),
    Advice(Box<analysis::advice::AdviceReport>),
    Active(Box<analysis::active::ActiveTimeline>),
    Holders(Box<analysis::holders::Why>),
    Error {
        message: String,
    },
}

/// An imported trace with the analyses computed once.
pub struct Session {
    /// What was opened: one trace, or the ranks of a job merged into one.
    whole: Trace,
    /// The rank shown instead of the whole trace, as a trace of its own.
    rank: Option<(u32, Trace)>,
    /// The shown trace's peak device, and its innermost operator at each event.
    device: u8,
    ops_at_event: Vec<StrId>,
    file_name: String,
    file_bytes: u64,
    /// Exported files are named `<stem>.<extension>`.
    export_stem: String,
    /// The shown trace's timeline at every resolution, so that a window of any width costs
    /// what it draws.
    index: Option<TimelineIndex>,
    /// The shown device's allocations paired with their frees, made on the first Active
    /// Memory Timeline request.
    pairs: Option<analysis::active::Pairs>,
    /// Every allocation's category, in event order.
    categories: Vec<analysis::categories::Categorized>,
    /// The shown trace's allocator requests, extracted on the first simulated segment map.
    whatif: Option<crate::whatif::Requests>,
}

impl Session {
    /// The trace every view shows: the whole trace, or the rank picked.
    pub fn trace(&self) -> &Trace {
        self.rank.as_ref().map_or(&self.whole, |(_, t)| t)
    }

    /// What the page calls the trace shown: the file name(s), and the rank picked.
    pub fn name(&self) -> String {
        match &self.rank {
            Some((r, _)) => format!("{} · rank {r}", self.file_name),
            None => self.file_name.clone(),
        }
    }

    /// Compares the trace shown (A) with the trace in `bytes` (B), each on its peak device.
    pub fn compare_with(&self, file_name: &str, bytes: &[u8]) -> Result<TraceDiff, String> {
        if looks_like_sweep(bytes) {
            return Err(format!("{file_name} is a batch sweep (curves only); expected a trace to compare with"));
        }
        let other = crate::import(bytes, &crate::ImportOptions::default()).map_err(|e| e.to_string())?;
        Ok(diff(self.trace(), &other))
    }

    /// Answers one request.
    pub fn answer(&mut self, request: &Request) -> Response {
        match request {
            Request::Timeline { start_s, end_s, buckets } => self.timeline(*start_s, *end_s, *buckets),
            Request::At { t_s } => Response::At(self.moment(*t_s)),
            Request::Allocations { t_s, limit } => Response::Allocations { t_s: *t_s, allocations: self.allocations(*t_s, *limit) },
            Request::Segments { t_s } => {
                let idx = self.event_at(*t_s);
                let segments = match idx {
                    Some(i) => analysis::segments_at(self.trace(), i, self.device),
                    None => analysis::segments_before_events(self.trace(), self.device),
                };
                Response::Segments { t_s: *t_s, event_index: idx, segments }
            }
            Request::Export { format } => self.export(format),
            Request::RankCurves { buckets } => self.rank_curves(*buckets),
            Request::ShowRank { rank } => match self.show(*rank, &mut |_| {}) {
                Ok(overview) => Response::Overview(Box::new(overview)),
                Err(message) => Response::Error { message },
            },
            Request::DiffDevices { a, b } => match diff_devices(&self.whole, Some(*a), &self.whole, Some(*b)) {
                Ok(d) => Response::Diff(Box::new(d)),
                Err(e) => Response::Error { message: e.to_string() },
            },
            Request::Active { start_s, end_s, columns, detail } => self.active(*start_s, *end_s, *columns, *detail),
            Request::Allocation { event_index } => self.allocation_at(*event_index),
            Request::Find { query, limit } => Response::Found(Box::new(analysis::search::find(self.trace(), query, (*limit).min(1000)))),
            Request::Holders { t_s } => {
                let moment = analysis::holders::Moment::Seconds(t_s.max(0.0));
                match analysis::holders::why(self.trace(), &moment, Some(self.device)) {
                    Ok(w) => Response::Holders(Box::new(w)),
                    Err(e) => Response::Error { message: e.to_string() },
                }
            }
            Request::Pools { buckets } => {
                Response::Pools { end_s: duration_s(self.trace()), curves: analysis::pools::pool_curves(self.trace(), *buckets) }
            }
            Request::Advice { budget_bytes } => {
                let opts = analysis::advice::AdviceOptions { budget_bytes: *budget_bytes, top: 10, ..Default::default() };
                Response::Advice(Box::new(analysis::advice::advise(self.trace(), &opts)))
            }
            Request::SimulatedSegments { t_s, alloc_conf } => {
                let event_index = self.event_at(*t_s);
                let (segments, error) = match self.simulated_segments(event_index, alloc_conf) {
                    Ok(s) => (s, None),
                    Err(e) => (Vec::new(), Some(e)),
                };
                Response::SimulatedSegments { t_s: *t_s, alloc_conf: alloc_conf.clone(), event_index, segments, error }
            }
        }
    }

    /// The shown device's segments after `event_index` replayed under `alloc_conf` on top of
    /// the run's own settings, with no device capacity (so no out-of-memory changes the map).
    fn simulated_segments(&mut self, event_index: Option<usize>, alloc_conf: &str) -> Result<Vec<SegmentInfo>, String> {
        use crate::whatif::{requests, segments_after, AllocConf, SimOptions};
        if self.whatif.is_none() {
            self.whatif = Some(requests(self.trace()));
        }
        let Some(reqs) = &self.whatif else { return Err("no requests".into()) };
        // Read as `collector whatif` reads it: the newest release's rules.
        let user = AllocConf::parse(alloc_conf).map_err(|e| e.to_string())?;
        let conf = reqs.own_conf.overridden_by(&user);
        let device = self.device;
        let Some(dev) = reqs.devices.iter().find(|d| d.device == device) else {
            let name = self.trace().devices.get(device as usize).map_or_else(|| format!("device {device}"), |d| d.to_string());
            return Err(format!("{name} is not a CUDA device's caching allocator: nothing to replay"));
        };
        let event = event_index.map(|i| u32::try_from(i).unwrap_or(u32::MAX));
        segments_after(dev, &conf, &SimOptions::default(), event).map_err(|e| e.to_string())
    }

    fn export(&self, format: &str) -> Response {
        let stem = match &self.rank {
            Some((r, _)) => format!("{}.rank{r}", self.export_stem),
            None => self.export_stem.clone(),
        };
        let (text, file_name, mime) = if format == "layers_csv" {
            let mut out = Vec::new();
            let r = crate::export::csv::write_layer_stats(self.trace(), &mut out);
            (r.map(|_| out), format!("{stem}.layers.csv"), "text/csv")
        } else {
            let Some(f) = crate::export::ExportFormat::from_name(format) else {
                return Response::Error {
                    message: format!("unknown export format {format:?}: expected speedscope, timeline, chrome, csv, native or layers_csv"),
                };
            };
            if f == crate::export::ExportFormat::Dftracer {
                // Answers carry text; a gzip file is not.
                return Response::Error {
                    message: "DFTracer .pfw.gz is binary: export it with `collector convert TRACE -o run.pfw.gz` or the server's /api/trace/export".into(),
                };
            }
            let mut out = Vec::new();
            let r = crate::export::export(self.trace(), f, &mut out);
            let mime = if f == crate::export::ExportFormat::Csv { "text/csv" } else { "application/json" };
            (r.map(|_| out), format!("{stem}.{}", f.extension()), mime)
        };
        match text {
            Ok(bytes) => Response::Export { file_name, mime: mime.into(), text: String::from_utf8_lossy(&bytes).into_owned() },
            Err(e) => Response::Error { message: e.to_string() },
        }
    }
}

/// Seconds from the trace's start to its last event.
pub(super) fn duration_s(trace: &Trace) -> f64 {
    trace.events.ts_ns.last().map_or(0.0, |&t| t.saturating_sub(trace.start_ns()) as f64 * 1e-9)
}
