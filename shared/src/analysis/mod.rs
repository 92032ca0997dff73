//! Analyses over a [`Trace`]: summary, per-layer statistics, the decimated memory timeline and
//! the allocator's segment state at any moment. Everything the viewer draws is computed here.
//! [`profile`] computes operator ranks, tensor classes and activation liveness; [`sweep`] holds
//! batch-size sweep results.

pub mod active;
pub mod advice;
pub mod budget;
pub mod categories;
pub mod diff;
pub mod flame;
pub mod holders;
pub mod iterations;
pub mod leaks;
pub mod ledger;
pub mod oom;
pub mod pools;
pub mod profile;
pub mod search;
pub mod sweep;
mod timeline;
pub mod timeline_index;
pub mod view_math;

pub(crate) use timeline::{same_lengths, Buckets};
pub use timeline::{timeline, timeline_columns, TimelineOptions, TimelinePoint};

use crate::allocator::{AllocatorConfig, AllocatorState};
use crate::model::{EventType, SegmentInfo, Totals, Trace};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The numbers a user asks for first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// Seconds since trace start at which `peak_allocated_bytes` was first reached.
    pub peak_time_s: f64,
    pub peak_reserved_time_s: f64,
    /// Index of the event at the allocated peak; `None` when the peak predates every event.
    pub peak_event_index: Option<usize>,
    /// Layer of the event that reached the peak.
    pub peak_layer: Option<String>,
    /// Device of the peak (`cuda:0`).
    pub peak_device: Option<String>,
    pub avg_fragmentation: f64,
    pub final_allocated_bytes: u64,
    pub final_reserved_bytes: u64,
    pub total_events: usize,
    pub total_allocations: usize,
    pub total_deallocations: usize,
    pub total_layers: usize,
    pub total_ops: usize,
    pub dropped_events: u64,
    pub duration_s: f64,
    pub source_format: String,
    /// Pinned host memory's own totals (never part of the numbers above, which are the GPUs').
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_host: Option<pools::MemoryTotals>,
    /// Every private pool's totals (CUDA graphs, `torch.cuda.MemPool`), and the default pool's
    /// beside them, when the trace has private pools.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<pools::PoolTotals>,
    /// Annotations (`_annotate_tensor`) and events with user metadata.
    #[serde(default, skip_serializing_if = "pools::NoteCounts::is_empty")]
    pub notes: pools::NoteCounts,
}

impl Summary {
    /// Whether reserved memory does not exist in this trace: its peak is on the CPU, whose
    /// allocator caches nothing, so its reserved figures are "n/a" rather than 0 B
    /// (`collector summary` and the viewer's summary say so).
    pub fn reserved_not_applicable(&self) -> bool {
        self.peak_reserved_bytes == 0 && self.peak_device.as_deref().is_some_and(|d| d.starts_with("cpu"))
    }
}

/// The fragmentation ratio of `t`, or 0 where the trace was recorded without fragmentation
/// tracking (`TraceMeta::fragmentation_tracked`).
fn frag(trace: &Trace, t: crate::model::Totals) -> f64 {
    if trace.meta.fragmentation_tracked {
        t.fragmentation_ratio()
    } else {
        0.0
    }
}

/// The totals of every device together.
fn all_devices(per_device: &[Totals]) -> Totals {
    per_device.iter().fold(Totals::default(), |a, t| Totals {
        allocated_bytes: a.allocated_bytes + t.allocated_bytes,
        reserved_bytes: a.reserved_bytes + t.reserved_bytes,
    })
}

