//! The trace data model: memory events (columnar, 32 bytes each), operators, layer scopes,
//! allocator state and metadata.
//!
//! Memory events are stored as columns rather than as a `Vec<MemoryEvent>`: the running totals
//! (`allocated_bytes`, `reserved_bytes`) are derived from the event kinds and sizes, plus a sparse
//! list of the places where the source reported a total that differs from the running sum. This
//! keeps a recorded event at 32 bytes while every total stays exactly what the source said.
//! [`MemoryEvent`] is the materialised, API-facing view of one event.

use crate::hash::FastMap as HashMap;
use serde::{Deserialize, Serialize};

/// The layer scope the collector creates the input batch in; analyses tell data from weights
/// by it.
pub const INPUT_LAYER: &str = "input";

/// Index into [`StringTable`]. `StrId::NONE` stands for "no string" (e.g. no layer).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StrId(pub u32);

impl StrId {
    pub const NONE: StrId = StrId(u32::MAX);

    pub fn is_none(self) -> bool {
        self == Self::NONE
    }
}

/// Interned strings: every name in a trace (layers, ops, frames, streams) is stored once.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(from = "Vec<String>", into = "Vec<String>")]
pub struct StringTable {
    strings: Vec<String>,
    index: HashMap<String, u32>,
}

impl From<Vec<String>> for StringTable {
    fn from(strings: Vec<String>) -> Self {
        let index = strings.iter().enumerate().map(|(i, s)| (s.clone(), i as u32)).collect();
        Self { strings, index }
    }
}

impl From<StringTable> for Vec<String> {
    fn from(table: StringTable) -> Self {
        table.strings
    }
}

impl StringTable {
    pub fn intern(&mut self, s: &str) -> StrId {
        if let Some(&id) = self.index.get(s) {
            return StrId(id);
        }
        let id = self.strings.len() as u32;
        self.strings.push(s.to_owned());
        self.index.insert(s.to_owned(), id);
        StrId(id)
    }

    /// The id of `s` if it was interned.
    pub fn lookup(&self, s: &str) -> Option<StrId> {
        self.index.get(s).map(|&i| StrId(i))
    }

    /// The string of `id`; `None` for [`StrId::NONE`] or an id out of range.
    pub fn get(&self, id: StrId) -> Option<&str> {
        self.strings.get(id.0 as usize).map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.strings.len()
    }

    pub fn is_empty(&self) -> bool {
        self.strings.is_empty()
    }

    pub fn heap_bytes(&self) -> usize {
        // Each string is held twice (vector and index key) plus the map's slots.
        self.strings.iter().map(|s| 2 * s.capacity()).sum::<usize>()
            + self.strings.capacity() * std::mem::size_of::<String>()
            + self.index.capacity() * (std::mem::size_of::<String>() + 4 + 8)
    }
}

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

/// A device as the source names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Device {
    /// `cuda`, `cpu`, or what the source says.
    pub kind: String,
    pub index: i32,
    /// The process's rank in a distributed job (traces merged by `shared::merge`), so that
    /// two ranks' `cuda:0` on different hosts stay two devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
}

impl Device {
    /// The kind of pinned host memory's device (`CachingHostAllocator`, in snapshots of torch
    /// 2.14+ recorded with `record_pinned_host_memory=True`).
    pub const PINNED_HOST: &'static str = "pinned host";

