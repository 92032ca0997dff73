//! Memory events as columns ([`EventStore`], 32 bytes each), their kinds and phases, and the
//! running totals derived from them.
//!
//! Memory events are stored as columns rather than as a `Vec<MemoryEvent>`: the running totals
//! (`allocated_bytes`, `reserved_bytes`) are derived from the event kinds and sizes, plus a sparse
//! list of the places where the source reported a total that differs from the running sum. This
//! keeps a recorded event at 32 bytes while every total stays exactly what the source said.
//! [`MemoryEvent`] is the materialised, API-facing view of one event.

use super::StrId;
use serde::{Deserialize, Serialize};

/// What happened to memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum EventType {
    /// A block was handed out: `allocated_bytes` grows by `size_bytes`.
    Alloc = 0,
    /// A block was given back: `allocated_bytes` shrinks by `size_bytes`. For CUDA snapshots
    /// this is `free_requested`, the moment the allocator's counters drop.
    Free = 1,
    /// The allocator finished freeing a block (snapshot `free_completed`; after stream syncs).
    FreeCompleted = 2,
    /// A memory snapshot was taken.
    Snapshot = 3,
    LayerEnter = 4,
    LayerExit = 5,
    /// A segment was reserved from the device (`cudaMalloc`): `reserved_bytes` grows.
    SegmentAlloc = 6,
    /// A segment went back to the device: `reserved_bytes` shrinks.
    SegmentFree = 7,
    /// Expandable segments: pages mapped into a segment (`reserved_bytes` grows).
    SegmentMap = 8,
    /// Expandable segments: pages unmapped (`reserved_bytes` shrinks).
    SegmentUnmap = 9,
    /// The allocator ran out of memory; `size_bytes` is the request that failed.
    Oom = 10,
}

impl EventType {
    pub const ALL: [EventType; 11] = [
        EventType::Alloc,
        EventType::Free,
        EventType::FreeCompleted,
        EventType::Snapshot,
        EventType::LayerEnter,
        EventType::LayerExit,
        EventType::SegmentAlloc,
        EventType::SegmentFree,
        EventType::SegmentMap,
        EventType::SegmentUnmap,
        EventType::Oom,
    ];

    pub fn from_u8(v: u8) -> Option<Self> {
        Self::ALL.get(v as usize).copied()
    }

    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Alloc => "alloc",
            EventType::Free => "free",
            EventType::FreeCompleted => "free_completed",
            EventType::Snapshot => "snapshot",
            EventType::LayerEnter => "layer_enter",
            EventType::LayerExit => "layer_exit",
            EventType::SegmentAlloc => "segment_alloc",
            EventType::SegmentFree => "segment_free",
            EventType::SegmentMap => "segment_map",
            EventType::SegmentUnmap => "segment_unmap",
            EventType::Oom => "oom",
        }
    }

    /// How this event moves the (allocated, reserved) totals of its device.
    fn deltas(self, size_bytes: u64) -> (i128, i128) {
        let s = size_bytes as i128;
        match self {
            EventType::Alloc => (s, 0),
            EventType::Free => (-s, 0),
            EventType::SegmentAlloc | EventType::SegmentMap => (0, s),
            EventType::SegmentFree | EventType::SegmentUnmap => (0, -s),
            _ => (0, 0),
        }
    }
}

/// Which part of a training step an event or operator belongs to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Phase {
    Forward = 0,
    Backward = 1,
    Optimizer = 2,
    #[default]
    Other = 3,
}

impl Phase {
    pub fn from_u8(v: u8) -> Option<Self> {
        [Phase::Forward, Phase::Backward, Phase::Optimizer, Phase::Other].get(v as usize).copied()
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer",
            Phase::Other => "other",
        }
    }
}

/// Every event's row, as handed to [`EventStore::push`].
#[derive(Clone, Copy, Debug)]
pub struct EventRecord {
    pub ts_ns: u64,
    pub event_type: EventType,
    pub phase: Phase,
    pub size_bytes: u64,
    pub address: u64,
    pub layer: StrId,
    /// Index into [`Trace::devices`](super::Trace::devices).
    pub device: u8,
    /// Index into [`Trace::streams`](super::Trace::streams).
    pub stream: u16,
    /// Totals after this event as the source reported them; `None` means "derive them".
    pub totals: Option<Totals>,
}