/// Computes the [`Summary`].
pub fn summary(trace: &Trace) -> Summary {
    let start = trace.start_ns();
    let ev = &trace.events;
    let mut peak_alloc = (0u64, None::<usize>);
    let mut peak_res = (0u64, None::<usize>);
    let mut peak_dev = None;
    // Pinned host memory has totals of its own, reported apart.
    let host = trace.devices.iter().position(crate::model::Device::is_pinned_host);
    for (d, t) in ev.base_totals.iter().enumerate() {
        if Some(d) == host {
            continue;
        }
        if t.allocated_bytes > peak_alloc.0 {
            peak_alloc = (t.allocated_bytes, None);
            peak_dev = Some(d);
        }
        if t.reserved_bytes > peak_res.0 {
            peak_res = (t.reserved_bytes, None);
        }
    }
    let mut frag_sum = 0.0;
    let (mut allocs, mut frees, mut host_events) = (0, 0, 0);
    let mut cursor = ev.cursor();
    for i in 0..ev.len() {
        let t = cursor.advance();
        if Some(ev.device[i] as usize) == host {
            host_events += 1;
            continue;
        }
        if t.allocated_bytes > peak_alloc.0 {
            peak_alloc = (t.allocated_bytes, Some(i));
            peak_dev = Some(ev.device[i] as usize);
        }
        if t.reserved_bytes > peak_res.0 {
            peak_res = (t.reserved_bytes, Some(i));
        }
        frag_sum += frag(trace, t);
        match ev.event_type(i) {
            EventType::Alloc => allocs += 1,
            EventType::Free => frees += 1,
            _ => {}
        }
    }
    let gpus: Vec<Totals> = cursor.all_devices().iter().enumerate().filter(|&(d, _)| Some(d) != host).map(|(_, t)| *t).collect();
    let final_totals = all_devices(&gpus);
    let gpu_events = ev.len() - host_events;
    let secs = |i: Option<usize>| i.map_or(0.0, |i| ev.ts_ns[i].saturating_sub(start) as f64 * 1e-9);
    Summary {
        peak_allocated_bytes: peak_alloc.0,
        peak_reserved_bytes: peak_res.0,
        peak_time_s: secs(peak_alloc.1),
        peak_reserved_time_s: secs(peak_res.1),
        peak_event_index: peak_alloc.1,
        peak_layer: peak_alloc.1.and_then(|i| trace.opt_str(ev.layer[i])).map(str::to_owned),
        peak_device: peak_dev.and_then(|d| trace.devices.get(d)).map(|d| d.to_string()),
        // Without events, the state before them (a snapshot taken without its recorder on).
        avg_fragmentation: if gpu_events == 0 { frag(trace, final_totals) } else { frag_sum / gpu_events as f64 },
        final_allocated_bytes: final_totals.allocated_bytes,
        final_reserved_bytes: final_totals.reserved_bytes,
        total_events: ev.len(),
        total_allocations: allocs,
        total_deallocations: frees,
        total_layers: layer_names(trace).len(),
        total_ops: trace.ops.len(),
        dropped_events: trace.dropped_events,
        duration_s: trace.end_ns().saturating_sub(start) as f64 * 1e-9,
        source_format: trace.meta.source_format.as_str().to_owned(),
        pinned_host: host.map(|d| pools::device_totals(trace, d)),
        pools: if trace.pools.is_empty() { Vec::new() } else { pools::pool_totals(trace) },
        notes: pools::NoteCounts::of(trace),
    }
}

fn layer_names(trace: &Trace) -> std::collections::BTreeSet<&str> {
    let mut names = std::collections::BTreeSet::new();
    for &l in &trace.events.layer {
        if let Some(s) = trace.opt_str(l) {
            names.insert(s);
        }
    }
    for s in &trace.scopes {
        if let Some(n) = trace.opt_str(s.name) {
            names.insert(n);
        }
    }
    names
}

