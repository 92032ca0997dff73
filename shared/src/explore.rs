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

/// Everything the page draws without asking again, sent once after loading.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Overview {
    pub file_name: String,
    pub file_bytes: u64,
    pub summary: Summary,
    pub device: String,
    /// Seconds since trace start of the last event (the timeline's full width).
    pub duration_s: f64,
    pub layers: Vec<LayerMemoryStats>,
    pub fragmentation: FragmentationStats,
    pub profile: Option<GraphProfile>,
    /// Why there is no profile (a snapshot has no operators, ...).
    pub profile_error: Option<String>,
    pub flame: FlameGraph,
    /// Runs of one phase (forward, backward, optimizer) in time.
    #[serde(with = "band_columns")]
    pub phase_bands: Vec<Band>,
    /// Outermost module scopes in time.
    #[serde(with = "band_columns")]
    pub layer_bands: Vec<Band>,
    pub has_segments: bool,
    pub has_device_samples: bool,
    /// Rank curves to overlay (a sweep); empty for a trace.
    pub curves: Vec<Curve>,
    /// Every device's peaks (one per rank of a merged distributed trace).
    pub devices: Vec<analysis::DevicePeak>,
    /// Growth across iterations and what is never freed.
    pub leaks: analysis::leaks::LeakReport,
    /// Why the run ran out of memory, when it did (shown first).
    #[serde(default)]
    pub oom: Option<analysis::oom::OomReport>,
    /// The ranks of a merged trace of two or more ranks (whichever rank is shown); `None`
    /// otherwise.
    #[serde(default)]
    pub ranks: Option<RankSet>,
    /// What the importer noted about the trace shown (memory allocated before recording,
    /// entries skipped, annotations left out): `collector summary`'s `note:` lines.
    #[serde(default)]
    pub notes: Vec<String>,
    /// Bytes of each allocation category alive at the peak
    /// ([`analysis::categories::bytes_at`]).
    #[serde(default)]
    pub categories_at_peak: Vec<(analysis::categories::Category, u64)>,
    /// torch.compile's generated code in the run and the modules it was attributed to.
    #[serde(default)]
    pub compiled: Option<crate::model::CompiledCode>,
}

/// The ranks of a merged trace: what the Ranks view shows, the same whichever rank the other
/// views show.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankSet {
    /// One row per device of a rank (usually one device per rank), in device order.
    pub devices: Vec<RankDevice>,
    /// Ranks of the job (`WORLD_SIZE`) that no file was given for.
    pub missing_ranks: Vec<u32>,
    /// The merged trace's warnings (missing ranks and why, how clocks were aligned).
    pub warnings: Vec<String>,
    /// The rank the other views show; `None`: every rank (the merged trace).
    pub selected: Option<u32>,
    /// Seconds from the merged trace's start to its last event: the curves' shared x axis.
    pub duration_s: f64,
    /// The device (index into the trace's devices) whose allocated peak is the highest.
    pub highest_device: u8,
    /// The two devices of different ranks whose allocated peaks differ most (the highest and
    /// the lowest peak), lower rank first.
    pub most_different: (u8, u8),
}

/// One device of a rank and its peaks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankDevice {
    /// Index into the merged trace's devices.
    pub device_index: u8,
    pub rank: u32,
    /// `cuda:0 (rank 1)`.
    pub device: String,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// Seconds since the merged trace's start at which the allocated peak is first reached.
    pub peak_time_s: f64,
    /// The layer of the allocation that reached the peak; empty when it has none.
    pub peak_layer: String,
    pub events: usize,
}

/// One rank device's allocated memory over the whole merged trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankCurve {
    pub device_index: u8,
    pub rank: u32,
    pub device: String,
    #[serde(with = "analysis::timeline_columns")]
    pub points: Vec<TimelinePoint>,
}

/// A labelled stretch of time, seconds since trace start.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Band {
    pub start_s: f64,
    pub end_s: f64,
    pub label: String,
    pub phase: Phase,
}

/// Bands as they are written: one list per field, each label once. A long run's snapshot holds
/// thousands of top-level layer calls under a few names (9 062 in a 57.5 MB one: 979 KB of
/// JSON as a list of objects, most of the overview the page reads when a file opens).
mod band_columns {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::Band;
    use crate::hash::FastMap;
    use crate::model::Phase;