/// Allocated and reserved bytes of one device at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
}

impl Totals {
    /// (reserved − allocated) / reserved, 0 when nothing is reserved.
    pub fn fragmentation_ratio(self) -> f64 {
        if self.reserved_bytes == 0 {
            0.0
        } else {
            self.reserved_bytes.saturating_sub(self.allocated_bytes) as f64 / self.reserved_bytes as f64
        }
    }

    /// The totals after an event of this type and size (as the event store derives them).
    pub fn after(self, event_type: EventType, size_bytes: u64) -> Totals {
        self.apply(event_type.deltas(size_bytes))
    }

    fn apply(self, (da, dr): (i128, i128)) -> Totals {
        let clamp = |v: i128| v.clamp(0, u64::MAX as i128) as u64;
        Totals { allocated_bytes: clamp(self.allocated_bytes as i128 + da), reserved_bytes: clamp(self.reserved_bytes as i128 + dr) }
    }
}

/// Where the source's totals differ from the running sum, the source wins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TotalsOverride {
    pub index: u32,
    pub totals: Totals,
}

const CHECKPOINT_EVERY: usize = 1024;

/// Memory events as columns. 32 bytes per event; totals are derived (see module docs).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct EventStore {
    pub ts_ns: Vec<u64>,
    pub size_bytes: Vec<u64>,
    pub address: Vec<u64>,
    pub layer: Vec<StrId>,
    /// `EventType` in the low 5 bits, `Phase` in the high 3.
    pub tag: Vec<u8>,
    pub device: Vec<u8>,
    pub stream: Vec<u16>,
    /// Totals of each device before the first event, indexed like
    /// [`Trace::devices`](super::Trace::devices).
    pub base_totals: Vec<Totals>,
    /// Sorted by index.
    pub overrides: Vec<TotalsOverride>,
    /// Per-device totals before every `CHECKPOINT_EVERY`-th event; rebuilt, never stored.
    #[serde(skip)]
    checkpoints: Vec<Totals>,
    #[serde(skip)]
    running: Vec<Totals>,
}

impl EventStore {
    pub fn new(base_totals: Vec<Totals>) -> Self {
        Self { running: base_totals.clone(), base_totals, ..Self::default() }
    }

    pub fn len(&self) -> usize {
        self.ts_ns.len()
    }

    /// Room for `additional` more events in every column, exactly: an importer that knows how
    /// many events come spares the columns' doublings (in a browser's worker, whose memory
    /// never shrinks, the last doubling of a 19 M-event trace held 1.6 GB of columns for 0.6).
    pub fn reserve_exact(&mut self, additional: usize) {
        self.ts_ns.reserve_exact(additional);
        self.size_bytes.reserve_exact(additional);
        self.address.reserve_exact(additional);
        self.layer.reserve_exact(additional);
        self.tag.reserve_exact(additional);
        self.device.reserve_exact(additional);
        self.stream.reserve_exact(additional);
    }

    pub fn is_empty(&self) -> bool {
        self.ts_ns.is_empty()
    }

    fn device_count(&self) -> usize {
        self.base_totals.len()
    }

    /// Appends one event. Events must come in time order; `rec.device` must index `base_totals`
    /// (call [`EventStore::ensure_device`] first).
    pub fn push(&mut self, rec: EventRecord) {
        let i = self.len();
        let d = self.device_count();
        if i.is_multiple_of(CHECKPOINT_EVERY) {
            self.checkpoints.extend_from_slice(&self.running);
        }
        let dev = rec.device as usize;
        let predicted = self.running[dev].apply(rec.event_type.deltas(rec.size_bytes));
        let actual = match rec.totals {
            Some(t) if t != predicted => {
                self.overrides.push(TotalsOverride { index: i as u32, totals: t });
                t
            }
            _ => predicted,
        };
        debug_assert_eq!(self.running.len(), d);
        self.running[dev] = actual;
        self.ts_ns.push(rec.ts_ns);
        self.size_bytes.push(rec.size_bytes);
        self.address.push(rec.address);
        self.layer.push(rec.layer);
        self.tag.push(rec.event_type as u8 | ((rec.phase as u8) << 5));
        self.device.push(rec.device);
        self.stream.push(rec.stream);
    }