/// Memory statistics of one layer, as in the MemoryTracer API.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerMemoryStats {
    pub layer_name: String,
    /// Highest `allocated_bytes` seen at an event attributed to this layer.
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    pub total_allocations: u64,
    pub total_deallocations: u64,
    /// Mean fragmentation ratio over the layer's events.
    pub avg_fragmentation: f64,
    /// Time spent in the layer's scopes; for layers named after operators, in those operators;
    /// for layers known only from events (snapshots), the span from its first to its last event.
    pub duration_ms: f64,
    /// Bytes allocated in the layer (sum of its allocation sizes).
    pub allocated_bytes_total: u64,
    /// Of `allocated_bytes_total`, those allocated in a private pool: a CUDA graph's (memory
    /// `torch.compile(mode="reduce-overhead")` keeps for its replays) or a `torch.cuda.MemPool`.
    #[serde(default)]
    pub private_pool_bytes: u64,
}

/// Per-layer statistics keyed by layer name (sorted, so output is deterministic).
pub fn layer_stats(trace: &Trace) -> BTreeMap<String, LayerMemoryStats> {
    struct Acc {
        peak_a: u64,
        peak_r: u64,
        allocs: u64,
        frees: u64,
        frag: f64,
        n: u64,
        first: u64,
        last: u64,
        bytes: u64,
        pool_bytes: u64,
        scope_ns: u64,
        has_scope: bool,
    }
    let fresh = || Acc {
        peak_a: 0,
        peak_r: 0,
        allocs: 0,
        frees: 0,
        frag: 0.0,
        n: 0,
        first: u64::MAX,
        last: 0,
        bytes: 0,
        pool_bytes: 0,
        scope_ns: 0,
        has_scope: false,
    };
    let mut acc: BTreeMap<u32, Acc> = BTreeMap::new();
    let ev = &trace.events;
    // Pinned host memory's totals are not a GPU's: its events make no layer's peaks.
    let host = trace.devices.iter().position(crate::model::Device::is_pinned_host);
    let mut cursor = ev.cursor();
    let mut pools = pools::event_pools(trace);
    for i in 0..ev.len() {
        let t = cursor.advance();
        let pool = pools.next().flatten();
        let l = ev.layer[i];
        if l.is_none() || Some(ev.device[i] as usize) == host {
            continue;
        }
        let a = acc.entry(l.0).or_insert_with(fresh);
        a.peak_a = a.peak_a.max(t.allocated_bytes);
        a.peak_r = a.peak_r.max(t.reserved_bytes);
        a.frag += frag(trace, t);
        a.n += 1;
        a.first = a.first.min(ev.ts_ns[i]);
        a.last = a.last.max(ev.ts_ns[i]);
        match ev.event_type(i) {
            EventType::Alloc => {
                a.allocs += 1;
                a.bytes += ev.size_bytes[i];
                if pool.is_some() {
                    a.pool_bytes += ev.size_bytes[i];
                }
            }
            EventType::Free => a.frees += 1,
            _ => {}
        }
    }
    for s in &trace.scopes {
        if s.name.is_none() {
            continue;
        }
        let a = acc.entry(s.name.0).or_insert_with(fresh);
        a.scope_ns += s.end_ns.saturating_sub(s.start_ns);
        a.has_scope = true;
    }
    // Layers named after operators (profiler traces without module events) take their time
    // from those operators.
    let mut op_ns: std::collections::HashMap<u32, u64> = std::collections::HashMap::new();
    for o in &trace.ops {
        if acc.contains_key(&o.name.0) {
            *op_ns.entry(o.name.0).or_default() += o.end_ns.saturating_sub(o.start_ns);
        }
    }
    acc.into_iter()
        .filter_map(|(id, a)| {
            let name = trace.opt_str(crate::model::StrId(id))?.to_owned();
            let duration_ns = if a.has_scope {
                a.scope_ns
            } else if let Some(&ns) = op_ns.get(&id) {
                ns
            } else if a.n > 0 {
                a.last - a.first
            } else {
                0
            };
            Some((
                name.clone(),
                LayerMemoryStats {
                    layer_name: name,
                    peak_allocated: a.peak_a,
                    peak_reserved: a.peak_r,
                    total_allocations: a.allocs,
                    total_deallocations: a.frees,
                    avg_fragmentation: if a.n == 0 { 0.0 } else { a.frag / a.n as f64 },
                    duration_ms: duration_ns as f64 * 1e-6,
                    allocated_bytes_total: a.bytes,
                    private_pool_bytes: a.pool_bytes,
                },
            ))
        })
        .collect()
}

