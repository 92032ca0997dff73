//! The viewer's questions and their answers, computed next to the trace.
//!
//! The viewer keeps a [`Session`] (the imported trace and its one-off analyses) in a Web Worker
//! and asks it [`Request`]s as the user zooms, hovers and clicks; the answers are small and
//! serialisable. Keeping this here, and not in the viewer, lets native tests check exactly what
//! the page shows.
//!
//! Several files opened together are the ranks of one job ([`Session::open_ranks`]): they are
//! merged into one trace ([`crate::ranks::merge`]), and the page may show any one rank in every view
//! ([`Request::ShowRank`]) or compare two ranks ([`Request::DiffDevices`]). Any trace can be
//! compared with another file ([`Session::compare_with`]).
//!
//! - `overview.rs`: what the page draws once a file opens ([`Overview`]): bands, ranks, curves.
//! - `timeline.rs`: memory over a window, at a moment, as Active Memory bands, per rank.
//! - `allocations.rs`: the live allocations at a moment, or one, with lifetimes, stacks, holders.
//! - `segments.rs`: the segment map replayed under another `PYTORCH_CUDA_ALLOC_CONF`.
//! - `export.rs`: the trace in another format, as text.
//! - `error.rs`: why a file could not be opened or a question answered.

mod allocations;
mod error;
mod export;
mod overview;
mod segments;
mod timeline;

pub use allocations::Allocation;
pub use error::{ExploreError, RanksError};
pub use overview::{Band, Curve, Overview, RankDevice, RankSet, FLAME_MIN_SHARE};
pub use timeline::{Moment, RankCurve};

use crate::analysis::diff::{diff, diff_devices, TraceDiff};
use crate::analysis::flame::innermost_ops;
use crate::analysis::sweep::{read_sweep, SWEEP_FORMAT};
use crate::analysis::timeline_index::TimelineIndex;
use crate::analysis::{self, TimelinePoint};
use crate::model::{SegmentInfo, StrId, Trace};
use crate::ranks::merge::{merge_with, InputRank, MergeInput, MergeOptions};
use crate::ranks::rank_trace;
use overview::{duration_s, overview_of, rank_set};
use serde::{Deserialize, Serialize};

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
    /// Show one rank in every view (its own trace, [`crate::ranks::rank_trace`]), or every
    /// rank again (`None`): answered with the new [`Overview`].
    ShowRank { rank: Option<u32> },
    /// Compare two devices of the whole trace (indices into its devices), e.g. two ranks.
    DiffDevices { a: u8, b: u8 },
    /// What to change so the shown trace needs less memory, under a budget when given.
    Advice { budget_bytes: Option<u64> },
    /// The Active Memory Timeline of a window: every allocation live at a column's moment as its
    /// own band over `columns` pixel columns.
    Active { start_s: f64, end_s: f64, columns: usize },
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
    /// The shown trace's memory flame graph ([`analysis::flame::flame_graph`], subtrees under
    /// [`FLAME_MIN_SHARE`] of the root left out), the runtime's frames folded unless
    /// `all_frames` ([`crate::model::is_runtime_frame`]).
    Flame {
        #[serde(default)]
        all_frames: bool,
    },
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
        /// The device ledger's sources outside PyTorch at the end of each point's bucket
        /// (`collector trace --ledger`; empty without it).
        #[serde(default)]
        ledger: analysis::ledger::LedgerBands,
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
    Flame {
        graph: Box<analysis::flame::FlameGraph>,
    },
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
    /// The shown trace's flame graph, made on the first request for it.
    /// The flame graph last asked for, with whether it folds the runtime's frames.
    flame: Option<(bool, analysis::flame::FlameGraph)>,
}

/// What a file turned out to be.
pub enum Opened {
    Trace(Box<Session>, Box<Overview>),
    /// A sweep file: curves only.
    Sweep(Box<Overview>),
}