    /// Makes room for device index `dev` (with zero base totals) if it is new. A device that
    /// appears after events exist rebuilds the checkpoints (devices are few, so this is rare).
    pub fn ensure_device(&mut self, dev: usize) {
        if dev < self.device_count() {
            return;
        }
        while self.base_totals.len() <= dev {
            self.base_totals.push(Totals::default());
            self.running.push(Totals::default());
        }
        if !self.is_empty() {
            self.rebuild_index();
        }
    }

    /// Sets the totals of device `dev` before the first event (memory that existed before
    /// recording began).
    pub fn set_base_totals(&mut self, dev: usize, totals: Totals) {
        self.ensure_device(dev);
        self.base_totals[dev] = totals;
        self.rebuild_index();
    }

    /// Forgets device `dev`'s reserved memory: its totals read 0 reserved before and after
    /// every event (each event that changed them gets an override), allocated unchanged, and
    /// no event moves, so everything that names events by index stays right.
    pub fn forget_reserved(&mut self, dev: usize) {
        if dev >= self.device_count() {
            return;
        }
        // Each event's totals as they are, then overrides anew from base totals without
        // `dev`'s reserved: where the kept totals (its reserved 0) differ from the derived.
        let truth: Vec<Totals> = {
            let mut cur = self.cursor();
            (0..self.len()).map(|_| cur.advance()).collect()
        };
        self.base_totals[dev].reserved_bytes = 0;
        let mut derived = self.base_totals.clone();
        let mut overrides = Vec::new();
        for (i, &t) in truth.iter().enumerate() {
            let d = self.device[i] as usize;
            let predicted = derived[d].apply(self.event_type(i).deltas(self.size_bytes[i]));
            let actual = if d == dev { Totals { reserved_bytes: 0, ..t } } else { t };
            if actual != predicted {
                overrides.push(TotalsOverride { index: i as u32, totals: actual });
            }
            derived[d] = actual;
        }
        self.overrides = overrides;
        self.rebuild_index();
    }

    /// Event `i` as a record whose totals are derived (`totals: None`), e.g. to copy it.
    pub fn record(&self, i: usize) -> EventRecord {
        EventRecord {
            ts_ns: self.ts_ns[i],
            event_type: self.event_type(i),
            phase: self.phase(i),
            size_bytes: self.size_bytes[i],
            address: self.address[i],
            layer: self.layer[i],
            device: self.device[i],
            stream: self.stream[i],
            totals: None,
        }
    }

    pub fn event_type(&self, i: usize) -> EventType {
        EventType::from_u8(self.tag[i] & 0x1f).unwrap_or(EventType::Snapshot)
    }

    pub fn phase(&self, i: usize) -> Phase {
        Phase::from_u8(self.tag[i] >> 5).unwrap_or(Phase::Other)
    }

    /// Rebuilds checkpoints and running totals after deserialising.
    pub(crate) fn rebuild_index(&mut self) {
        self.checkpoints.clear();
        self.running = self.base_totals.clone();
        let mut ov = 0;
        for i in 0..self.len() {
            if i % CHECKPOINT_EVERY == 0 {
                self.checkpoints.extend_from_slice(&self.running);
            }
            let dev = self.device[i] as usize;
            let et = self.event_type(i);
            self.running[dev] = self.running[dev].apply(et.deltas(self.size_bytes[i]));
            if ov < self.overrides.len() && self.overrides[ov].index as usize == i {
                self.running[dev] = self.overrides[ov].totals;
                ov += 1;
            }
        }
    }

    /// Totals of every device after the last event.
    pub fn final_totals(&self) -> &[Totals] {
        &self.running
    }