/// Layers ordered by peak allocated, highest first (ties by name).
pub fn top_layers_by_peak(stats: &BTreeMap<String, LayerMemoryStats>, n: usize) -> Vec<&LayerMemoryStats> {
    let mut v: Vec<&LayerMemoryStats> = stats.values().collect();
    v.sort_by(|a, b| b.peak_allocated.cmp(&a.peak_allocated).then_with(|| a.layer_name.cmp(&b.layer_name)));
    v.truncate(n);
    v
}

/// `get_peak_memory_per_layer`: layer name → peak allocated bytes.
pub fn peak_memory_per_layer(trace: &Trace) -> BTreeMap<String, u64> {
    layer_stats(trace).into_iter().map(|(k, v)| (k, v.peak_allocated)).collect()
}

/// `get_fragmentation_stats`: overall and per-layer fragmentation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FragmentationStats {
    pub avg_fragmentation: f64,
    pub max_fragmentation: f64,
    /// Bytes reserved but not allocated at the allocated peak.
    pub unused_reserved_at_peak_bytes: u64,
    pub per_layer: BTreeMap<String, f64>,
}

pub fn fragmentation_stats(trace: &Trace) -> FragmentationStats {
    fragmentation_stats_with_layers(trace, &layer_stats(trace))
}

/// [`fragmentation_stats`] for a caller that already has the [`layer_stats`].
pub fn fragmentation_stats_with_layers(trace: &Trace, layers: &BTreeMap<String, LayerMemoryStats>) -> FragmentationStats {
    let ev = &trace.events;
    let mut cursor = ev.cursor();
    let (mut sum, mut max) = (0.0f64, 0.0f64);
    // The peak may be the state before the first event (as the summary counts it): a snapshot
    // without trace entries is only that state.
    let mut peak = (0u64, 0u64);
    for t in &ev.base_totals {
        if t.allocated_bytes > peak.0 {
            peak = (t.allocated_bytes, t.reserved_bytes.saturating_sub(t.allocated_bytes));
        }
    }
    if ev.is_empty() {
        // All devices together, as the summary's average is.
        max = frag(trace, all_devices(&ev.base_totals));
    }
    for _ in 0..ev.len() {
        let t = cursor.advance();
        let f = frag(trace, t);
        sum += f;
        max = max.max(f);
        if t.allocated_bytes > peak.0 {
            peak = (t.allocated_bytes, t.reserved_bytes.saturating_sub(t.allocated_bytes));
        }
    }
    FragmentationStats {
        // Without events: the state before them, as the worst one.
        avg_fragmentation: if ev.is_empty() { max } else { sum / ev.len() as f64 },
        max_fragmentation: max,
        unused_reserved_at_peak_bytes: peak.1,
        per_layer: layers.iter().map(|(k, v)| (k.clone(), v.avg_fragmentation)).collect(),
    }
}