    #[derive(Serialize, Deserialize)]
    struct Columns {
        labels: Vec<String>,
        /// Index into `labels` of each band's label.
        label: Vec<u32>,
        phase: Vec<Phase>,
        start_s: Vec<f64>,
        end_s: Vec<f64>,
    }

    pub fn serialize<S: Serializer>(bands: &[Band], s: S) -> Result<S::Ok, S::Error> {
        let mut index: FastMap<&str, u32> = FastMap::default();
        let mut c = Columns {
            labels: Vec::new(),
            label: Vec::with_capacity(bands.len()),
            phase: bands.iter().map(|b| b.phase).collect(),
            start_s: bands.iter().map(|b| b.start_s).collect(),
            end_s: bands.iter().map(|b| b.end_s).collect(),
        };
        for b in bands {
            let next = index.len() as u32;
            let id = *index.entry(b.label.as_str()).or_insert(next);
            if id == next {
                c.labels.push(b.label.clone());
            }
            c.label.push(id);
        }
        c.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Band>, D::Error> {
        let c = Columns::deserialize(d)?;
        let n = c.label.len();
        crate::analysis::same_lengths(
            "a band list",
            &[("label", n), ("phase", c.phase.len()), ("start_s", c.start_s.len()), ("end_s", c.end_s.len())],
        )
        .map_err(serde::de::Error::custom)?;
        (0..n)
            .map(|i| {
                let label = c
                    .labels
                    .get(c.label[i] as usize)
                    .ok_or_else(|| serde::de::Error::custom(format!("band {i} names label {}, of {}", c.label[i], c.labels.len())))?;
                Ok(Band { start_s: c.start_s[i], end_s: c.end_s[i], label: label.clone(), phase: c.phase[i] })
            })
            .collect()
    }
}

/// One memory-vs-rank curve of an overlay.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Curve {
    pub label: String,
    pub points: Vec<RankPoint>,
}

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

/// The state at one moment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Moment {
    pub t_s: f64,
    /// The last event at or before `t_s`.
    pub event_index: Option<usize>,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    pub layer: Option<String>,
    pub op: Option<String>,
    pub phase: Option<Phase>,
}

/// One live allocation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Allocation {
    pub event_index: usize,
    pub address: u64,
    pub size_bytes: u64,
    pub alloc_s: f64,
    /// `None`: never freed in the trace.
    pub free_s: Option<f64>,
    pub layer: Option<String>,
    pub op: Option<String>,
    /// Frames, innermost first.
    pub stack: Vec<String>,
    /// The private pool it came from (`(0, 1)`); `None` for the default pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// Annotations, user metadata and allocator tags attached to it, as `kind: text`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Its user metadata decoded, when the text is JSON (what `_set_memory_metadata` writes
    /// for a dict).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_metadata: Option<serde_json::Value>,
    /// Who held it, as recorded (`parameter weight in layer1.0.conv1 from 0.12 s`), in the order
    /// they took it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<String>,
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

/// Why files could not be opened as the ranks of one job.
#[derive(Debug, thiserror::Error)]
pub enum RanksError {
    #[error("{file_name}: {message}")]
    File { file_name: String, message: String },
    /// The files were recorded far apart in time: merging them is possible when asked.
    #[error(
        "{a} ({a_span}) and {b} ({b_span}) were recorded at different times, so they are not ranks of one run; \
         expected the files of one run (or merge them anyway)"
    )]
    Disjoint { a: String, a_span: String, b: String, b_span: String },
    #[error(transparent)]
    Merge(MergeError),
}

impl RanksError {
    /// True when merging with `allow_disjoint` would succeed past this error.
    pub fn can_merge_anyway(&self) -> bool {
        matches!(self, RanksError::Disjoint { .. })
    }
}