    /// Totals of the event's own device after event `i`. O(CHECKPOINT_EVERY) at worst; use
    /// [`EventStore::cursor`] to walk events in order.
    pub fn totals_at(&self, i: usize) -> Totals {
        let block = i / CHECKPOINT_EVERY;
        let mut cur = self.cursor_from(block * CHECKPOINT_EVERY);
        let mut t = Totals::default();
        for _ in block * CHECKPOINT_EVERY..=i {
            t = cur.advance();
        }
        t
    }

    /// Walks events from the first, yielding the totals after each.
    pub fn cursor(&self) -> TotalsCursor<'_> {
        self.cursor_from(0)
    }

    /// A cursor at the last checkpoint at or before event `i` (so at most `CHECKPOINT_EVERY`
    /// events before it), for walks that start mid-trace; [`TotalsCursor::position`] says where.
    pub fn cursor_near(&self, i: usize) -> TotalsCursor<'_> {
        self.cursor_from(i / CHECKPOINT_EVERY * CHECKPOINT_EVERY)
    }

    /// A cursor at event `start` whose devices' totals before it are `running` (as recorded by
    /// an earlier walk).
    pub(crate) fn cursor_with(&self, start: usize, running: Vec<Totals>) -> TotalsCursor<'_> {
        let ov = self.overrides.partition_point(|o| (o.index as usize) < start);
        TotalsCursor { store: self, next: start, running, ov }
    }

    fn cursor_from(&self, start: usize) -> TotalsCursor<'_> {
        let d = self.device_count();
        let block = start / CHECKPOINT_EVERY;
        let running = if start == 0 || self.checkpoints.len() < (block + 1) * d {
            self.base_totals.clone()
        } else {
            self.checkpoints[block * d..(block + 1) * d].to_vec()
        };
        let start = if start == 0 || self.checkpoints.len() < (block + 1) * d { 0 } else { start };
        let ov = self.overrides.partition_point(|o| (o.index as usize) < start);
        TotalsCursor { store: self, next: start, running, ov }
    }

    /// Heap bytes held by the per-event columns (what the 32-byte budget counts).
    pub fn column_bytes(&self) -> usize {
        #[allow(clippy::ptr_arg)] // the capacity is the Vec's
        fn heap<T>(v: &Vec<T>) -> usize {
            v.capacity() * std::mem::size_of::<T>()
        }
        heap(&self.ts_ns)
            + heap(&self.size_bytes)
            + heap(&self.address)
            + heap(&self.layer)
            + heap(&self.tag)
            + heap(&self.device)
            + heap(&self.stream)
    }

    /// Heap bytes of everything else the store holds (overrides, checkpoints).
    pub fn index_bytes(&self) -> usize {
        self.overrides.capacity() * std::mem::size_of::<TotalsOverride>()
            + self.checkpoints.capacity() * std::mem::size_of::<Totals>()
            + (self.base_totals.capacity() + self.running.capacity()) * std::mem::size_of::<Totals>()
    }

    pub fn shrink_to_fit(&mut self) {
        self.ts_ns.shrink_to_fit();
        self.size_bytes.shrink_to_fit();
        self.address.shrink_to_fit();
        self.layer.shrink_to_fit();
        self.tag.shrink_to_fit();
        self.device.shrink_to_fit();
        self.stream.shrink_to_fit();
        self.overrides.shrink_to_fit();
        self.checkpoints.shrink_to_fit();
    }
}

/// Sequential walk over an [`EventStore`], yielding each event's device totals.
pub struct TotalsCursor<'a> {
    store: &'a EventStore,
    next: usize,
    running: Vec<Totals>,
    ov: usize,
}

