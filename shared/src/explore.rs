//! The viewer's questions and their answers, computed next to the trace.
//!
//! The viewer keeps a [`Session`] (the imported trace and its one-off analyses) in a Web Worker
//! and asks it [`Request`]s as the user zooms, hovers and clicks; the answers are small and
//! serialisable. Keeping this here, and not in the viewer, lets native tests check exactly what
//! the page shows.

use crate::analysis::flame::{flame_graph, innermost_ops, FlameGraph};
use crate::analysis::profile::{graph_profile, GraphProfile};
use crate::analysis::sweep::{read_sweep, RankPoint, SWEEP_FORMAT};
use crate::analysis::{self, FragmentationStats, LayerMemoryStats, Summary, TimelineOptions, TimelinePoint};
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
    pub phase_bands: Vec<Band>,
    /// Outermost module scopes in time.
    pub layer_bands: Vec<Band>,
    pub has_segments: bool,
    pub has_device_samples: bool,
    /// Rank curves to overlay (a sweep); empty for a trace.
    pub curves: Vec<Curve>,
    /// Every device's peaks (one per rank of a merged distributed trace).
    pub devices: Vec<analysis::DevicePeak>,
    /// Growth across iterations and what is never freed.
    pub leaks: analysis::leaks::LeakReport,
}

/// A labelled stretch of time, seconds since trace start.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Band {
    pub start_s: f64,
    pub end_s: f64,
    pub label: String,
    pub phase: Phase,
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
}

/// The answers, one per [`Request`] kind.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Response {
    Timeline { start_s: f64, end_s: f64, points: Vec<TimelinePoint>, driver: Vec<(f64, u64)> },
    At(Moment),
    Allocations { t_s: f64, allocations: Vec<Allocation> },
    Segments { t_s: f64, event_index: Option<usize>, segments: Vec<SegmentInfo> },
    Export { file_name: String, mime: String, text: String },
    Error { message: String },
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
}