impl From<MergeError> for RanksError {
    fn from(e: MergeError) -> Self {
        match e {
            MergeError::Disjoint { a, a_span, b, b_span } => RanksError::Disjoint { a, a_span, b, b_span },
            other => RanksError::Merge(other),
        }
    }
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
    pub fn open(file_name: &str, bytes: &[u8], mut progress: impl FnMut(&str)) -> Result<Opened, String> {
        if looks_like_sweep(bytes) {
            let sweep = read_sweep(bytes).map_err(|e| e.to_string())?;
            let curves = sweep
                .runs
                .iter()
                .filter(|r| !r.curve.is_empty())
                .map(|r| Curve { label: format!("{} batch {}", sweep.model, r.batch_size), points: r.curve.clone() })
                .collect();
            let empty = Trace::new(crate::model::TraceMeta::new(crate::model::SourceFormat::MemoryTracer));
            let mut overview = overview_of(&empty, 0, file_name, bytes.len() as u64, &mut progress);
            overview.curves = curves;
            overview.profile_error = Some("a sweep file holds curves only; open one of its traces for the other views".into());
            return Ok(Opened::Sweep(Box::new(overview)));
        }
        progress("parsing");
        let trace = crate::import(bytes, &crate::ImportOptions::default()).map_err(|e| e.to_string())?;
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
    ) -> Result<Opened, String> {
        use std::io::Read as _;
        let mut head = Vec::new();
        (&mut reader).take(512).read_to_end(&mut head).map_err(|e| format!("reading {file_name} failed: {e}"))?;
        if looks_like_sweep(&head) {
            // A sweep file is a small JSON document: read it whole.
            reader.read_to_end(&mut head).map_err(|e| format!("reading {file_name} failed: {e}"))?;
            return Self::open(file_name, &head, progress);
        }
        progress("parsing");
        let trace =
            crate::import::import_reader(head.as_slice().chain(reader), &crate::ImportOptions::default()).map_err(|e| e.to_string())?;
        Ok(Self::opened(trace, file_name, file_bytes, &mut progress))
    }