    /// Pinned host memory: its totals are its own, never added to a GPU's.
    pub fn is_pinned_host(&self) -> bool {
        self.kind == Self::PINNED_HOST
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.index < 0 {
            write!(f, "{}", self.kind)?;
        } else {
            write!(f, "{}:{}", self.kind, self.index)?;
        }
        match self.rank {
            Some(r) => write!(f, " (rank {r})"),
            None => Ok(()),
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
    /// Index into [`Trace::devices`].
    pub device: u8,
    /// Index into [`Trace::streams`].
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
    /// Totals of each device before the first event, indexed like [`Trace::devices`].
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

/// A tensor an operator read or wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorRef {
    /// Storage pointer (or another stable id of the storage); 0 when the source has none.
    pub storage_id: u64,
    pub size_bytes: u64,
    /// Index into [`Trace::shapes`]; `u32::MAX` when unknown.
    pub shape: u32,
}

/// An operator execution (forward op, autograd node, optimizer kernel ...).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OperatorEvent {
    pub name: StrId,
    pub phase: Phase,
    /// Autograd sequence number; -1 when the op has none.
    pub seq_nr: i64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub thread: u64,
    /// The forward thread of a backward node (pairs it with its forward op); 0 when unknown.
    pub fwd_thread: u64,
    /// Innermost layer scope (module path) the op ran in.
    pub layer: StrId,
    /// Range into [`Trace::tensors`].
    pub inputs: (u32, u32),
    /// Range into [`Trace::tensors`].
    pub outputs: (u32, u32),
}

/// A named scope: a module path such as `layer1.0.conv1`, `optimizer.step`, an iteration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerScope {
    pub name: StrId,
    pub start_ns: u64,
    pub end_ns: u64,
    /// Nesting depth, 0 for outermost.
    pub depth: u16,
    pub phase: Phase,
    pub thread: u64,
}

/// One stack frame of an allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Frame {
    pub name: StrId,
    pub filename: StrId,
    pub line: u32,
}

/// Call stacks, interned: frames once, stacks as lists of frame indices (innermost first).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StackTable {
    pub frames: Vec<Frame>,
    /// Each stack is `frame_ids[start..end]`.
    pub stacks: Vec<(u32, u32)>,
    pub frame_ids: Vec<u32>,
    /// (event index, stack index), sorted by event index.
    pub event_stacks: Vec<(u32, u32)>,
    #[serde(skip)]
    frame_index: HashMap<Frame, u32>,
    #[serde(skip)]
    stack_index: HashMap<Vec<u32>, u32>,
}

impl StackTable {
    pub fn intern_frame(&mut self, f: Frame) -> u32 {
        *self.frame_index.entry(f).or_insert_with(|| {
            self.frames.push(f);
            (self.frames.len() - 1) as u32
        })
    }

    pub fn intern_stack(&mut self, frame_ids: Vec<u32>) -> u32 {
        if let Some(&id) = self.stack_index.get(&frame_ids) {
            return id;
        }
        let start = self.frame_ids.len() as u32;
        self.frame_ids.extend_from_slice(&frame_ids);
        self.stacks.push((start, self.frame_ids.len() as u32));
        let id = (self.stacks.len() - 1) as u32;
        self.stack_index.insert(frame_ids, id);
        id
    }

    /// The frames of stack `id`, innermost first.
    pub fn stack(&self, id: u32) -> impl Iterator<Item = &Frame> {
        self.stack_frame_ids(id).iter().filter_map(|&f| self.frames.get(f as usize))
    }

    /// The frame indices of stack `id`, innermost first (empty for an unknown stack).
    pub fn stack_frame_ids(&self, id: u32) -> &[u32] {
        let (s, e) = self.stacks.get(id as usize).copied().unwrap_or((0, 0));
        self.frame_ids.get(s as usize..e as usize).unwrap_or(&[])
    }

    /// The stack recorded for event `event`, if any.
    pub fn stack_of_event(&self, event: usize) -> Option<u32> {
        self.event_stacks.binary_search_by_key(&(event as u32), |&(e, _)| e).ok().map(|i| self.event_stacks[i].1)
    }

    pub fn heap_bytes(&self) -> usize {
        self.frames.capacity() * std::mem::size_of::<Frame>()
            + self.stacks.capacity() * 8
            + self.frame_ids.capacity() * 4
            + self.event_stacks.capacity() * 8
            + self.frame_index.capacity() * (std::mem::size_of::<Frame>() + 4 + 8)
            + self.stack_index.keys().map(|k| k.capacity() * 4 + 24 + 4 + 8).sum::<usize>()
    }

    pub(crate) fn drop_indexes(&mut self) {
        self.frame_index = HashMap::default();
        self.stack_index = HashMap::default();
    }
}

