//! Two traces side by side (`collector diff`, `POST /api/trace/diff`, the viewer's Compare
//! view): each side's peak and when it happens (in the trace and in its iteration), the peak's
//! change, per-layer rows by change, the per-class breakdown where both sides have operator
//! data, operators that appear or vanish, and two allocated-memory curves on one x axis.
//!
//! Each side is one device: the one with the highest allocated peak unless the caller picks
//! one ([`diff_devices`]); only that device's events count (and, for a rank of a merged
//! trace, only that rank's operators and scopes).

use super::profile::{graph_profile, TensorClass};
use super::{fragmentation_stats_with_layers, layer_stats, peak_device, summary, timeline, LayerMemoryStats, Summary, TimelineOptions};
use crate::model::{EventRecord, SourceFormat, Trace};
use crate::ranks::rank_trace;
use crate::units::format_bytes;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::BTreeMap;

/// Points per curve at most (one min/max bucket each).
pub const CURVE_POINTS: usize = 2000;

/// Which trace of the two.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    A,
    B,
}

impl Side {
    pub fn as_str(self) -> &'static str {
        match self {
            Side::A => "A",
            Side::B => "B",
        }
    }
}

/// Why two traces cannot be compared as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiffError {
    #[error(
        "device {index} of {side} does not exist: {side} has {}, so the index must be below {devices}",
        plural(*devices, "device"),
        side = side.as_str()
    )]
    NoSuchDevice { side: Side, index: u8, devices: usize },
}

/// The two traces compared. Deltas are B − A.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceDiff {
    pub a: SideFacts,
    pub b: SideFacts,
    /// B's allocated peak minus A's.
    pub peak_allocated_delta_bytes: i64,
    /// B's reserved peak minus A's.
    pub peak_reserved_delta_bytes: i64,
    /// Every layer of either side, largest |peak delta| first (ties: |allocated delta|, name).
    pub layers: Vec<LayerDiff>,
    /// Both sides have the same layer names (vacuously true when neither has layers).
    pub layers_match: bool,
    pub classes: ClassesDiff,
    /// Bytes of each allocation category alive at each side's peak
    /// ([`super::categories`]), every category in order.
    #[serde(default)]
    pub categories: Vec<CategoryRow>,
    /// Operators by name; `None` unless both sides have operators (the notes say why).
    pub ops: Option<OpsDiff>,
    pub curves: DiffCurves,
    /// What to know before reading the numbers, in plain English.
    pub notes: Vec<String>,
}

/// Facts of one side, without its file name (the caller labels the sides).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SideFacts {
    pub model: Option<String>,
    /// `pytorch_snapshot`, `memory_tracer`, `chrome_trace`, `dftracer`.
    pub source_format: String,
    /// The device compared (`cuda:0`, `cuda:0 (rank 1)`); `None` when the trace has none.
    pub device: Option<String>,
    /// Its index into the trace's devices.
    pub device_index: Option<u8>,
    /// Devices in the whole trace.
    pub devices: usize,
    /// Memory events of the device compared.
    pub events: usize,
    /// Operators (of the device's rank, for a merged trace).
    pub ops: usize,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// Seconds since the trace's start at which the allocated peak is first reached.
    pub peak_time_s: f64,
    /// Where the allocated peak falls among the iterations; `None` without iterations or when
    /// it falls outside them.
    pub peak_in_iteration: Option<IterationPosition>,
    pub iterations: usize,
    /// Where the iterations came from (`iteration marks`, `optimizer steps`) or why none.
    pub iterations_from: String,
    pub avg_fragmentation: f64,
    pub max_fragmentation: f64,
    /// Reserved but unallocated bytes at the allocated peak.
    pub unused_reserved_at_peak_bytes: u64,
    pub dropped_events: u64,
}