impl TotalsCursor<'_> {
    /// Applies the next event and returns its device's totals after it.
    /// Callers must not call it more than `len()` times.
    pub fn advance(&mut self) -> Totals {
        let s = self.store;
        let i = self.next;
        self.next += 1;
        let dev = s.device[i] as usize;
        let t = self.running[dev].apply(s.event_type(i).deltas(s.size_bytes[i]));
        let t = match s.overrides.get(self.ov) {
            Some(o) if o.index as usize == i => {
                self.ov += 1;
                o.totals
            }
            _ => t,
        };
        self.running[dev] = t;
        t
    }

    /// Index of the event the next [`TotalsCursor::advance`] applies.
    pub fn position(&self) -> usize {
        self.next
    }

    /// Totals of every device after the events walked so far.
    pub fn all_devices(&self) -> &[Totals] {
        &self.running
    }
}

/// One memory event as the MemoryTracer API shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct MemoryEvent<'a> {
    /// Seconds since trace start.
    pub timestamp: f64,
    pub event_type: EventType,
    pub size_bytes: u64,
    pub layer_name: Option<&'a str>,
    pub phase: Phase,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    pub fragmentation_ratio: f64,
    pub address: u64,
    pub device: String,
    pub stream: &'a str,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(et: EventType, size: u64, totals: Option<Totals>) -> EventRecord {
        EventRecord {
            ts_ns: 0,
            event_type: et,
            phase: Phase::Other,
            size_bytes: size,
            address: 0,
            layer: StrId::NONE,
            device: 0,
            stream: 0,
            totals,
        }
    }

    #[test]
    fn totals_are_derived_and_overridden_exactly() {
        let mut s = EventStore::new(vec![Totals { allocated_bytes: 100, reserved_bytes: 1000 }]);
        s.push(rec(EventType::Alloc, 50, None));
        s.push(rec(EventType::Alloc, 10, Some(Totals { allocated_bytes: 999, reserved_bytes: 2000 })));
        s.push(rec(EventType::Free, 9, None));
        s.push(rec(EventType::SegmentAlloc, 24, None));
        let mut c = s.cursor();
        assert_eq!(c.advance(), Totals { allocated_bytes: 150, reserved_bytes: 1000 });
        assert_eq!(c.advance(), Totals { allocated_bytes: 999, reserved_bytes: 2000 });
        assert_eq!(c.advance(), Totals { allocated_bytes: 990, reserved_bytes: 2000 });
        assert_eq!(c.advance(), Totals { allocated_bytes: 990, reserved_bytes: 2024 });
        assert_eq!(s.overrides.len(), 1);
        assert_eq!(s.totals_at(2).allocated_bytes, 990);
    }

    /// ARCHITECTURE.md: a memory event costs 32 bytes of columns.
    #[test]
    fn a_memory_event_costs_32_bytes_of_columns() {
        let mut s = EventStore::new(vec![Totals::default()]);
        for i in 0..10_000u64 {
            s.push(rec(if i % 2 == 0 { EventType::Alloc } else { EventType::Free }, 64, None));
        }
        s.shrink_to_fit();
        assert_eq!(s.column_bytes(), 32 * s.len());
    }

    #[test]
    fn random_access_matches_cursor_across_checkpoints() {
        let mut s = EventStore::new(vec![Totals::default()]);
        for i in 0..5000u64 {
            let et = if i % 3 == 2 { EventType::Free } else { EventType::Alloc };
            let totals = (i % 1000 == 7).then_some(Totals { allocated_bytes: i * 7, reserved_bytes: i });
            s.push(rec(et, i % 17 + 1, totals));
        }
        let mut c = s.cursor();
        let walked: Vec<Totals> = (0..s.len()).map(|_| c.advance()).collect();
        for i in [0, 1, 1023, 1024, 1025, 2047, 3000, 4999] {
            assert_eq!(s.totals_at(i), walked[i], "event {i}");
        }
        let mut copy: EventStore = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        copy.rebuild_index();
        assert_eq!(copy.totals_at(4999), walked[4999]);
        assert_eq!(copy.totals_at(2500), walked[2500]);
    }

    #[test]
    fn fragmentation_ratio_is_zero_without_reserve() {
        assert_eq!(Totals::default().fragmentation_ratio(), 0.0);
        let t = Totals { allocated_bytes: 25, reserved_bytes: 100 };
        assert!((t.fragmentation_ratio() - 0.75).abs() < 1e-12);
    }
}