/// State of one allocator block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    Allocated,
    Free,
    /// Freed by the program, not yet reusable: its free waits for work on other streams
    /// (PyTorch's `active_pending_free`). Not counted as allocated; takes its space.
    PendingFree,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockInfo {
    pub address: u64,
    pub size_bytes: u64,
    pub state: BlockState,
}

/// A segment of the caching allocator and its blocks, in address order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentInfo {
    pub address: u64,
    pub size_bytes: u64,
    /// Index into [`Trace::devices`].
    pub device: u8,
    pub stream: u16,
    /// `small` (2 MiB segments for requests ≤ 1 MiB) or `large`.
    pub pool: Pool,
    pub blocks: Vec<BlockInfo>,
    /// The private memory pool that owns the segment (index into [`Trace::pools`]); `None` for
    /// the device's default pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_pool: Option<u16>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pool {
    Small,
    Large,
}

/// Which importer produced a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceFormat {
    /// Memory Tracer's own format (native capture or a conversion).
    MemoryTracer,
    /// `torch.cuda.memory._dump_snapshot` pickle.
    PytorchSnapshot,
    /// torch.profiler Chrome trace.
    ChromeTrace,
    /// DFTracer `.pfw`.
    Dftracer,
}

impl SourceFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            SourceFormat::MemoryTracer => "memory_tracer",
            SourceFormat::PytorchSnapshot => "pytorch_snapshot",
            SourceFormat::ChromeTrace => "chrome_trace",
            SourceFormat::Dftracer => "dftracer",
        }
    }
}

/// Facts about the run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceMeta {
    pub model: Option<String>,
    pub input_shape: Option<Vec<i64>>,
    pub batch_size: Option<u64>,
    pub device_name: Option<String>,
    pub device_total_memory_bytes: Option<u64>,
    pub pytorch_version: Option<String>,
    pub source_format: SourceFormat,
    /// Wall-clock start of the trace in nanoseconds since the Unix epoch, when known.
    pub start_unix_ns: Option<u64>,
    /// Allocator settings as the source gave them (snapshots), for display.
    #[serde(default)]
    pub allocator_settings: Option<serde_json::Value>,
    /// What the importer could not take at face value (skipped entries, estimated sizes).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Counters PyTorch itself reported during the run, by name
    /// (`cuda.max_memory_allocated`, ...), to check the trace against. Read and written
    /// through [`TraceMeta::counter`] and [`TraceMeta::report`] ([`Counter`] names them).
    #[serde(default)]
    pub reported: std::collections::BTreeMap<String, u64>,
    /// False when the recorder was asked not to track fragmentation: analyses then report a
    /// fragmentation of 0, as the MemoryTracer API does.
    #[serde(default = "yes")]
    pub fragmentation_tracked: bool,
    /// Which distributed job the process belonged to (torchrun's run id and rendezvous
    /// address), so that `merge` refuses ranks of different jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// Ranks of the job that a merged trace lacks (their reasons are in `warnings`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing_ranks: Vec<u32>,
    /// Which capture recorded a traced program (`native (torch 2.11, library built for torch
    /// 2.11.0)`, or PyTorch's recorder with why and what it lacks); None for imported files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<String>,
    /// Devices (indices into [`Trace::devices`]) whose reserved memory is unknown: a snapshot
    /// names none of their segments, or its segments cannot hold its allocations. Their
    /// reserved totals read 0 and mean "unknown"; `warnings` says why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reserved_unknown: Vec<u8>,
    /// What the capture made of torch.compile's generated code, when the program ran some.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compiled: Option<CompiledCode>,
}

/// Inductor's generated code in a traced run: its allocations are attributed to the modules
/// whose FX nodes they come from (`nn_module_stack`), which the capture reads as PyTorch loads
/// each generated module.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CompiledCode {
    /// Generated modules (a forward, a backward, each recompilation) that were attributed.
    pub graphs: u32,
    /// Statements of theirs that allocate a buffer.
    pub sites: u32,
    /// Of those, the ones no module metadata names: their allocations stay on the module the
    /// compiled code runs in.
    pub unresolved: u32,
    /// The module paths compiled allocations were attributed to.
    pub modules: Vec<String>,
    /// Generated modules that could not be read, and why (at most five).
    pub failures: Vec<String>,
}