impl Session {
    /// Imports `bytes` (any format [`crate::import`] reads, or a sweep file) and computes the
    /// overview. `progress` is told each stage as it starts.
    pub fn open(file_name: &str, bytes: &[u8], mut progress: impl FnMut(&str)) -> Result<Opened, ExploreError> {
        if looks_like_sweep(bytes) {
            let sweep = read_sweep(bytes)?;
            let curves = sweep
                .runs
                .iter()
                .filter(|r| !r.curve.is_empty())
                .map(|r| Curve { label: format!("{} batch {}", sweep.model, r.batch_size), points: r.curve.clone() })
                .collect();
            let empty = Trace::new(crate::model::TraceMeta::new(crate::model::SourceFormat::MemoryTracer));
            let (mut overview, _) = overview_of(&empty, 0, file_name, bytes.len() as u64, &mut progress);
            overview.curves = curves;
            overview.profile_error = Some("a sweep file holds curves only; open one of its traces for the other views".into());
            return Ok(Opened::Sweep(Box::new(overview)));
        }
        progress("parsing");
        let trace = crate::import(bytes, &crate::ImportOptions::default())?;
        Ok(Self::opened(trace, file_name, bytes.len() as u64, &mut progress))
    }

    /// A trace just imported from `file_name`, with its overview.
    fn opened(trace: Trace, file_name: &str, file_bytes: u64, progress: &mut impl FnMut(&str)) -> Opened {
        let stem = file_name.split('.').next().filter(|s| !s.is_empty()).unwrap_or("trace");
        Self::start(trace, file_name, file_bytes, stem, progress)
    }

    /// Like [`Session::open`], with the file read from `reader` as it is imported, so that it
    /// is never held whole; `file_bytes` is its size.
    pub fn open_reader(
        file_name: &str,
        file_bytes: u64,
        mut reader: impl std::io::Read,
        mut progress: impl FnMut(&str),
    ) -> Result<Opened, ExploreError> {
        use std::io::Read as _;
        let read_failed = |source| ExploreError::Read { file_name: file_name.to_owned(), source };
        let mut head = Vec::new();
        (&mut reader).take(512).read_to_end(&mut head).map_err(read_failed)?;
        if looks_like_sweep(&head) {
            // A sweep file is a small JSON document: read it whole.
            reader.read_to_end(&mut head).map_err(read_failed)?;
            return Self::open(file_name, &head, progress);
        }
        progress("parsing");
        let trace = crate::import::import_reader(head.as_slice().chain(reader), &crate::ImportOptions::default())?;
        Ok(Self::opened(trace, file_name, file_bytes, &mut progress))
    }

    /// Opens `files` (name, bytes), one trace per rank of a job, merged into one trace. Each
    /// file's rank is the one its process recorded, else `rank<N>` in its name, else its
    /// position ([`crate::ranks::rank_of`]), as `collector merge` does.
    pub fn open_ranks(files: &[(String, Vec<u8>)], options: &MergeOptions, mut progress: impl FnMut(&str)) -> Result<Opened, RanksError> {
        let n = files.len();
        let mut traces = Vec::with_capacity(n);
        for (k, (name, bytes)) in files.iter().enumerate() {
            progress(&format!("parsing {name} ({} of {n})", k + 1));
            let failed = |message: String| RanksError::File { file_name: name.clone(), message };
            if looks_like_sweep(bytes) {
                return Err(failed("a batch sweep holds curves, not the trace of a rank; expected one trace per rank".into()));
            }
            traces.push(crate::import(bytes, &crate::ImportOptions::default()).map_err(|e| failed(e.to_string()))?);
        }
        let ranks = crate::ranks::assign_ranks(files.iter().map(|f| f.0.as_str()).zip(&traces));
        // Through MergeInput::of, as every other merge: a merged file brings each of its ranks.
        let mut inputs = Vec::with_capacity(n);
        for ((trace, rank), (name, _)) in traces.into_iter().zip(ranks).zip(files) {
            inputs.extend(MergeInput::of(trace, name, InputRank::Given(rank))?);
        }
        progress(&format!("merging {n} ranks"));
        let merged = merge_with(inputs, options)?;
        let name = files.iter().map(|f| f.0.as_str()).collect::<Vec<_>>().join(" + ");
        let bytes = files.iter().map(|f| f.1.len() as u64).sum();
        Ok(Self::start(merged, &name, bytes, "merged", &mut progress))
    }

    fn start(whole: Trace, file_name: &str, file_bytes: u64, export_stem: &str, progress: &mut impl FnMut(&str)) -> Opened {
        let mut session = Session {
            whole,
            rank: None,
            device: 0,
            ops_at_event: Vec::new(),
            file_name: file_name.to_owned(),
            file_bytes,
            export_stem: export_stem.to_owned(),
            index: None,
            pairs: None,
            categories: Vec::new(),
            whatif: None,
            flame: None,
        };
        let overview = session.overview(progress);
        Opened::Trace(Box::new(session), Box::new(overview))
    }

