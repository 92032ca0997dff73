//! Memory by pool and apart from the GPUs: every private pool's totals over time (CUDA
//! graphs and `torch.cuda.MemPool` allocate from their own pools), pinned host memory's
//! totals, and how many events carry annotations and metadata.

use crate::model::{BlockState, EventType, NoteKind, Totals, Trace};
use serde::{Deserialize, Serialize};

/// Peak and final totals of one device or pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryTotals {
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub final_allocated_bytes: u64,
    pub final_reserved_bytes: u64,
}

impl MemoryTotals {
    fn start(t: Totals) -> Self {
        Self {
            peak_allocated_bytes: t.allocated_bytes,
            peak_reserved_bytes: t.reserved_bytes,
            final_allocated_bytes: t.allocated_bytes,
            final_reserved_bytes: t.reserved_bytes,
        }
    }

    fn see(&mut self, t: Totals) {
        self.peak_allocated_bytes = self.peak_allocated_bytes.max(t.allocated_bytes);
        self.peak_reserved_bytes = self.peak_reserved_bytes.max(t.reserved_bytes);
        self.final_allocated_bytes = t.allocated_bytes;
        self.final_reserved_bytes = t.reserved_bytes;
    }
}

/// One pool of one device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolTotals {
    /// PyTorch's id, `(0, 0)` for the device's default pool.
    pub pool: String,
    /// Index into `Trace::pools`; `None` for the default pool.
    pub index: Option<u16>,
    pub device: String,
    #[serde(flatten)]
    pub totals: MemoryTotals,
    pub allocations: usize,
    /// False where the trace has no segments (a traced run records allocations only): the
    /// reserved fields are then 0, not measured.
    #[serde(default = "known")]
    pub reserved_known: bool,
}

fn known() -> bool {
    true
}

/// Every event's private pool (index into `Trace::pools`), in event order.
pub fn event_pools(trace: &Trace) -> impl Iterator<Item = Option<u16>> + '_ {
    crate::model::per_event(&trace.event_pools, trace.events.len())
}

/// Adds a segment that existed before the first event: its size reserved, its allocated blocks.
fn add_segment(t: &mut Totals, s: &crate::model::SegmentInfo) {
    t.reserved_bytes += s.size_bytes;
    t.allocated_bytes += s.blocks.iter().filter(|b| b.state == BlockState::Allocated).map(|b| b.size_bytes).sum::<u64>();
}

/// The totals of device `d` (its own events only).
pub fn device_totals(trace: &Trace, d: usize) -> MemoryTotals {
    let ev = &trace.events;
    let mut out = MemoryTotals::start(ev.base_totals.get(d).copied().unwrap_or_default());
    let mut cursor = ev.cursor();
    for i in 0..ev.len() {
        let t = cursor.advance();
        if ev.device[i] as usize == d {
            out.see(t);
        }
    }
    out
}

/// Every (device, pool) that holds memory: the default pool of each device that has a private
/// one, and every private pool. Allocated counts blocks, reserved the pool's segments, as
/// PyTorch's per-pool statistics do; events without a pool belong to the default pool.
pub fn pool_totals(trace: &Trace) -> Vec<PoolTotals> {
    // Slot of (device, pool): pool index + 1, 0 for the default pool.
    let slots = trace.pools.len() + 1;
    let slot = |device: u8, pool: Option<u16>| device as usize * slots + pool.map_or(0, |p| p as usize + 1);
    let mut running = vec![Totals::default(); trace.devices.len() * slots];
    let mut allocations = vec![0usize; running.len()];
    for s in &trace.initial_segments {
        add_segment(&mut running[slot(s.device, s.private_pool)], s);
    }
    // Memory alive before the first event outside every known segment counts in the default pool.
    for (d, base) in trace.events.base_totals.iter().enumerate().take(trace.devices.len()) {
        let known: u64 = (0..slots).map(|k| running[d * slots + k].allocated_bytes).sum();
        running[d * slots].allocated_bytes += base.allocated_bytes.saturating_sub(known);
    }
    let mut totals: Vec<MemoryTotals> = running.iter().map(|&t| MemoryTotals::start(t)).collect();
    let mut used = vec![false; running.len()];
    let ev = &trace.events;
    for (i, pool) in event_pools(trace).enumerate() {
        let k = slot(ev.device[i], pool);
        let t = &mut running[k];
        *t = t.after(ev.event_type(i), ev.size_bytes[i]);
        totals[k].see(*t);
        used[k] = true;
        if ev.event_type(i) == EventType::Alloc {
            allocations[k] += 1;
        }
    }
    let reserved_known = super::has_segments(trace);
    let mut out = Vec::new();
    for (d, device) in trace.devices.iter().enumerate() {
        let has_private = (1..slots).any(|p| used[d * slots + p] || running[d * slots + p] != Totals::default());
        for p in 0..slots {
            let k = d * slots + p;
            let present = used[k] || totals[k] != MemoryTotals::default();
            if !present || (p == 0 && !has_private) {
                continue;
            }
            let index = (p > 0).then(|| (p - 1) as u16);
            let pool = index.map_or_else(|| "(0, 0)".to_owned(), |i| trace.pools[i as usize].to_string());
            out.push(PoolTotals {
                pool,
                index,
                device: device.to_string(),
                totals: totals[k],
                allocations: allocations[k],
                reserved_known,
            });
        }
    }
    out
}