impl CompiledCode {
    /// Adds another process's (a rank's) compiled code.
    pub fn absorb(&mut self, other: &CompiledCode) {
        self.graphs += other.graphs;
        self.sites += other.sites;
        self.unresolved += other.unresolved;
        self.modules.extend(other.modules.iter().cloned());
        self.modules.sort();
        self.modules.dedup();
        self.failures.extend(other.failures.iter().cloned());
        self.failures.truncate(5);
    }

    /// One line for summaries: `2 Inductor graphs: 39 of 39 allocation sites attributed to 9 modules`.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "{} Inductor graph{}: {} of {} allocation sites attributed to {} module{}",
            self.graphs,
            if self.graphs == 1 { "" } else { "s" },
            self.sites - self.unresolved.min(self.sites),
            self.sites,
            self.modules.len(),
            if self.modules.len() == 1 { "" } else { "s" }
        );
        if self.unresolved > 0 {
            s.push_str(&format!("; {} without module metadata stay on the compiled module (a compiled function with no module in it, or backward code an untraced run compiled and AOTAutograd's cache handed back: TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 for one traced run attributes that)", self.unresolved));
        }
        if !self.failures.is_empty() {
            s.push_str(&format!("; {} generated module(s) not read: {}", self.failures.len(), self.failures.join("; ")));
        }
        s
    }
}

fn yes() -> bool {
    true
}

/// A counter of PyTorch's CUDA caching allocator (`torch.cuda.memory_stats`) that a traced
/// process reports at its end, kept in [`TraceMeta::reported`] under [`Counter::key`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// `torch.cuda.max_memory_allocated()`.
    MaxMemoryAllocated,
    /// `torch.cuda.max_memory_reserved()`.
    MaxMemoryReserved,
    /// `torch.cuda.memory_allocated()` at the end.
    MemoryAllocated,
    /// `torch.cuda.memory_reserved()` at the end.
    MemoryReserved,
    /// Allocations retried after freeing the cache (`num_alloc_retries`).
    NumAllocRetries,
    /// Out-of-memory errors raised (`num_ooms`).
    NumOoms,
}

impl Counter {
    pub const ALL: [Counter; 6] = [
        Counter::MaxMemoryAllocated,
        Counter::MaxMemoryReserved,
        Counter::MemoryAllocated,
        Counter::MemoryReserved,
        Counter::NumAllocRetries,
        Counter::NumOoms,
    ];

    /// Its name in [`TraceMeta::reported`] (and in the own format and `collector ingest`'s
    /// JSON, which keep that map as it is).
    pub fn key(self) -> &'static str {
        match self {
            Counter::MaxMemoryAllocated => "cuda.max_memory_allocated",
            Counter::MaxMemoryReserved => "cuda.max_memory_reserved",
            Counter::MemoryAllocated => "cuda.memory_allocated",
            Counter::MemoryReserved => "cuda.memory_reserved",
            Counter::NumAllocRetries => "cuda.num_alloc_retries",
            Counter::NumOoms => "cuda.num_ooms",
        }
    }
}

impl TraceMeta {
    /// What PyTorch reported for `c`, where the trace has it.
    pub fn counter(&self, c: Counter) -> Option<u64> {
        self.reported.get(c.key()).copied()
    }

    /// Keeps what PyTorch reported for `c`.
    pub fn report(&mut self, c: Counter, value: u64) {
        self.reported.insert(c.key().to_owned(), value);
    }

    pub fn new(source_format: SourceFormat) -> Self {
        Self {
            model: None,
            input_shape: None,
            batch_size: None,
            device_name: None,
            device_total_memory_bytes: None,
            pytorch_version: None,
            source_format,
            start_unix_ns: None,
            allocator_settings: None,
            warnings: Vec::new(),
            reported: std::collections::BTreeMap::new(),
            fragmentation_tracked: true,
            job: None,
            missing_ranks: Vec::new(),
            capture: None,
            reserved_unknown: Vec::new(),
            compiled: None,
        }
    }
}