    /// Shows `rank` (or the whole trace) from now on; the overview of what is shown.
    fn show(&mut self, rank: Option<u32>, progress: &mut impl FnMut(&str)) -> Result<Overview, ExploreError> {
        self.rank = match rank {
            None => None,
            Some(r) => {
                let known = crate::ranks::ranks(&self.whole);
                let trace = rank_trace(&self.whole, r).ok_or(ExploreError::NoRank { rank: r, known })?;
                Some((r, trace))
            }
        };
        Ok(self.overview(progress))
    }

    /// The overview of the trace shown; sets the device and operators later answers use.
    fn overview(&mut self, progress: &mut impl FnMut(&str)) -> Overview {
        let rank = self.rank.as_ref().map(|(r, _)| *r);
        let trace = self.trace();
        // One pass finds the peak's device, for the overview and every later answer.
        progress("finding the peak's device");
        let device = analysis::peak_device(trace);
        progress("innermost operators");
        let ops_at_event = innermost_ops(trace);
        let (mut overview, categories) = overview_of(trace, device, &self.name(), self.file_bytes, progress);
        overview.ranks = rank_set(&self.whole, rank);
        self.categories = categories;
        self.device = device;
        self.ops_at_event = ops_at_event;
        progress("indexing the timeline");
        self.index = Some(TimelineIndex::new(self.trace()));
        self.pairs = None;
        self.whatif = None;
        self.flame = None;
        overview
    }

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
    pub fn compare_with(&self, file_name: &str, bytes: &[u8]) -> Result<TraceDiff, ExploreError> {
        if looks_like_sweep(bytes) {
            return Err(ExploreError::SweepToCompare { file_name: file_name.to_owned() });
        }
        let other = crate::import(bytes, &crate::ImportOptions::default())?;
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
                Err(e) => Response::Error { message: e.to_string() },
            },
            Request::DiffDevices { a, b } => match diff_devices(&self.whole, Some(*a), &self.whole, Some(*b)) {
                Ok(d) => Response::Diff(Box::new(d)),
                Err(e) => Response::Error { message: e.to_string() },
            },
            Request::Active { start_s, end_s, columns } => self.active(*start_s, *end_s, *columns),
            Request::Allocation { event_index } => self.allocation_at(*event_index),
            Request::Find { query, limit } => Response::Found(Box::new(analysis::search::find(self.trace(), query, (*limit).min(1000)))),
            Request::Flame { all_frames } => {
                let trace = match &self.rank {
                    Some((_, t)) => t,
                    None => &self.whole,
                };
                let fold = !*all_frames;
                let graph = match &self.flame {
                    Some((folded, g)) if *folded == fold => g.clone(),
                    _ => {
                        let g = analysis::flame::flame_graph_with(trace, FLAME_MIN_SHARE, fold);
                        self.flame = Some((fold, g.clone()));
                        g
                    }
                };
                Response::Flame { graph: Box::new(graph) }
            }
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
                let opts = analysis::advice::AdviceOptions { budget_bytes: *budget_bytes, ..Default::default() };
                Response::Advice(Box::new(analysis::advice::advise(self.trace(), &opts)))
            }
            Request::SimulatedSegments { t_s, alloc_conf } => {
                let event_index = self.event_at(*t_s);
                let (segments, error) = match self.simulated_segments(event_index, alloc_conf) {
                    Ok(s) => (s, None),
                    Err(e) => (Vec::new(), Some(e.to_string())),
                };
                Response::SimulatedSegments { t_s: *t_s, alloc_conf: alloc_conf.clone(), event_index, segments, error }
            }
        }
    }

    fn secs(&self, ts_ns: u64) -> f64 {
        ts_ns.saturating_sub(self.trace().start_ns()) as f64 * 1e-9
    }

    /// The last event at or before `t_s` (any device).
    fn event_at(&self, t_s: f64) -> Option<usize> {
        let ts = self.trace().start_ns().saturating_add((t_s.max(0.0) * 1e9) as u64);
        let n = self.trace().events.ts_ns.partition_point(|&t| t <= ts);
        n.checked_sub(1)
    }
}

fn looks_like_sweep(bytes: &[u8]) -> bool {
    let head = &bytes[..bytes.len().min(512)];
    // Lossy: the cut at 512 bytes may split a character.
    bytes.first() == Some(&b'{') && String::from_utf8_lossy(head).contains(SWEEP_FORMAT)
}