/// A moment inside an iteration.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct IterationPosition {
    /// 0-based position among the trace's iterations.
    pub iteration: usize,
    /// Seconds since that iteration's start.
    pub since_start_s: f64,
    /// `since_start_s` over the iteration's duration, 0..=1.
    pub fraction: f64,
}

/// Whether a layer is in A, in B or in both.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Presence {
    Both,
    OnlyA,
    OnlyB,
}

/// One layer's numbers on one side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerSide {
    /// Highest allocated total at an event of the layer (as in `layer_stats`).
    pub peak_allocated_bytes: u64,
    pub allocations: u64,
    /// Sum of the layer's allocation sizes.
    pub allocated_bytes: u64,
}

/// One layer of either side.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerDiff {
    pub layer_name: String,
    pub presence: Presence,
    /// `None` where the layer is not in A.
    pub a: Option<LayerSide>,
    /// `None` where the layer is not in B.
    pub b: Option<LayerSide>,
    /// B's peak minus A's (a missing side counts 0).
    pub peak_delta_bytes: i64,
    /// B's allocated bytes minus A's (a missing side counts 0).
    pub allocated_delta_bytes: i64,
    pub allocations_delta: i64,
}

/// Bytes by tensor class at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassBytes {
    pub weights_bytes: u64,
    pub gradients_bytes: u64,
    pub optimizer_state_bytes: u64,
    pub activations_bytes: u64,
    pub other_bytes: u64,
}

impl ClassBytes {
    pub fn get(&self, class: TensorClass) -> u64 {
        match class {
            TensorClass::Param => self.weights_bytes,
            TensorClass::Grad => self.gradients_bytes,
            TensorClass::OptState => self.optimizer_state_bytes,
            TensorClass::Act => self.activations_bytes,
            TensorClass::Other => self.other_bytes,
        }
    }
}

/// One side's per-class breakdown, or why it has none.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ClassSide {
    /// The graph profile's breakdown at its peak rank (reference iteration).
    Available {
        rank: usize,
        node_name: String,
        /// The allocator's total there; the classes add up to it.
        total_allocated_bytes: u64,
        bytes: ClassBytes,
    },
    Unavailable {
        reason: String,
    },
}

/// One class on both sides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassRow {
    pub class: TensorClass,
    pub a_bytes: u64,
    pub b_bytes: u64,
    pub delta_bytes: i64,
}

/// One allocation category at both sides' peaks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CategoryRow {
    pub category: super::categories::Category,
    pub a_bytes: u64,
    pub b_bytes: u64,
    /// B minus A.
    pub delta_bytes: i64,
}

/// The per-class comparison: `rows` only when both sides are available.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClassesDiff {
    pub a: ClassSide,
    pub b: ClassSide,
    /// Weights, gradients, optimizer state, activations, other, in that order; empty unless
    /// both sides are available.
    pub rows: Vec<ClassRow>,
}

/// An operator name and how often it ran.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpCount {
    pub name: String,
    pub count: u64,
}

/// Operator names that appear on one side only (most frequent first).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpsDiff {
    pub only_in_a: Vec<OpCount>,
    pub only_in_b: Vec<OpCount>,
    /// Distinct names found on both sides.
    pub common: usize,
}

/// What the curves' x axis means.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Alignment {
    /// x = iteration index + fraction of the iteration; before the first iteration x runs
    /// over [-1, 0), after the last over [n, n + 1]; gaps between iterations collapse to the
    /// next one's start.
    Iteration,
    /// x = seconds since each trace's start (one side or both have no iterations).
    Seconds,
}

/// One decimated bucket of a curve.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CurvePoint {
    pub x: f64,
    pub allocated_min_bytes: u64,
    pub allocated_max_bytes: u64,
}

/// The two allocated-memory curves of the Compare chart, on one x axis.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DiffCurves {
    pub alignment: Alignment,
    /// At most [`CURVE_POINTS`] points each, x ascending; the peak's value survives.
    pub a: Vec<CurvePoint>,
    pub b: Vec<CurvePoint>,
}