    /// Opens `files` (name, bytes), one trace per rank of a job, merged into one trace. Each
    /// file's rank is the one its process recorded, else `rank<N>` in its name, else its
    /// position ([`crate::rank_files`]), as `collector merge` does.
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
        let ranks = crate::rank_files::assign_ranks(files.iter().map(|f| f.0.as_str()).zip(&traces));
        let inputs =
            traces.into_iter().zip(ranks).zip(files).map(|((trace, rank), (name, _))| MergeInput { trace, rank, label: name.clone() });
        progress(&format!("merging {n} ranks"));
        let merged = merge_with(inputs.collect(), options)?;
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
        };
        let overview = session.overview(progress);
        Opened::Trace(Box::new(session), Box::new(overview))
    }

    /// Shows `rank` (or the whole trace) from now on; the overview of what is shown.
    fn show(&mut self, rank: Option<u32>, progress: &mut impl FnMut(&str)) -> Result<Overview, String> {
        self.rank = match rank {
            None => None,
            Some(r) => {
                let known = crate::merge::ranks(&self.whole);
                let trace = rank_trace(&self.whole, r).ok_or_else(|| format!("this trace has no rank {r}: expected one of {known:?}"))?;
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
        let device = analysis::peak_device(trace);
        let ops_at_event = innermost_ops(trace);
        let mut overview = overview_of(trace, device, &self.name(), self.file_bytes, progress);
        progress("categorising allocations");
        let categories = analysis::categories::categorize(trace);
        overview.categories_at_peak = analysis::categories::bytes_at(trace, &categories, overview.summary.peak_event_index);
        overview.ranks = rank_set(&self.whole, rank);
        self.categories = categories;
        self.device = device;
        self.ops_at_event = ops_at_event;
        self.index = Some(TimelineIndex::new(self.trace()));
        self.pairs = None;
        self.whatif = None;
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

    fn active(&mut self, start_s: f64, end_s: f64, columns: usize, detail: usize) -> Response {
        let device = self.device;
        if self.pairs.as_ref().is_none_or(|p| p.device != device) {
            self.pairs = Some(analysis::active::Pairs::of(self.trace(), device));
        }
        let Some(pairs) = &self.pairs else { return Response::Error { message: "no allocations".into() } };
        let options = analysis::active::ActiveOptions { start_s, end_s, columns, detail: detail.min(200_000) };
        let mut a = analysis::active::active_timeline(self.trace(), pairs, self.index.as_ref(), &options);
        for b in &mut a.bands {
            b.op = self.ops_at_event.get(b.event_index as usize).and_then(|&o| self.trace().opt_str(o)).map(str::to_owned);
            let k = self.categories.partition_point(|c| c.event < b.event_index);
            b.category = self.categories.get(k).filter(|c| c.event == b.event_index).map(|c| c.category);
        }
        Response::Active(Box::new(a))
    }

    /// One allocation event with its free (from the pairs when made, else a scan forward).
    fn allocation_at(&self, i: usize) -> Response {
        let ev = &self.trace().events;
        if i >= ev.len() || ev.event_type(i) != EventType::Alloc {
            return Response::Error { message: format!("event {i} is not an allocation") };
        }
        let free = match &self.pairs {
            Some(p) if p.device == ev.device[i] => {
                let k = p.spans.partition_point(|&(a, _)| (a as usize) < i);
                p.spans.get(k).filter(|s| s.0 as usize == i && s.1 != u32::MAX).map(|s| s.1 as usize)
            }
            _ => (i + 1..ev.len())
                .find(|&j| ev.device[j] == ev.device[i] && ev.address[j] == ev.address[i] && ev.event_type(j) == EventType::Free),
        };
        let t_s = self.secs(ev.ts_ns[i]);
        Response::Allocations { t_s, allocations: vec![self.allocation(i, free.map(|j| self.secs(ev.ts_ns[j])))] }
    }

    fn rank_curves(&self, buckets: usize) -> Response {
        let whole = &self.whole;
        let end_s = duration_s(whole);
        let options = TimelineOptions::default().with_buckets(buckets.clamp(1, 20_000)).with_window(0.0, end_s);
        let curves: Vec<RankCurve> = whole
            .devices
            .iter()
            .enumerate()
            .filter_map(|(k, d)| {
                let points = analysis::timeline(whole, &TimelineOptions { device: Some(k as u8), ..options.clone() });
                Some(RankCurve { device_index: k as u8, rank: d.rank?, device: d.to_string(), points })
            })
            .collect();
        if curves.is_empty() {
            return Response::Error { message: "this trace has no ranks: open one file per rank together to merge them".into() };
        }
        Response::RankCurves { end_s, curves }
    }

    fn secs(&self, ts_ns: u64) -> f64 {
        ts_ns.saturating_sub(self.trace().start_ns()) as f64 * 1e-9
    }

    fn timeline(&self, start_s: f64, end_s: f64, buckets: usize) -> Response {
        let buckets = buckets.clamp(1, 20_000);
        let options =
            TimelineOptions { device: Some(self.device), ..TimelineOptions::default() }.with_buckets(buckets).with_window(start_s, end_s);
        let points = match &self.index {
            Some(index) => index.timeline(self.trace(), &options),
            None => analysis::timeline(self.trace(), &options),
        };
        let start = self.trace().start_ns();
        let driver = self
            .trace()
            .device_samples
            .iter()
            .filter(|s| s.device == self.device)
            .map(|s| (s.ts_ns.saturating_sub(start) as f64 * 1e-9, s.used_bytes))
            .filter(|&(t, _)| t >= start_s && t <= end_s)
            .collect();
        Response::Timeline { start_s, end_s, points, driver }
    }

    /// The last event at or before `t_s` (any device).
    fn event_at(&self, t_s: f64) -> Option<usize> {
        let ts = self.trace().start_ns().saturating_add((t_s.max(0.0) * 1e9) as u64);
        let n = self.trace().events.ts_ns.partition_point(|&t| t <= ts);
        n.checked_sub(1)
    }

    fn moment(&self, t_s: f64) -> Moment {
        let ev = &self.trace().events;
        let idx = self.event_at(t_s);
        let totals = match idx {
            Some(i) => ev.totals_at(i),
            None => ev.base_totals.get(self.device as usize).copied().unwrap_or_default(),
        };
        let ts = self.trace().start_ns().saturating_add((t_s.max(0.0) * 1e9) as u64);
        // The innermost scope and op around the moment itself (not around the last event).
        let layer = self
            .trace()
            .scopes
            .iter()
            .filter(|s| s.start_ns <= ts && ts < s.end_ns && !s.name.is_none())
            .max_by_key(|s| (s.depth, s.start_ns))
            .map(|s| self.trace().str(s.name).to_owned())
            .or_else(|| idx.and_then(|i| self.trace().opt_str(ev.layer[i])).map(str::to_owned));
        let op = self
            .trace()
            .ops
            .iter()
            .filter(|o| o.start_ns <= ts && ts < o.end_ns)
            .max_by_key(|o| o.start_ns)
            .map(|o| self.trace().str(o.name).to_owned());
        Moment {
            t_s,
            event_index: idx,
            allocated_bytes: totals.allocated_bytes,
            reserved_bytes: totals.reserved_bytes,
            layer,
            op,
            phase: idx.map(|i| ev.phase(i)),
        }
    }

    fn allocations(&self, t_s: f64, limit: usize) -> Vec<Allocation> {
        let ev = &self.trace().events;
        let Some(idx) = self.event_at(t_s) else { return Vec::new() };
        let mut live = analysis::live_allocations_at(self.trace(), idx);
        live.retain(|&i| ev.device[i] == self.device);
        live.sort_by_key(|&i| (std::cmp::Reverse(ev.size_bytes[i]), i));
        live.truncate(limit.min(1000));
        // Their frees: one pass forward from the moment.
        let mut want: std::collections::HashMap<u64, usize> = live.iter().map(|&i| (ev.address[i], i)).collect();
        let mut freed: std::collections::HashMap<usize, f64> = std::collections::HashMap::new();
        for j in idx + 1..ev.len() {
            if want.is_empty() {
                break;
            }
            if ev.device[j] == self.device && ev.event_type(j) == EventType::Free {
                if let Some(i) = want.remove(&ev.address[j]) {
                    freed.insert(i, self.secs(ev.ts_ns[j]));
                }
            }
        }
        live.into_iter().map(|i| self.allocation(i, freed.get(&i).copied())).collect()
    }

    /// Allocation event `i` for the page: size, lifetime, layer, operator and stack.
    fn allocation(&self, i: usize, free_s: Option<f64>) -> Allocation {
        let ev = &self.trace().events;
        Allocation {
            event_index: i,
            address: ev.address[i],
            size_bytes: ev.size_bytes[i],
            alloc_s: self.secs(ev.ts_ns[i]),
            free_s,
            layer: self.trace().opt_str(ev.layer[i]).map(str::to_owned),
            op: self.ops_at_event.get(i).and_then(|&o| self.trace().opt_str(o)).map(str::to_owned),
            stack: self
                .trace()
                .stacks
                .stack_of_event(i)
                .map(|s| {
                    self.trace()
                        .stacks
                        .stack(s)
                        .map(|f| format!("{} {}:{}", self.trace().str(f.name), self.trace().str(f.filename), f.line))
                        .collect()
                })
                .unwrap_or_default(),
            pool: self.trace().event_pool(i).and_then(|p| self.trace().pools.get(p as usize)).map(ToString::to_string),
            holders: self
                .trace()
                .holders_of(i)
                .iter()
                .map(|h| {
                    let until = h.released_ns.map(|r| format!(" to {:.3} s", self.secs(r))).unwrap_or_default();
                    format!("{} from {:.3} s{until}", self.trace().describe_holder(h), self.secs(h.taken_ns))
                })
                .collect(),
            notes: self
                .trace()
                .notes_of(i)
                .iter()
                .map(|n| {
                    let kind = match n.kind {
                        crate::model::NoteKind::Annotation => "annotation",
                        crate::model::NoteKind::UserMetadata => "user metadata",
                        crate::model::NoteKind::Internal => "allocator",
                    };
                    format!("{kind}: {}", self.trace().str(n.text))
                })
                .collect(),
            user_metadata: self
                .trace()
                .notes_of(i)
                .iter()
                .filter(|n| n.kind == crate::model::NoteKind::UserMetadata)
                .find_map(|n| serde_json::from_str::<serde_json::Value>(self.trace().str(n.text)).ok())
                .filter(|v| v.is_object() || v.is_array()),
        }
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

fn looks_like_sweep(bytes: &[u8]) -> bool {
    let head = &bytes[..bytes.len().min(512)];
    // Lossy: the cut at 512 bytes may split a character.
    bytes.first() == Some(&b'{') && String::from_utf8_lossy(head).contains(SWEEP_FORMAT)
}

/// Everything drawn without asking again; `device` is the peak's ([`analysis::peak_device`]).
fn overview_of(trace: &Trace, device: u8, file_name: &str, file_bytes: u64, progress: &mut impl FnMut(&str)) -> Overview {
    progress("summarising");
    let summary = analysis::summary(trace);
    let by_name = analysis::layer_stats(trace);
    let fragmentation = analysis::fragmentation_stats_with_layers(trace, &by_name);
    let layers: Vec<LayerMemoryStats> = by_name.into_values().collect();
    progress("profiling operators");
    let (profile, profile_error) = if trace.ops.is_empty() {
        (
            None,
            Some(
                "this trace has no operator events (a memory snapshot records allocations only), so there are no ranks or activations"
                    .to_owned(),
            ),
        )
    } else {
        match graph_profile(trace) {
            Ok(p) => (Some(p), None),
            Err(e) => (None, Some(e.to_string())),
        }
    };
    progress("building the flame graph");
    let flame = flame_graph(trace, FLAME_MIN_SHARE);
    let ev = &trace.events;
    let start = trace.start_ns();
    let secs = |ns: u64| ns.saturating_sub(start) as f64 * 1e-9;
    let mut phase_bands: Vec<Band> = Vec::new();
    for i in 0..ev.len() {
        let (p, t) = (ev.phase(i), secs(ev.ts_ns[i]));
        match phase_bands.last_mut() {
            Some(b) if b.phase == p => b.end_s = t,
            _ => phase_bands.push(Band { start_s: t, end_s: t, label: p.as_str().into(), phase: p }),
        }
    }
    phase_bands.retain(|b| b.phase != Phase::Other);
    // The shallowest depth with two or more names: below a root module that spans everything.
    let band_depth = (0..=trace.scopes.iter().map(|s| s.depth).max().unwrap_or(0)).find(|&d| {
        let mut names = trace.scopes.iter().filter(|s| s.depth == d && !is_iteration_scope(trace.str(s.name))).map(|s| s.name);
        names.next().is_some_and(|first| names.any(|n| n != first))
    });
    let layer_bands = trace
        .scopes
        .iter()
        .filter(|s| Some(s.depth) == band_depth && !is_iteration_scope(trace.str(s.name)))
        .map(|s| Band { start_s: secs(s.start_ns), end_s: secs(s.end_ns), label: trace.str(s.name).to_owned(), phase: s.phase })
        .collect();
    Overview {
        file_name: file_name.to_owned(),
        file_bytes,
        device: trace.devices.get(device as usize).map(|d| d.to_string()).unwrap_or_else(|| "unknown".into()),
        duration_s: duration_s(trace),
        summary,
        layers,
        fragmentation,
        profile,
        profile_error,
        flame,
        phase_bands,
        layer_bands,
        has_segments: analysis::has_segments(trace),
        has_device_samples: !trace.device_samples.is_empty(),
        curves: Vec::new(),
        devices: analysis::device_peaks(trace),
        leaks: analysis::leaks::leaks(trace, 8),
        oom: analysis::oom::oom(trace, 8),
        ranks: None,
        notes: trace.meta.warnings.clone(),
        categories_at_peak: Vec::new(),
        compiled: trace.meta.compiled.clone(),
    }
}

/// Seconds from the trace's start to its last event.
fn duration_s(trace: &Trace) -> f64 {
    trace.events.ts_ns.last().map_or(0.0, |&t| t.saturating_sub(trace.start_ns()) as f64 * 1e-9)
}

/// The ranks of `whole` when it has two or more, with `selected` the rank shown.
fn rank_set(whole: &Trace, selected: Option<u32>) -> Option<RankSet> {
    if crate::merge::ranks(whole).len() < 2 {
        return None;
    }
    let devices: Vec<RankDevice> = analysis::device_peaks(whole)
        .into_iter()
        .enumerate()
        .filter_map(|(k, p)| {
            Some(RankDevice {
                device_index: k as u8,
                rank: p.rank?,
                device: p.device,
                peak_allocated_bytes: p.peak_allocated_bytes,
                peak_reserved_bytes: p.peak_reserved_bytes,
                peak_time_s: p.peak_time_s,
                peak_layer: p.peak_layer,
                events: p.events,
            })
        })
        .collect();
    // Ties go to the first device in order, so the answer does not depend on sort stability.
    let highest = devices.iter().reduce(|best, d| if d.peak_allocated_bytes > best.peak_allocated_bytes { d } else { best })?;
    let lowest = devices.iter().filter(|d| d.rank != highest.rank).reduce(|best, d| {
        if d.peak_allocated_bytes < best.peak_allocated_bytes {
            d
        } else {
            best
        }
    })?;
    let (a, b) =
        if (lowest.rank, lowest.device_index) < (highest.rank, highest.device_index) { (lowest, highest) } else { (highest, lowest) };
    Some(RankSet {
        highest_device: highest.device_index,
        most_different: (a.device_index, b.device_index),
        missing_ranks: whole.meta.missing_ranks.clone(),
        warnings: whole.meta.warnings.clone(),
        selected,
        duration_s: duration_s(whole),
        devices,
    })
}