/// A whole trace.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Trace {
    pub meta: TraceMeta,
    pub strings: StringTable,
    pub devices: Vec<Device>,
    /// Stream names (CUDA stream handles as text, or `default`).
    pub streams: Vec<StrId>,
    pub events: EventStore,
    pub ops: Vec<OperatorEvent>,
    pub tensors: Vec<TensorRef>,
    pub shapes: Vec<Vec<i64>>,
    pub scopes: Vec<LayerScope>,
    pub stacks: StackTable,
    /// Allocator segments that existed before the first event (snapshot traces); the events
    /// replayed on top of them give the allocator state at any moment.
    pub initial_segments: Vec<SegmentInfo>,
    /// Events the recorder had to drop (bounded buffers).
    pub dropped_events: u64,
    /// Training or inference iterations, in order (native capture).
    #[serde(default)]
    pub iterations: Vec<IterationSpan>,
    /// Device memory in use as the driver sees it (all processes, PyTorch's cache included),
    /// sampled during the run (native capture on CUDA).
    #[serde(default)]
    pub device_samples: Vec<DeviceSample>,
    /// Named moments the program marked (`memory_tracer.mark("name")`), in time order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub marks: Vec<Mark>,
    /// Private memory pools of the caching allocator (CUDA graphs, `torch.cuda.MemPool`), by
    /// PyTorch's id (`MempoolId_t`, a pair); the default pool `(0, 0)` is not listed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<PoolId>,
    /// Events of a private pool: (event index, index into [`Trace::pools`]), sorted by event.
    /// Events not listed belong to their device's default pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub event_pools: Vec<(u32, u16)>,
    /// Text attached to events (user metadata, annotations, allocator tags), sorted by event.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub event_notes: Vec<EventNote>,
    /// What the program asked for, where it is known: (index of an `alloc` event, bytes
    /// requested before the allocator rounded them up to the event's block), sorted by event.
    /// Allocations not listed asked for at most their block.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub event_requested: Vec<(u32, u64)>,
    /// Who held each allocation and when, where the capture recorded it (`collector trace
    /// --holders`): sorted by event, then by when the holder took it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub event_holders: Vec<EventHolder>,
}

/// What keeps an allocation alive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HolderKind {
    /// A module's parameter.
    Parameter,
    /// A module's buffer (batch norm's running statistics, ...).
    Buffer,
    /// A parameter's `.grad`.
    Gradient,
    /// An optimizer's state of a parameter (`exp_avg`, `momentum_buffer`, ...).
    OptimizerState,
    /// Saved by an autograd node for backward.
    SavedForBackward,
    /// Freed by the program, not yet reusable: another stream still uses it (`record_stream`).
    PendingFree,
    /// Reserved by the caching allocator, allocated to nothing; or allocated and kept by a
    /// library for its next call (a cuBLAS handle's workspace), which no tensor holds.
    Cache,
    /// Referenced by a Python variable or attribute.
    Python,
    /// No holder recorded or inferred.
    Unknown,
}