/// An imported trace with the analyses computed once.
pub struct Session {
    trace: Trace,
    device: u8,
    ops_at_event: Vec<StrId>,
    file_name: String,
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
        // One pass finds the peak's device, for the overview and every later answer.
        let device = analysis::peak_device(&trace);
        let overview = overview_of(&trace, device, file_name, bytes.len() as u64, &mut progress);
        let session = Session {
            device,
            ops_at_event: innermost_ops(&trace),
            trace,
            file_name: file_name.to_owned(),
        };
        Ok(Opened::Trace(Box::new(session), Box::new(overview)))
    }

    pub fn trace(&self) -> &Trace {
        &self.trace
    }

    /// Answers one request.
    pub fn answer(&self, request: &Request) -> Response {
        match request {
            Request::Timeline { start_s, end_s, buckets } => self.timeline(*start_s, *end_s, *buckets),
            Request::At { t_s } => Response::At(self.moment(*t_s)),
            Request::Allocations { t_s, limit } => {
                Response::Allocations { t_s: *t_s, allocations: self.allocations(*t_s, *limit) }
            }
            Request::Segments { t_s } => {
                let idx = self.event_at(*t_s);
                let segments = match idx {
                    Some(i) => analysis::segments_at(&self.trace, i, self.device),
                    None => self.trace.initial_segments.iter().filter(|s| s.device == self.device).cloned().collect(),
                };
                Response::Segments { t_s: *t_s, event_index: idx, segments }
            }
            Request::Export { format } => self.export(format),
        }
    }

    fn secs(&self, ts_ns: u64) -> f64 {
        ts_ns.saturating_sub(self.trace.start_ns()) as f64 * 1e-9
    }

    fn timeline(&self, start_s: f64, end_s: f64, buckets: usize) -> Response {
        let buckets = buckets.clamp(1, 20_000);
        let options = TimelineOptions { device: Some(self.device), ..TimelineOptions::default() }
            .with_buckets(buckets)
            .with_window(start_s, end_s);
        let points = analysis::timeline(&self.trace, &options);
        let start = self.trace.start_ns();
        let driver = self
            .trace
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
        let ts = self.trace.start_ns().saturating_add((t_s.max(0.0) * 1e9) as u64);
        let n = self.trace.events.ts_ns.partition_point(|&t| t <= ts);
        n.checked_sub(1)
    }

    fn moment(&self, t_s: f64) -> Moment {
        let ev = &self.trace.events;
        let idx = self.event_at(t_s);
        let totals = match idx {
            Some(i) => ev.totals_at(i),
            None => ev.base_totals.get(self.device as usize).copied().unwrap_or_default(),
        };
        let ts = self.trace.start_ns().saturating_add((t_s.max(0.0) * 1e9) as u64);
        // The innermost scope and op around the moment itself (not around the last event).
        let layer = self
            .trace
            .scopes
            .iter()
            .filter(|s| s.start_ns <= ts && ts < s.end_ns && !s.name.is_none())
            .max_by_key(|s| (s.depth, s.start_ns))
            .map(|s| self.trace.str(s.name).to_owned())
            .or_else(|| idx.and_then(|i| self.trace.opt_str(ev.layer[i])).map(str::to_owned));
        let op = self
            .trace
            .ops
            .iter()
            .filter(|o| o.start_ns <= ts && ts < o.end_ns)
            .max_by_key(|o| o.start_ns)
            .map(|o| self.trace.str(o.name).to_owned());
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
        let ev = &self.trace.events;
        let Some(idx) = self.event_at(t_s) else { return Vec::new() };
        let mut live = analysis::live_allocations_at(&self.trace, idx);
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
        live.into_iter()
            .map(|i| Allocation {
                event_index: i,
                address: ev.address[i],
                size_bytes: ev.size_bytes[i],
                alloc_s: self.secs(ev.ts_ns[i]),
                free_s: freed.get(&i).copied(),
                layer: self.trace.opt_str(ev.layer[i]).map(str::to_owned),
                op: self.ops_at_event.get(i).and_then(|&o| self.trace.opt_str(o)).map(str::to_owned),
                stack: self
                    .trace
                    .stacks
                    .stack_of_event(i)
                    .map(|s| {
                        self.trace
                            .stacks
                            .stack(s)
                            .map(|f| format!("{} {}:{}", self.trace.str(f.name), self.trace.str(f.filename), f.line))
                            .collect()
                    })
                    .unwrap_or_default(),
            })
            .collect()
    }

    fn export(&self, format: &str) -> Response {
        let stem = self.file_name.split('.').next().filter(|s| !s.is_empty()).unwrap_or("trace");
        let (text, file_name, mime) = if format == "layers_csv" {
            let mut out = Vec::new();
            let r = crate::export::csv::write_layer_stats(&self.trace, &mut out);
            (r.map(|_| out), format!("{stem}.layers.csv"), "text/csv")
        } else {
            let Some(f) = crate::export::ExportFormat::from_name(format) else {
                return Response::Error {
                    message: format!("unknown export format {format:?}: expected speedscope, timeline, chrome, csv, native or layers_csv"),
                };
            };
            let mut out = Vec::new();
            let r = crate::export::export(&self.trace, f, &mut out);
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
        (None, Some("this trace has no operator events (a memory snapshot records allocations only), so there are no ranks or activations".to_owned()))
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
        let mut names = trace.scopes.iter().filter(|s| s.depth == d && !is_iteration_scope(trace, s.name)).map(|s| s.name);
        names.next().is_some_and(|first| names.any(|n| n != first))
    });
    let layer_bands = trace
        .scopes
        .iter()
        .filter(|s| Some(s.depth) == band_depth && !is_iteration_scope(trace, s.name))
        .map(|s| Band { start_s: secs(s.start_ns), end_s: secs(s.end_ns), label: trace.str(s.name).to_owned(), phase: s.phase })
        .collect();
    Overview {
        file_name: file_name.to_owned(),
        file_bytes,
        device: trace.devices.get(device as usize).map(|d| d.to_string()).unwrap_or_else(|| "unknown".into()),
        duration_s: ev.ts_ns.last().map_or(0.0, |&t| secs(t)),
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
    }
}

fn is_iteration_scope(trace: &Trace, name: StrId) -> bool {
    trace.opt_str(name).is_some_and(|n| n.starts_with("ProfilerStep#") || n.starts_with("iteration"))
}