/// Compares the peak device of `a` with the peak device of `b`.
pub fn diff(a: &Trace, b: &Trace) -> TraceDiff {
    compare(&View::peak(a), &View::peak(b))
}

/// Compares device `da` of `a` with device `db` of `b` (indices into `Trace::devices`; `None`
/// picks the device with the highest allocated peak), e.g. two ranks of one merged trace.
pub fn diff_devices(a: &Trace, da: Option<u8>, b: &Trace, db: Option<u8>) -> Result<TraceDiff, DiffError> {
    let va = View::pick(a, da, Side::A)?;
    let vb = View::pick(b, db, Side::B)?;
    Ok(compare(&va, &vb))
}

/// One side: the trace reduced to the device compared.
struct View<'t> {
    /// `Borrowed` when the trace has at most one device, else [`one_device`]'s copy.
    trace: Cow<'t, Trace>,
    /// Index into the original trace's devices, and its name.
    device: Option<u8>,
    device_name: Option<String>,
    /// Devices of the original trace.
    devices: usize,
    /// The caller picked the device (else it is the peak's).
    picked: bool,
}

impl<'t> View<'t> {
    fn peak(trace: &'t Trace) -> Self {
        let device = (!trace.devices.is_empty()).then(|| peak_device(trace));
        Self::of(trace, device, false)
    }

    fn pick(trace: &'t Trace, device: Option<u8>, side: Side) -> Result<Self, DiffError> {
        match device {
            None => Ok(Self::peak(trace)),
            Some(d) if (d as usize) < trace.devices.len() => Ok(Self::of(trace, Some(d), true)),
            Some(index) => Err(DiffError::NoSuchDevice { side, index, devices: trace.devices.len() }),
        }
    }

    fn of(trace: &'t Trace, device: Option<u8>, picked: bool) -> Self {
        let devices = trace.devices.len();
        let reduced = match device {
            Some(d) if devices > 1 => Cow::Owned(one_device(trace, d)),
            _ => Cow::Borrowed(trace),
        };
        Self {
            trace: reduced,
            device,
            device_name: device.and_then(|d| trace.devices.get(d as usize)).map(|d| d.to_string()),
            devices,
            picked,
        }
    }
}

/// `trace` reduced to device `d` as device 0: for a rank of a merged trace, that rank's own
/// trace ([`rank_trace`]: its operators, scopes and counters), and in any case only the
/// device's memory events, each with its totals.
fn one_device(trace: &Trace, d: u8) -> Trace {
    let Some(device) = trace.devices.get(d as usize) else {
        return Trace::new(trace.meta.clone());
    };
    let rank = device.rank.and_then(|r| rank_trace(trace, r));
    let (source, index) = match &rank {
        Some(t) => (t, t.devices.iter().position(|x| x == device).unwrap_or(0) as u8),
        None => (trace, d),
    };
    if source.devices.len() == 1 {
        if let Some(t) = rank {
            return t;
        }
    }
    events_of(source, index)
}

/// `trace` with only device `d`'s memory events (as device 0, each with its totals); stacks,
/// segments and samples are left out (no comparison reads them).
fn events_of(trace: &Trace, d: u8) -> Trace {
    let mut out = Trace::new(trace.meta.clone());
    out.strings = trace.strings.clone();
    out.streams = trace.streams.clone();
    if let Some(device) = trace.devices.get(d as usize) {
        out.device_index(device.clone());
    }
    let ev = &trace.events;
    out.events.set_base_totals(0, ev.base_totals.get(d as usize).copied().unwrap_or_default());
    let mut cursor = ev.cursor();
    for i in 0..ev.len() {
        let totals = cursor.advance();
        if ev.device[i] == d {
            out.events.push(EventRecord { device: 0, totals: Some(totals), ..ev.record(i) });
        }
    }
    out.ops = trace.ops.clone();
    out.scopes = trace.scopes.clone();
    out.tensors = trace.tensors.clone();
    out.shapes = trace.shapes.clone();
    out.iterations = trace.iterations.clone();
    out.dropped_events = trace.dropped_events;
    out
}