/// The median of `values` (the mean of the two middle ones for an even count), sorting them in
/// place; `None` when there are none.
pub fn median_f64(values: &mut [f64]) -> Option<f64> {
    values.sort_unstable_by(f64::total_cmp);
    match values.len() {
        0 => None,
        n if n % 2 == 1 => Some(values[n / 2]),
        n => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

/// The highest allocated total of any device: where, how much, and the event that first
/// reached it (`None` when the peak predates every event).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocatedPeak {
    pub device: u8,
    pub bytes: u64,
    pub event: Option<usize>,
}

pub fn allocated_peak(trace: &Trace) -> AllocatedPeak {
    let ev = &trace.events;
    let mut best = AllocatedPeak { device: 0, bytes: 0, event: None };
    for (d, t) in ev.base_totals.iter().enumerate() {
        if t.allocated_bytes > best.bytes {
            best = AllocatedPeak { device: d as u8, bytes: t.allocated_bytes, event: None };
        }
    }
    let mut cursor = ev.cursor();
    for i in 0..ev.len() {
        let t = cursor.advance();
        if t.allocated_bytes > best.bytes {
            best = AllocatedPeak { device: ev.device[i], bytes: t.allocated_bytes, event: Some(i) };
        }
    }
    best
}

/// One device's peaks (every device of a merged multi-rank trace has its own).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DevicePeak {
    /// `cuda:0`, `cuda:0 (rank 1)`.
    pub device: String,
    pub rank: Option<u32>,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// Seconds since trace start at which `peak_allocated_bytes` was first reached.
    pub peak_time_s: f64,
    /// The layer (module path) of the allocation that reached the peak; empty when the peak
    /// is memory from before the trace or the allocation had no layer.
    #[serde(default)]
    pub peak_layer: String,
    pub events: usize,
}

/// The peaks of every device, in device order (memory from before the first event counts).
pub fn device_peaks(trace: &Trace) -> Vec<DevicePeak> {
    let mut out: Vec<DevicePeak> = trace
        .devices
        .iter()
        .enumerate()
        .map(|(k, d)| {
            let base = trace.events.base_totals.get(k).copied().unwrap_or_default();
            DevicePeak {
                device: d.to_string(),
                rank: d.rank,
                peak_allocated_bytes: base.allocated_bytes,
                peak_reserved_bytes: base.reserved_bytes,
                peak_time_s: 0.0,
                peak_layer: String::new(),
                events: 0,
            }
        })
        .collect();
    let mut at_peak: Vec<Option<usize>> = vec![None; out.len()];
    let start = trace.start_ns();
    let mut cur = trace.events.cursor();
    for i in 0..trace.events.len() {
        let t = cur.advance();
        let Some(p) = out.get_mut(trace.events.device[i] as usize) else { continue };
        p.events += 1;
        if t.allocated_bytes > p.peak_allocated_bytes {
            p.peak_allocated_bytes = t.allocated_bytes;
            p.peak_time_s = trace.events.ts_ns[i].saturating_sub(start) as f64 / 1e9;
            at_peak[trace.events.device[i] as usize] = Some(i);
        }
        p.peak_reserved_bytes = p.peak_reserved_bytes.max(t.reserved_bytes);
    }
    for (p, at) in out.iter_mut().zip(at_peak) {
        p.peak_layer = at.map(|i| trace.str(trace.events.layer[i]).to_owned()).unwrap_or_default();
    }
    out
}

/// The device whose allocated bytes peak highest.
pub fn peak_device(trace: &Trace) -> u8 {
    allocated_peak(trace).device
}

/// True if the trace carries allocator segment information (snapshot traces).
pub fn has_segments(trace: &Trace) -> bool {
    !trace.initial_segments.is_empty() || (0..trace.events.len()).any(|i| trace.events.event_type(i) == EventType::SegmentAlloc)
}

/// Segments and blocks of `device` after event `event_index` (inclusive), replayed from the
/// state before the first event. Empty for traces without segment information.
pub fn segments_at(trace: &Trace, event_index: usize, device: u8) -> Vec<SegmentInfo> {
    replayed_segments(trace, event_index.saturating_add(1), device)
}

/// Segments and blocks of `device` before the first event: a snapshot's state when recording
/// began, or, without trace entries, when it was taken. Free space is listed as free blocks,
/// as [`segments_at`] lists it.
pub fn segments_before_events(trace: &Trace, device: u8) -> Vec<SegmentInfo> {
    replayed_segments(trace, 0, device)
}