impl HolderKind {
    pub const ALL: [HolderKind; 9] = [
        HolderKind::Parameter,
        HolderKind::Buffer,
        HolderKind::Gradient,
        HolderKind::OptimizerState,
        HolderKind::SavedForBackward,
        HolderKind::PendingFree,
        HolderKind::Cache,
        HolderKind::Python,
        HolderKind::Unknown,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            HolderKind::Parameter => "parameter",
            HolderKind::Buffer => "buffer",
            HolderKind::Gradient => "gradient",
            HolderKind::OptimizerState => "optimizer_state",
            HolderKind::SavedForBackward => "saved_for_backward",
            HolderKind::PendingFree => "pending_free",
            HolderKind::Cache => "cache",
            HolderKind::Python => "python",
            HolderKind::Unknown => "unknown",
        }
    }

    /// The kind a capture's code names (`record`'s `HOLDER_*`): 1 parameter to 7 python.
    pub fn from_code(code: u8) -> Option<HolderKind> {
        Some(match code {
            1 => HolderKind::Parameter,
            2 => HolderKind::Buffer,
            3 => HolderKind::Gradient,
            4 => HolderKind::OptimizerState,
            5 => HolderKind::SavedForBackward,
            6 => HolderKind::PendingFree,
            7 => HolderKind::Python,
            8 => HolderKind::Cache,
            _ => return None,
        })
    }

    /// Which of two holders of one block names it: the one that outlives the step (a
    /// parameter over the Python variable that also points at it).
    pub fn rank(self) -> u8 {
        match self {
            HolderKind::Parameter => 0,
            HolderKind::Buffer => 1,
            HolderKind::OptimizerState => 2,
            HolderKind::Gradient => 3,
            HolderKind::SavedForBackward => 4,
            HolderKind::Python => 5,
            HolderKind::PendingFree => 6,
            HolderKind::Cache => 7,
            HolderKind::Unknown => 8,
        }
    }
}

/// One holder of one allocation, from when it took the block until it let go of it (or the
/// block was freed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventHolder {
    /// The `Alloc` event of the block.
    pub event: u32,
    pub kind: HolderKind,
    /// The parameter or buffer (`weight`), the optimizer's state key (`exp_avg`), the operator
    /// that saved it (`aten::convolution`), the Python variable (`trainer.last_batch`).
    pub name: StrId,
    /// The module path: of the parameter (also for its gradient and optimizer state), of the
    /// forward that saved it.
    pub module: StrId,
    /// When it took the block, on the trace's clock.
    pub taken_ns: u64,
    /// When it let go, if before the block's free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_ns: Option<u64>,
}

/// The value a list sorted by event index gives event `i`.
fn of_event<T: Copy>(list: &[(u32, T)], i: usize) -> Option<T> {
    list.binary_search_by_key(&(i as u32), |&(e, _)| e).ok().map(|k| list[k].1)
}

/// The value a list sorted by event index ([`Trace::event_pools`], [`Trace::event_requested`])
/// gives each of `events` events, in event order.
pub fn per_event<T: Copy>(list: &[(u32, T)], events: usize) -> impl Iterator<Item = Option<T>> + '_ {
    let mut listed = list.iter().peekable();
    (0..events).map(move |i| {
        let mut value = None;
        while let Some(&&(e, v)) = listed.peek() {
            if e as usize > i {
                break;
            }
            if e as usize == i {
                value = Some(v);
            }
            listed.next();
        }
        value
    })
}

/// A memory pool's id as PyTorch gives it (`MempoolId_t`): `(0, 0)` is a device's default
/// pool; CUDA graph captures and `torch.cuda.MemPool`s own private ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PoolId(pub i64, pub i64);

impl std::fmt::Display for PoolId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "({}, {})", self.0, self.1)
    }
}

/// What kind of text an [`EventNote`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoteKind {
    /// The thread's metadata when the event happened (`torch.cuda.memory._set_memory_metadata`):
    /// text, or compact JSON text when a dict was set.
    UserMetadata,
    /// Attached later to the live allocation the event made
    /// (`torch.cuda.memory._annotate_tensor`), at `ts_ns`, from the stack `stack`.
    Annotation,
    /// A tag of the allocator's own (`internal_metadata`, e.g. `mallocWithAddress`).
    Internal,
}

/// Text attached to one event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventNote {
    /// Index of the event: for an annotation, the allocation it names.
    pub event: u32,
    pub kind: NoteKind,
    pub text: StrId,
    /// When the text was attached (the event's own time, or the annotation's).
    pub ts_ns: u64,
    /// The annotating call's stack (index into [`StackTable::stacks`]), for annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<u32>,
}

/// A named moment of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    pub ts_ns: u64,
    pub name: StrId,
    /// The program's value for it (a counter unless it gave one).
    pub value: i64,
    /// The rank that marked it, in a merged trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
}