/// Everything computed from one side.
struct Analysed {
    facts: SideFacts,
    layers: BTreeMap<String, LayerMemoryStats>,
    /// Iteration spans in trace time.
    spans: Vec<(u64, u64)>,
    classes: ClassSide,
    ops: BTreeMap<String, u64>,
    curve_times_ns: Vec<(u64, u64, u64)>,
    start_ns: u64,
    end_ns: u64,
    /// Bytes of each allocation category at the peak.
    categories: Vec<(super::categories::Category, u64)>,
}

fn analyse(view: &View) -> Analysed {
    let trace = view.trace.as_ref();
    let sum = summary(trace);
    let layers = layer_stats(trace);
    let frag = fragmentation_stats_with_layers(trace, &layers);
    let found = super::iterations::spans(trace);
    let (spans, from) = (found.bounds(), found.from.describe());
    let start_ns = trace.start_ns();
    let peak_ns = sum.peak_event_index.and_then(|i| trace.events.ts_ns.get(i).copied());
    let facts = SideFacts {
        model: trace.meta.model.clone(),
        source_format: sum.source_format.clone(),
        device: view.device_name.clone(),
        device_index: view.device,
        devices: view.devices,
        events: sum.total_events,
        ops: trace.ops.len(),
        peak_allocated_bytes: sum.peak_allocated_bytes,
        peak_reserved_bytes: sum.peak_reserved_bytes,
        peak_time_s: sum.peak_time_s,
        peak_in_iteration: peak_ns.and_then(|t| iteration_position(&spans, t)),
        iterations: spans.len(),
        iterations_from: from.to_owned(),
        avg_fragmentation: frag.avg_fragmentation,
        max_fragmentation: frag.max_fragmentation,
        unused_reserved_at_peak_bytes: frag.unused_reserved_at_peak_bytes,
        dropped_events: trace.dropped_events,
    };
    Analysed {
        facts,
        classes: class_side(trace),
        ops: op_counts(trace),
        curve_times_ns: curve_buckets(trace, start_ns, &sum),
        layers,
        spans,
        start_ns,
        end_ns: trace.end_ns(),
        categories: super::categories::bytes_at(trace, &super::categories::categorize(trace), sum.peak_event_index),
    }
}

/// Where `t_ns` falls among `spans`: the first span holding it.
fn iteration_position(spans: &[(u64, u64)], t_ns: u64) -> Option<IterationPosition> {
    let k = spans.iter().position(|&(s, e)| s <= t_ns && t_ns <= e)?;
    let (s, e) = spans[k];
    Some(IterationPosition { iteration: k, since_start_s: (t_ns - s) as f64 * 1e-9, fraction: fraction(t_ns - s, e - s) })
}

/// `part / whole` in 0..=1; 0 for an empty whole.
fn fraction(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        (part as f64 / whole as f64).clamp(0.0, 1.0)
    }
}