/// How many events carry each kind of note.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoteCounts {
    /// Annotations attached to allocations (`torch.cuda.memory._annotate_tensor`).
    pub annotations: usize,
    /// Events recorded while the thread had metadata set (`_set_memory_metadata`).
    pub user_metadata: usize,
    /// Events the allocator tagged itself (`internal_metadata`).
    pub internal: usize,
}

impl NoteCounts {
    pub fn of(trace: &Trace) -> Self {
        let mut c = Self::default();
        for n in &trace.event_notes {
            match n.kind {
                NoteKind::Annotation => c.annotations += 1,
                NoteKind::UserMetadata => c.user_metadata += 1,
                NoteKind::Internal => c.internal += 1,
            }
        }
        c
    }

    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// One (device, pool, stream)'s allocated and reserved memory over time: the Pools view's
/// panel, as memory_viz splits private pools.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PoolCurve {
    pub device_index: u8,
    pub device: String,
    /// `(0, 0)` for the default pool.
    pub pool: String,
    pub private: bool,
    pub stream: String,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// A point per bucket with events of this panel, and one at the start.
    #[serde(with = "super::timeline_columns")]
    pub points: Vec<super::TimelinePoint>,
}

/// Most panels the Pools view is given (the largest pools by peak reserved first).
pub const MAX_POOL_CURVES: usize = 64;

/// Every (device, pool, stream) that holds memory, over `buckets` equal spans of the trace;
/// pinned host memory is its own device. Largest peak reserved first, at most
/// [`MAX_POOL_CURVES`].
pub fn pool_curves(trace: &Trace, buckets: usize) -> Vec<PoolCurve> {
    use crate::hash::FastMap;
    let buckets = buckets.clamp(1, 20_000);
    let start = trace.start_ns();
    let span = trace.end_ns().saturating_sub(start).max(1) as f64;
    let bucket_of = |ts: u64| ((ts.saturating_sub(start) as f64 / span * buckets as f64) as usize).min(buckets - 1);
    let t_of = |b: usize| b as f64 * span / buckets as f64 * 1e-9;
    struct Panel {
        running: Totals,
        points: Vec<super::TimelinePoint>,
        peak: Totals,
    }
    let mut panels: FastMap<(u8, Option<u16>, u16), Panel> = FastMap::default();
    let new_panel = |t: Totals| Panel {
        running: t,
        points: vec![super::TimelinePoint {
            t_s: 0.0,
            allocated_min_bytes: t.allocated_bytes,
            allocated_max_bytes: t.allocated_bytes,
            reserved_max_bytes: t.reserved_bytes,
            allocated_last_bytes: t.allocated_bytes,
            reserved_last_bytes: t.reserved_bytes,
            first_event: 0,
        }],
        peak: t,
    };
    let mut initial: FastMap<(u8, Option<u16>, u16), Totals> = FastMap::default();
    for s in &trace.initial_segments {
        add_segment(initial.entry((s.device, s.private_pool, s.stream)).or_default(), s);
    }
    for (k, t) in initial {
        panels.insert(k, new_panel(t));
    }
    let ev = &trace.events;
    for (i, pool) in event_pools(trace).enumerate() {
        let panel = panels.entry((ev.device[i], pool, ev.stream[i])).or_insert_with(|| new_panel(Totals::default()));
        panel.running = panel.running.after(ev.event_type(i), ev.size_bytes[i]);
        let t = panel.running;
        panel.peak.allocated_bytes = panel.peak.allocated_bytes.max(t.allocated_bytes);
        panel.peak.reserved_bytes = panel.peak.reserved_bytes.max(t.reserved_bytes);
        let t_s = t_of(bucket_of(ev.ts_ns[i]));
        match panel.points.last_mut() {
            Some(p) if p.t_s == t_s && i > 0 => {
                p.allocated_min_bytes = p.allocated_min_bytes.min(t.allocated_bytes);
                p.allocated_max_bytes = p.allocated_max_bytes.max(t.allocated_bytes);
                p.reserved_max_bytes = p.reserved_max_bytes.max(t.reserved_bytes);
                p.allocated_last_bytes = t.allocated_bytes;
                p.reserved_last_bytes = t.reserved_bytes;
            }
            _ => panel.points.push(super::TimelinePoint {
                t_s,
                allocated_min_bytes: t.allocated_bytes,
                allocated_max_bytes: t.allocated_bytes,
                reserved_max_bytes: t.reserved_bytes,
                allocated_last_bytes: t.allocated_bytes,
                reserved_last_bytes: t.reserved_bytes,
                first_event: i,
            }),
        }
    }
    let mut out: Vec<PoolCurve> = panels
        .into_iter()
        .filter(|(_, p)| p.peak != Totals::default())
        .map(|((d, pool, stream), p)| PoolCurve {
            device_index: d,
            device: trace.devices.get(d as usize).map(ToString::to_string).unwrap_or_default(),
            pool: pool.map_or_else(|| "(0, 0)".to_owned(), |k| trace.pools.get(k as usize).map(ToString::to_string).unwrap_or_default()),
            private: pool.is_some(),
            stream: trace.streams.get(stream as usize).map(|&s| trace.str(s).to_owned()).unwrap_or_default(),
            peak_allocated_bytes: p.peak.allocated_bytes,
            peak_reserved_bytes: p.peak.reserved_bytes,
            points: p.points,
        })
        .collect();
    out.sort_by(|a, b| {
        (a.device_index, std::cmp::Reverse(a.peak_reserved_bytes), &a.pool, &a.stream).cmp(&(
            b.device_index,
            std::cmp::Reverse(b.peak_reserved_bytes),
            &b.pool,
            &b.stream,
        ))
    });
    out.truncate(MAX_POOL_CURVES);
    out
}