/// One iteration of the traced loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IterationSpan {
    pub index: u32,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// The driver's view of a device's memory at one moment (`cuMemGetInfo`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSample {
    pub ts_ns: u64,
    /// Index into `Trace::devices`.
    pub device: u8,
    pub used_bytes: u64,
    pub total_bytes: u64,
}

impl Trace {
    pub fn new(meta: TraceMeta) -> Self {
        Self {
            meta,
            strings: StringTable::default(),
            devices: Vec::new(),
            streams: Vec::new(),
            events: EventStore::default(),
            ops: Vec::new(),
            tensors: Vec::new(),
            shapes: Vec::new(),
            scopes: Vec::new(),
            stacks: StackTable::default(),
            initial_segments: Vec::new(),
            dropped_events: 0,
            iterations: Vec::new(),
            device_samples: Vec::new(),
            marks: Vec::new(),
            pools: Vec::new(),
            event_pools: Vec::new(),
            event_notes: Vec::new(),
            event_requested: Vec::new(),
            event_holders: Vec::new(),
        }
    }

    /// Whether any event has a pool, a note, a requested size or a holder (lists that name
    /// events by index, which whoever renumbers events must carry).
    pub fn has_event_extras(&self) -> bool {
        !self.event_pools.is_empty() || !self.event_notes.is_empty() || !self.event_requested.is_empty() || !self.event_holders.is_empty()
    }

    /// A holder in words: its kind, name and module (`optimizer_state weight.exp_avg in fc`).
    pub fn describe_holder(&self, h: &EventHolder) -> String {
        let mut s = h.kind.as_str().to_owned();
        for (part, sep) in [(self.str(h.name), " "), (self.str(h.module), " in ")] {
            if !part.is_empty() {
                s = format!("{s}{sep}{part}");
            }
        }
        s
    }

    /// The holders of allocation `i`, in the order they took it.
    pub fn holders_of(&self, i: usize) -> &[EventHolder] {
        let h = &self.event_holders;
        let start = h.partition_point(|x| (x.event as usize) < i);
        let end = start + h[start..].partition_point(|x| x.event as usize == i);
        &h[start..end]
    }

    /// The bytes allocation `i` asked for, where the trace knows them.
    pub fn requested_of(&self, i: usize) -> Option<u64> {
        of_event(&self.event_requested, i)
    }

    /// The private pool of event `i` (index into [`Trace::pools`]), `None` for the default pool.
    pub fn event_pool(&self, i: usize) -> Option<u16> {
        of_event(&self.event_pools, i)
    }

    /// The notes of event `i`.
    pub fn notes_of(&self, i: usize) -> &[EventNote] {
        let from = self.event_notes.partition_point(|n| (n.event as usize) < i);
        let to = from + self.event_notes[from..].partition_point(|n| n.event as usize == i);
        &self.event_notes[from..to]
    }

    /// Index of `device`, adding it if new. At most 256 devices.
    pub fn device_index(&mut self, device: Device) -> u8 {
        if let Some(i) = self.devices.iter().position(|d| *d == device) {
            return i as u8;
        }
        self.devices.push(device);
        let i = self.devices.len() - 1;
        self.events.ensure_device(i);
        i as u8
    }

    /// Index of the stream called `name`, adding it if new.
    pub fn stream_index(&mut self, name: &str) -> u16 {
        let id = self.strings.intern(name);
        if let Some(i) = self.streams.iter().position(|s| *s == id) {
            return i as u16;
        }
        self.streams.push(id);
        (self.streams.len() - 1) as u16
    }

    pub fn str(&self, id: StrId) -> &str {
        self.strings.get(id).unwrap_or("")
    }

    pub fn opt_str(&self, id: StrId) -> Option<&str> {
        self.strings.get(id)
    }

    /// Start of the trace in ns (the first event, op or scope).
    pub fn start_ns(&self) -> u64 {
        let a = self.events.ts_ns.first().copied().unwrap_or(u64::MAX);
        let b = self.ops.iter().map(|o| o.start_ns).min().unwrap_or(u64::MAX);
        let c = self.scopes.iter().map(|s| s.start_ns).min().unwrap_or(u64::MAX);
        let m = a.min(b).min(c);
        if m == u64::MAX {
            0
        } else {
            m
        }
    }