/// B − A as a signed number, saturating at `i64`'s range.
fn delta(a: u64, b: u64) -> i64 {
    (i128::from(b) - i128::from(a)).clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

fn compare(va: &View, vb: &View) -> TraceDiff {
    let (a, b) = (analyse(va), analyse(vb));
    let layers = layer_rows(&a.layers, &b.layers);
    let layers_match = a.layers.keys().eq(b.layers.keys());
    let classes = ClassesDiff { rows: class_rows(&a.classes, &b.classes), a: a.classes.clone(), b: b.classes.clone() };
    let ops = (!a.ops.is_empty() && !b.ops.is_empty()).then(|| ops_diff(&a.ops, &b.ops));
    let curves = curves(&a, &b);
    let notes = notes(&a, &b, va, vb, &classes, curves.alignment);
    let categories = a
        .categories
        .iter()
        .zip(&b.categories)
        .map(|(&(category, a_bytes), &(_, b_bytes))| CategoryRow { category, a_bytes, b_bytes, delta_bytes: delta(a_bytes, b_bytes) })
        .collect();
    TraceDiff {
        peak_allocated_delta_bytes: delta(a.facts.peak_allocated_bytes, b.facts.peak_allocated_bytes),
        peak_reserved_delta_bytes: delta(a.facts.peak_reserved_bytes, b.facts.peak_reserved_bytes),
        a: a.facts,
        b: b.facts,
        layers,
        layers_match,
        classes,
        categories,
        ops,
        curves,
        notes,
    }
}

fn layer_side(s: &LayerMemoryStats) -> LayerSide {
    LayerSide { peak_allocated_bytes: s.peak_allocated, allocations: s.total_allocations, allocated_bytes: s.allocated_bytes_total }
}

/// One row per layer of either side, largest |peak delta| first.
fn layer_rows(a: &BTreeMap<String, LayerMemoryStats>, b: &BTreeMap<String, LayerMemoryStats>) -> Vec<LayerDiff> {
    let names: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    let mut rows: Vec<LayerDiff> = names
        .into_iter()
        .map(|name| {
            let (la, lb) = (a.get(name).map(layer_side), b.get(name).map(layer_side));
            let (za, zb) = (la.unwrap_or_default(), lb.unwrap_or_default());
            LayerDiff {
                layer_name: name.clone(),
                presence: match (la, lb) {
                    (Some(_), None) => Presence::OnlyA,
                    (None, Some(_)) => Presence::OnlyB,
                    _ => Presence::Both,
                },
                a: la,
                b: lb,
                peak_delta_bytes: delta(za.peak_allocated_bytes, zb.peak_allocated_bytes),
                allocated_delta_bytes: delta(za.allocated_bytes, zb.allocated_bytes),
                allocations_delta: delta(za.allocations, zb.allocations),
            }
        })
        .collect();
    rows.sort_by(|x, y| {
        y.peak_delta_bytes
            .unsigned_abs()
            .cmp(&x.peak_delta_bytes.unsigned_abs())
            .then(y.allocated_delta_bytes.unsigned_abs().cmp(&x.allocated_delta_bytes.unsigned_abs()))
            .then_with(|| x.layer_name.cmp(&y.layer_name))
    });
    rows
}

/// The graph profile's breakdown at its peak rank, or why there is none.
fn class_side(trace: &Trace) -> ClassSide {
    let profile = match graph_profile(trace) {
        Ok(p) => p,
        Err(e) => return ClassSide::Unavailable { reason: e.to_string() },
    };
    let Some(row) = profile.breakdown.iter().find(|r| r.rank == profile.peak_rank) else {
        let reason = profile.not_derivable.first().cloned();
        return ClassSide::Unavailable {
            reason: reason.unwrap_or_else(|| "the graph profile has no breakdown at its peak rank".to_owned()),
        };
    };
    ClassSide::Available {
        rank: row.rank,
        node_name: profile.nodes.get(row.rank).map(|n| n.node_name.clone()).unwrap_or_default(),
        total_allocated_bytes: row.total_allocated,
        bytes: ClassBytes {
            weights_bytes: row.weights,
            gradients_bytes: row.gradients,
            optimizer_state_bytes: row.optimizer_state,
            activations_bytes: row.activations,
            other_bytes: row.other,
        },
    }
}

const CLASS_ORDER: [TensorClass; 5] = [TensorClass::Param, TensorClass::Grad, TensorClass::OptState, TensorClass::Act, TensorClass::Other];

fn class_rows(a: &ClassSide, b: &ClassSide) -> Vec<ClassRow> {
    let (ClassSide::Available { bytes: ba, .. }, ClassSide::Available { bytes: bb, .. }) = (a, b) else {
        return Vec::new();
    };
    CLASS_ORDER
        .iter()
        .map(|&class| ClassRow { class, a_bytes: ba.get(class), b_bytes: bb.get(class), delta_bytes: delta(ba.get(class), bb.get(class)) })
        .collect()
}

/// How often each operator name ran.
fn op_counts(trace: &Trace) -> BTreeMap<String, u64> {
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for o in &trace.ops {
        *counts.entry(trace.str(o.name).to_owned()).or_default() += 1;
    }
    counts
}

fn ops_diff(a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>) -> OpsDiff {
    let only = |x: &BTreeMap<String, u64>, y: &BTreeMap<String, u64>| {
        let mut v: Vec<OpCount> =
            x.iter().filter(|(k, _)| !y.contains_key(*k)).map(|(k, &c)| OpCount { name: k.clone(), count: c }).collect();
        v.sort_by(|p, q| q.count.cmp(&p.count).then_with(|| p.name.cmp(&q.name)));
        v
    };
    OpsDiff { only_in_a: only(a, b), only_in_b: only(b, a), common: a.keys().filter(|k| b.contains_key(*k)).count() }
}

/// The decimated allocated curve as (time ns, min, max) per bucket.
fn curve_buckets(trace: &Trace, start_ns: u64, sum: &Summary) -> Vec<(u64, u64, u64)> {
    if sum.total_events == 0 {
        return Vec::new();
    }
    let options = TimelineOptions { buckets: CURVE_POINTS, window_s: None, device: Some(peak_device(trace)) };
    timeline(trace, &options)
        .into_iter()
        .map(|p| (start_ns.saturating_add((p.t_s * 1e9) as u64), p.allocated_min_bytes, p.allocated_max_bytes))
        .collect()
}

fn curves(a: &Analysed, b: &Analysed) -> DiffCurves {
    let alignment = if a.spans.is_empty() || b.spans.is_empty() { Alignment::Seconds } else { Alignment::Iteration };
    let points = |s: &Analysed| -> Vec<CurvePoint> {
        s.curve_times_ns
            .iter()
            .map(|&(t, min, max)| CurvePoint {
                x: match alignment {
                    Alignment::Iteration => iteration_x(&s.spans, t, s.start_ns, s.end_ns),
                    Alignment::Seconds => t.saturating_sub(s.start_ns) as f64 * 1e-9,
                },
                allocated_min_bytes: min,
                allocated_max_bytes: max,
            })
            .collect()
    };
    DiffCurves { alignment, a: points(a), b: points(b) }
}

/// x of `t_ns` on the iteration axis (see [`Alignment::Iteration`]); `spans` sorted, not empty.
fn iteration_x(spans: &[(u64, u64)], t_ns: u64, start_ns: u64, end_ns: u64) -> f64 {
    let (Some(&(first, _)), Some(last)) = (spans.first(), spans.iter().map(|s| s.1).max()) else {
        return 0.0;
    };
    if t_ns < first {
        return -1.0 + fraction(t_ns.saturating_sub(start_ns), first.saturating_sub(start_ns));
    }
    if t_ns > last {
        return spans.len() as f64 + fraction(t_ns - last, end_ns.saturating_sub(last));
    }
    let k = spans.partition_point(|&(s, _)| s <= t_ns).saturating_sub(1);
    let (s, e) = spans[k];
    if t_ns <= e {
        k as f64 + fraction(t_ns - s, e - s)
    } else {
        (k + 1) as f64
    }
}

/// What to know before reading the numbers.
fn notes(a: &Analysed, b: &Analysed, va: &View, vb: &View, classes: &ClassesDiff, alignment: Alignment) -> Vec<String> {
    let mut notes = Vec::new();
    if let (Some(ma), Some(mb)) = (&a.facts.model, &b.facts.model) {
        if ma != mb {
            notes.push(format!("A is a trace of {ma} and B of {mb}"));
        }
    }
    if let Some(n) = layer_note(&a.layers, &b.layers) {
        notes.push(n);
    }
    for (side, s, v) in [(Side::A, a, va), (Side::B, b, vb)] {
        notes.extend(side_notes(side, s, v));
    }
    for (side, c, s) in [(Side::A, &classes.a, a), (Side::B, &classes.b, b)] {
        if let (ClassSide::Unavailable { reason }, true) = (c, !s.ops.is_empty()) {
            notes.push(format!("{} has no per-class breakdown: {reason}", side.as_str()));
        }
    }
    if a.facts.iterations != b.facts.iterations && alignment == Alignment::Iteration {
        notes.push(format!(
            "A has {} and B {}: the curves overlay iteration by iteration",
            plural(a.facts.iterations, "iteration"),
            b.facts.iterations
        ));
    }
    if alignment == Alignment::Seconds {
        let none: Vec<&str> =
            [(Side::A, a), (Side::B, b)].iter().filter(|(_, s)| s.spans.is_empty()).map(|(side, _)| side.as_str()).collect();
        notes.push(format!(
            "the curves are aligned by seconds since each trace's start: {} no iterations",
            match none.as_slice() {
                [one] => format!("{one} has"),
                _ => "neither has".to_owned(),
            }
        ));
    }
    notes
}

/// The layers that are on one side only, or `None` when the names match.
fn layer_note(a: &BTreeMap<String, LayerMemoryStats>, b: &BTreeMap<String, LayerMemoryStats>) -> Option<String> {
    let only_a = a.keys().filter(|k| !b.contains_key(*k)).count();
    let only_b = b.keys().filter(|k| !a.contains_key(*k)).count();
    if only_a == 0 && only_b == 0 {
        return a.is_empty().then(|| "neither trace attributes memory to layers".to_owned());
    }
    if a.is_empty() || b.is_empty() {
        let (none, some, n) = if a.is_empty() { ("A", "B", b.len()) } else { ("B", "A", a.len()) };
        return Some(format!("the layers do not match: {none} attributes memory to no layer and {some} to {n}"));
    }
    let mut parts = Vec::new();
    if only_a > 0 {
        parts.push(format!("{only_a} of {} layers of A are not in B", a.len()));
    }
    if only_b > 0 {
        parts.push(format!("{only_b} of {} layers of B are not in A", b.len()));
    }
    let common = a.len() - only_a;
    let union = common + only_a + only_b;
    let question = if common * 2 < union { " — are these traces of the same model?" } else { "" };
    Some(format!("the layers do not match: {}{question}", parts.join(" and ")))
}

fn side_notes(side: Side, s: &Analysed, v: &View) -> Vec<String> {
    let name = side.as_str();
    let mut notes = Vec::new();
    if v.devices > 1 {
        let how = if v.picked { "as asked" } else { "the device with the highest allocated peak" };
        notes.push(format!("{name} has {} devices; compared {} ({how})", v.devices, s.facts.device.as_deref().unwrap_or("none")));
    }
    if s.facts.events == 0 {
        notes.push(format!(
            "{name} has no memory events{}: its peak is what was allocated before recording ({})",
            if v.devices > 1 { " on that device" } else { "" },
            format_bytes(s.facts.peak_allocated_bytes)
        ));
    }
    if s.ops.is_empty() {
        let what = match v.trace.meta.source_format {
            SourceFormat::PytorchSnapshot => {
                format!("{name} is a PyTorch snapshot without operators")
            }
            _ => format!("{name} has no operators"),
        };
        notes.push(format!("{what}: the per-class breakdown and operator lists need operator data"));
    }
    if s.facts.dropped_events > 0 {
        notes.push(format!("{name} dropped {} events: its numbers are lower bounds", s.facts.dropped_events));
    }
    notes
}

/// `1 iteration`, `3 iterations`.
fn plural(n: usize, noun: &str) -> String {
    format!("{n} {noun}{}", if n == 1 { "" } else { "s" })
}
