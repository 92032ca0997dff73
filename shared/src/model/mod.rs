//! The trace data model: memory events (columnar, 32 bytes each), operators, layer scopes,
//! allocator state and metadata, all held by one [`Trace`].
//!
//! - `strings.rs`: interned names ([`StringTable`], [`StrId`]).
//! - `events.rs`: memory events as columns ([`EventStore`]) and the totals derived from them.
//! - `devices.rs`: [`Device`], the driver's [`DeviceSample`]s.
//! - `ops.rs`, `scopes.rs`: operators and their tensors; layer scopes, iterations, marks.
//! - `stacks.rs`: call stacks, interned ([`StackTable`]); `frames.rs`: which frames are the
//!   program's and which the runtime's, folded where a stack is shown ([`shown_frames`]).
//! - `segments.rs`: the caching allocator's segments, blocks and pools.
//! - `meta.rs`: facts about the run ([`TraceMeta`], PyTorch's [`Counter`]s, torchrun's [`RankVar`]s).
//! - `holders.rs`, `notes.rs`: who held an allocation; text attached to events.

mod devices;
mod events;
mod frames;
mod holders;
mod ledger;
mod meta;
mod notes;
mod ops;
mod scopes;
mod segments;
mod stacks;
mod strings;

pub use devices::{Device, DeviceSample};
pub use events::{EventRecord, EventStore, EventType, MemoryEvent, Phase, Totals, TotalsCursor, TotalsOverride};
pub use frames::{frame_role, is_python_frame, is_runtime_frame, shown_frames, shown_of_roles, FrameRole};
pub use holders::{EventHolder, HolderKind};
pub use ledger::{outside_pytorch_peak, reserved_at_samples, DeviceLedger, LedgerEvent, ProcessSample, PYTORCH_SOURCE};
pub use meta::{allocator_settings_of_string, AllocatorChange, AllocatorSettings, CompiledCode, Counter, RankVar, SourceFormat, TraceMeta};
pub use notes::{EventNote, NoteKind};
pub use ops::{OperatorEvent, TensorRef};
pub use scopes::{is_source_layer, layer_place, source_layer, IterationSpan, LayerScope, Mark, INPUT_LAYER};
pub use segments::{BlockInfo, BlockState, Pool, PoolId, SegmentInfo};
pub use stacks::{Frame, StackTable};
pub use strings::{StrId, StringTable};

use serde::{Deserialize, Serialize};

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
    /// Device memory outside the caching allocator, by source (`collector trace --ledger`).
    #[serde(default, skip_serializing_if = "DeviceLedger::is_empty")]
    pub ledger: DeviceLedger,
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
            ledger: DeviceLedger::default(),
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