    /// End of the trace in ns (the last event, op or scope end).
    pub fn end_ns(&self) -> u64 {
        let a = self.events.ts_ns.last().copied().unwrap_or(0);
        let b = self.ops.iter().map(|o| o.end_ns).max().unwrap_or(0);
        let c = self.scopes.iter().map(|s| s.end_ns).max().unwrap_or(0);
        a.max(b).max(c)
    }

    /// All memory events, materialised in order.
    pub fn memory_events(&self) -> impl Iterator<Item = MemoryEvent<'_>> + '_ {
        let start = self.start_ns();
        let mut cursor = self.events.cursor();
        (0..self.events.len()).map(move |i| {
            let t = cursor.advance();
            self.materialise(i, t, start)
        })
    }

    /// Event `i` with its totals.
    pub fn memory_event(&self, i: usize) -> MemoryEvent<'_> {
        self.materialise(i, self.events.totals_at(i), self.start_ns())
    }

    fn materialise(&self, i: usize, t: Totals, start_ns: u64) -> MemoryEvent<'_> {
        let e = &self.events;
        MemoryEvent {
            timestamp: e.ts_ns[i].saturating_sub(start_ns) as f64 * 1e-9,
            event_type: e.event_type(i),
            size_bytes: e.size_bytes[i],
            layer_name: self.opt_str(e.layer[i]),
            phase: e.phase(i),
            allocated_bytes: t.allocated_bytes,
            reserved_bytes: t.reserved_bytes,
            fragmentation_ratio: t.fragmentation_ratio(),
            address: e.address[i],
            device: self.devices.get(e.device[i] as usize).map(Device::to_string).unwrap_or_default(),
            stream: self.streams.get(e.stream[i] as usize).map(|&s| self.str(s)).unwrap_or(""),
        }
    }

    /// Heap bytes held by the whole trace, by part.
    pub fn memory_footprint(&self) -> Footprint {
        Footprint {
            event_columns: self.events.column_bytes(),
            event_index: self.events.index_bytes(),
            strings: self.strings.heap_bytes(),
            stacks: self.stacks.heap_bytes(),
            ops_and_scopes: self.ops.capacity() * std::mem::size_of::<OperatorEvent>()
                + self.tensors.capacity() * std::mem::size_of::<TensorRef>()
                + self.scopes.capacity() * std::mem::size_of::<LayerScope>()
                + self.shapes.iter().map(|s| s.capacity() * 8 + 24).sum::<usize>(),
            segments: self
                .initial_segments
                .iter()
                .map(|s| std::mem::size_of::<SegmentInfo>() + s.blocks.capacity() * std::mem::size_of::<BlockInfo>())
                .sum(),
            events: self.events.len(),
        }
    }

    /// Frees build-time indexes and spare capacity once a trace is complete.
    pub fn finish(&mut self) {
        self.events.shrink_to_fit();
        self.stacks.drop_indexes();
        self.ops.shrink_to_fit();
        self.tensors.shrink_to_fit();
        self.scopes.shrink_to_fit();
    }
}

/// Heap bytes of a trace, by part.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Footprint {
    pub event_columns: usize,
    pub event_index: usize,
    pub strings: usize,
    pub stacks: usize,
    pub ops_and_scopes: usize,
    pub segments: usize,
    pub events: usize,
}

impl Footprint {
    pub fn total(&self) -> usize {
        self.event_columns + self.event_index + self.strings + self.stacks + self.ops_and_scopes + self.segments
    }

    /// Bytes of the event columns and totals index per event (the 32-byte budget).
    pub fn event_bytes_per_event(&self) -> f64 {
        (self.event_columns + self.event_index) as f64 / self.events.max(1) as f64
    }

    /// Everything the trace holds, per event.
    pub fn total_bytes_per_event(&self) -> f64 {
        self.total() as f64 / self.events.max(1) as f64
    }
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