/// The segments after the first `events` events of `device`.
fn replayed_segments(trace: &Trace, events: usize, device: u8) -> Vec<SegmentInfo> {
    let mut state = AllocatorState::new(AllocatorConfig::default());
    for s in trace.initial_segments.iter().filter(|s| s.device == device) {
        state.add_segment_info(s);
    }
    let ev = &trace.events;
    let end = events.min(ev.len());
    for i in 0..end {
        if ev.device[i] != device {
            continue;
        }
        let (addr, size) = (ev.address[i], ev.size_bytes[i]);
        match ev.event_type(i) {
            EventType::SegmentAlloc | EventType::SegmentMap => {
                let pool =
                    if size == crate::allocator::SMALL_SEGMENT_BYTES { crate::model::Pool::Small } else { crate::model::Pool::Large };
                state.segment_alloc(addr, size, device, ev.stream[i], pool);
                state.set_private_pool(addr, trace.event_pool(i));
            }
            EventType::SegmentFree | EventType::SegmentUnmap => {
                state.segment_free(addr);
            }
            EventType::Alloc => state.alloc_block(addr, size),
            EventType::Free => {
                state.free_requested(addr);
            }
            EventType::FreeCompleted => {
                state.free(addr);
            }
            _ => {}
        }
    }
    state.segments()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Device, EventRecord, Phase, SourceFormat, StrId, TraceMeta};

    fn small_trace() -> Trace {
        let mut t = Trace::new(TraceMeta::new(SourceFormat::MemoryTracer));
        let d = t.device_index(Device { kind: "cuda".into(), index: 0, rank: None });
        let s = t.stream_index("default");
        let l1 = t.strings.intern("layer1");
        let l2 = t.strings.intern("layer2");
        let mut push = |ts, et, size, layer: StrId, totals| {
            t.events.push(EventRecord {
                ts_ns: ts,
                event_type: et,
                phase: Phase::Forward,
                size_bytes: size,
                address: ts,
                layer,
                device: d,
                stream: s,
                totals,
            })
        };
        push(0, EventType::SegmentAlloc, 1000, StrId::NONE, None);
        push(10, EventType::Alloc, 400, l1, None);
        push(20, EventType::Alloc, 500, l2, None);
        push(30, EventType::Free, 400, l2, None);
        push(40, EventType::Alloc, 100, l1, None);
        t
    }

    #[test]
    fn fragmentation_reads_zero_when_not_tracked() {
        let mut t = small_trace();
        assert!(fragmentation_stats(&t).avg_fragmentation > 0.0);
        t.meta.fragmentation_tracked = false;
        let f = fragmentation_stats(&t);
        assert_eq!((f.avg_fragmentation, f.max_fragmentation), (0.0, 0.0));
        assert!(f.per_layer.values().all(|&v| v == 0.0));
        assert_eq!(summary(&t).avg_fragmentation, 0.0);
        // The totals themselves stay true.
        assert_eq!(summary(&t).peak_reserved_bytes, 1000);
    }

    #[test]
    fn summary_finds_peak_and_time() {
        let t = small_trace();
        let s = summary(&t);
        assert_eq!(s.peak_allocated_bytes, 900);
        assert_eq!(s.peak_reserved_bytes, 1000);
        assert_eq!(s.peak_event_index, Some(2));
        assert!((s.peak_time_s - 20e-9).abs() < 1e-15);
        assert_eq!(s.peak_layer.as_deref(), Some("layer2"));
        assert_eq!(s.final_allocated_bytes, 600);
        assert_eq!((s.total_allocations, s.total_deallocations), (3, 1));
        // Fragmentation after each event: 1, 0.6, 0.1, 0.5, 0.4.
        assert!((s.avg_fragmentation - 2.6 / 5.0).abs() < 1e-12);
    }

    /// Reserved memory is "n/a" on the CPU (nothing reserved there), never on a GPU.
    #[test]
    fn reserved_does_not_apply_on_the_cpu() {
        assert!(!summary(&small_trace()).reserved_not_applicable());
        let mut t = Trace::new(TraceMeta::new(SourceFormat::MemoryTracer));
        let d = t.device_index(Device { kind: "cpu".into(), index: 0, rank: None });
        let s = t.stream_index("default");
        let record = |ts, event_type| EventRecord {
            ts_ns: ts,
            event_type,
            phase: Phase::Forward,
            size_bytes: 64,
            address: 1,
            layer: StrId::NONE,
            device: d,
            stream: s,
            totals: None,
        };
        t.events.push(record(0, EventType::Alloc));
        t.events.push(record(10, EventType::Free));
        let s = summary(&t);
        assert_eq!((s.peak_allocated_bytes, s.peak_reserved_bytes), (64, 0));
        assert!(s.reserved_not_applicable(), "{:?}", s.peak_device);
    }

    #[test]
    fn layer_stats_attribute_by_layer() {
        let t = small_trace();
        let st = layer_stats(&t);
        assert_eq!(st["layer1"].peak_allocated, 600);
        assert_eq!(st["layer1"].total_allocations, 2);
        assert_eq!(st["layer2"].peak_allocated, 900);
        assert_eq!(st["layer2"].total_deallocations, 1);
        assert!((st["layer2"].avg_fragmentation - 0.3).abs() < 1e-12);
    }

    #[test]
    fn timeline_keeps_the_peak_when_decimated() {
        let t = small_trace();
        let tl = timeline(&t, &TimelineOptions::default().with_buckets(2));
        assert_eq!(tl.len(), 2);
        assert_eq!(tl.iter().map(|p| p.allocated_max_bytes).max(), Some(900));
    }
}

