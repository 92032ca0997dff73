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
        let t = &mut running[slot(s.device, s.private_pool)];
        t.reserved_bytes += s.size_bytes;
        t.allocated_bytes += s.blocks.iter().filter(|b| b.state == BlockState::Allocated).map(|b| b.size_bytes).sum::<u64>();
    }
    // Memory alive before the first event outside every known segment counts in the default pool.
    for (d, base) in trace.events.base_totals.iter().enumerate().take(trace.devices.len()) {
        let known: u64 = (0..slots).map(|k| running[d * slots + k].allocated_bytes).sum();
        running[d * slots].allocated_bytes += base.allocated_bytes.saturating_sub(known);
    }
    let mut totals: Vec<MemoryTotals> = running.iter().map(|&t| MemoryTotals::start(t)).collect();
    let mut used = vec![false; running.len()];
    let ev = &trace.events;
    let mut pools = trace.event_pools.iter().peekable();
    for i in 0..ev.len() {
        let mut pool = None;
        while let Some(&&(e, p)) = pools.peek() {
            if e as usize > i {
                break;
            }
            if e as usize == i {
                pool = Some(p);
            }
            pools.next();
        }
        let k = slot(ev.device[i], pool);
        let (da, dr) = ev.event_type(i).deltas(ev.size_bytes[i]);
        let t = &mut running[k];
        t.allocated_bytes = (t.allocated_bytes as i128 + da).clamp(0, u64::MAX as i128) as u64;
        t.reserved_bytes = (t.reserved_bytes as i128 + dr).clamp(0, u64::MAX as i128) as u64;
        totals[k].see(*t);
        used[k] = true;
        if ev.event_type(i) == EventType::Alloc {
            allocations[k] += 1;
        }
    }
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
            out.push(PoolTotals { pool, index, device: device.to_string(), totals: totals[k], allocations: allocations[k] });
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