/// Allocation events still live after event `event_index` (inclusive): indices of their
/// `Alloc` events, in allocation order. Memory allocated before the first event is not listed.
pub fn live_allocations_at(trace: &Trace, event_index: usize) -> Vec<usize> {
    let ev = &trace.events;
    let end = event_index.saturating_add(1).min(ev.len());
    let mut live: crate::hash::FastMap<(u8, u64), usize> = Default::default();
    for i in 0..end {
        match ev.event_type(i) {
            EventType::Alloc => {
                live.insert((ev.device[i], ev.address[i]), i);
            }
            EventType::Free => {
                live.remove(&(ev.device[i], ev.address[i]));
            }
            _ => {}
        }
    }
    let mut v: Vec<usize> = live.into_values().collect();
    v.sort_unstable();
    v
}

/// A span on one thread for nested displays (speedscope, Perfetto, flame charts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub start_ns: u64,
    pub end_ns: u64,
    pub name: crate::model::StrId,
    pub thread: u64,
}

/// Scopes and operators as properly nested spans per thread: sorted by start, and a span that
/// outlives its parent is cut at the parent's end (sources such as the profiler can report
/// slightly overlapping siblings). Threads come in ascending order.
pub fn nested_spans(trace: &Trace) -> Vec<(u64, Vec<Span>)> {
    let mut by_thread: BTreeMap<u64, Vec<Span>> = BTreeMap::new();
    for s in &trace.scopes {
        by_thread.entry(s.thread).or_default().push(Span { start_ns: s.start_ns, end_ns: s.end_ns, name: s.name, thread: s.thread });
    }
    for o in &trace.ops {
        by_thread.entry(o.thread).or_default().push(Span { start_ns: o.start_ns, end_ns: o.end_ns, name: o.name, thread: o.thread });
    }
    by_thread
        .into_iter()
        .map(|(tid, mut spans)| {
            spans.sort_by_key(|s| (s.start_ns, std::cmp::Reverse(s.end_ns), s.name));
            let mut stack: Vec<u64> = Vec::new(); // ends of open spans
            for s in &mut spans {
                while stack.last().is_some_and(|&e| e <= s.start_ns) {
                    stack.pop();
                }
                if let Some(&parent_end) = stack.last() {
                    s.end_ns = s.end_ns.min(parent_end);
                }
                stack.push(s.end_ns);
            }
            (tid, spans)
        })
        .collect()
}
