//! The replay of the entries in time order through one allocator model per device, which
//! gives the trace its events, stacks, pools and notes; and the external annotations that
//! become its scopes first.

use super::budget::WalkBudget;
use super::compactor::{Compactor, LocalFrames};
use super::entries::{Action, Entry, EntryBlocks, LocalStreams, Streams};
use super::extras::{Extra, Extras};
use super::finals::{pool_for_segment, FinalSeg};
use super::stacks::StackInterner;
use super::view::View;
use crate::allocator::AllocatorState;
use crate::hash::FastMap as HashMap;
use crate::import::pickle::ValueId;
use crate::import::ImportError;
use crate::model::{EventNote, EventRecord, EventType, LayerScope, NoteKind, Phase, Pool, StrId, Trace};

/// An `Optimizer.step*` scope.
struct OptimizerSpan {
    start_ns: u64,
    end_ns: u64,
    name: StrId,
}

/// An entry as a trace event: its type and the bytes the allocator counts.
struct SizedEvent {
    event_type: EventType,
    size_bytes: u64,
    /// A free in one step (a `free`, or a `free_completed` without a request): its completion
    /// follows.
    completes: bool,
}

/// Who made an event: its stack, and the phase and layer it ran in.
struct Attribution {
    stack: Option<u32>,
    phase: Phase,
    layer: StrId,
}

/// The replay of the entries in time order through one allocator model per device.
pub(super) struct Replay {
    states: Vec<AllocatorState>,
    /// Blocks alive at the start that no known segment holds, until freed.
    loose_allocated: HashMap<(usize, u64), u64>,
    /// Sizes of blocks that no known segment holds whose free was requested and not yet
    /// completed.
    pending_free: HashMap<(usize, u64), u64>,
    /// The first final segment at each (device, address), as a linear search would find it.
    final_pool: HashMap<(usize, u64), Pool>,
    /// Sorted by start.
    optimizer_spans: Vec<OptimizerSpan>,
    /// Entries come in time order, so one cursor walks the optimizer spans.
    span_cursor: usize,
    interner: StackInterner,
    streams: Streams,
    /// Frees sized by rounding the requested size.
    pub(super) estimated: usize,
    /// The private pool of the first final segment at each (device, address).
    final_private: HashMap<(usize, u64), u16>,
    /// Each live allocation's event and pool, by (device, address), while annotations or
    /// pools need them.
    live: HashMap<(u8, u64), (u32, Option<u16>)>,
    track_live: bool,
    /// Annotations of addresses no allocation of the trace held then.
    annotations_not_live: usize,
    /// Frees whose `pool_id` is not their allocation's.
    pool_mismatches: usize,
}

impl Replay {
    /// Takes the trace (with its scopes), the final segments and the start state.
    pub(super) fn new(
        trace: &Trace,
        finals: &[FinalSeg],
        states: Vec<AllocatorState>,
        loose_allocated: HashMap<(usize, u64), u64>,
        loose_pending: HashMap<(usize, u64), u64>,
        streams: Streams,
    ) -> Self {
        let optimizer_spans = trace
            .scopes
            .iter()
            .filter(|s| trace.str(s.name).starts_with("Optimizer.step"))
            .map(|s| OptimizerSpan { start_ns: s.start_ns, end_ns: s.end_ns, name: s.name })
            .collect();
        let mut final_pool: HashMap<(usize, u64), Pool> = HashMap::default();
        let mut final_private: HashMap<(usize, u64), u16> = HashMap::default();
        for f in finals {
            final_pool.entry((f.device, f.address)).or_insert(f.pool);
            if let Some(p) = f.private_pool {
                final_private.entry((f.device, f.address)).or_insert(p);
            }
        }
        Replay {
            states,
            loose_allocated,
            pending_free: loose_pending,
            final_pool,
            optimizer_spans,
            span_cursor: 0,
            interner: StackInterner::default(),
            streams,
            estimated: 0,
            final_private,
            live: HashMap::default(),
            track_live: false,
            annotations_not_live: 0,
            pool_mismatches: 0,
        }
    }

    /// Gives the trace its pools, its notes in event order, and what could not be attached.
    pub(super) fn finish(&mut self, extras: &mut Extras, trace: &mut Trace) {
        trace.pools = std::mem::take(&mut extras.pools);
        trace.event_notes.sort_by_key(|n| (n.event, n.ts_ns));
        trace.meta.warnings.extend(extras.warnings());
        if self.annotations_not_live > 0 {
            trace.meta.warnings.push(format!(
                "{} annotations name an address no allocation of the trace held then (freed, or allocated before recording began): left out",
                self.annotations_not_live
            ));
        }
        if self.pool_mismatches > 0 {
            trace.meta.warnings.push(format!(
                "{} frees name a pool other than their allocation's: they are counted in the allocation's pool",
                self.pool_mismatches
            ));
        }
    }

    /// Takes the entries in time order; gives the trace its events.
    pub(super) fn run(&mut self, v: &View, entries: EntryBlocks, compactor: &mut Compactor, trace: &mut Trace) -> Result<(), ImportError> {
        // One event per entry, and a completion after each one-step free.
        let one_step_frees = entries.iter().filter(|e| matches!(e.action, Action::Free | Action::FreeCompleted)).count();
        self.track_live = entries.iter().any(|e| e.action == Action::Annotate || compactor.extras.get(e.extra).pool_given);
        trace.events.reserve_exact(entries.len() + one_step_frees);
        trace.stacks.event_stacks.reserve_exact(entries.iter().filter(|e| e.frames.get().is_some()).count());
        // Entries are taken in time order and given back as the trace's columns fill, so that
        // the two are not both held whole: a block at a time, and a single sorted block from
        // its back as it shrinks.
        for mut block in entries.blocks {
            block.reverse();
            let mut taken = 0usize;
            while let Some(e) = block.pop() {
                taken += 1;
                if taken.is_multiple_of(1 << 18) && block.capacity() > block.len() + block.len() / 4 {
                    block.shrink_to_fit();
                }
                self.replay_entry(v, &e, compactor, trace)?;
            }
        }
        Ok(())
    }

    /// Replays one entry: its event, its stack, its pool and notes, and the completion of a
    /// one-step free.
    fn replay_entry(&mut self, v: &View, e: &Entry, compactor: &mut Compactor, trace: &mut Trace) -> Result<(), ImportError> {
        if e.action == Action::Annotate {
            return self.annotate(v, e, compactor, trace);
        }
        let dev = e.device as usize;
        let extra = compactor.extras.get(e.extra);
        let segment_pool = self.states[dev].private_pool_at(e.addr);
        let sized = self.size_event(e, &compactor.streams, trace)?;
        let ts_ns = (e.time_us.max(0) as u64).saturating_mul(1000);
        let by = self.attribute(v, e, ts_ns, &mut compactor.local, trace)?;
        let stream = self.streams.index(trace, compactor.streams.raw(e.stream))?;
        let index = trace.events.len() as u32;
        let rec = EventRecord {
            ts_ns,
            event_type: sized.event_type,
            phase: by.phase,
            size_bytes: sized.size_bytes,
            address: e.addr,
            layer: by.layer,
            device: dev as u8,
            stream,
            totals: None,
        };
        trace.events.push(rec);
        if let Some(s) = by.stack {
            trace.stacks.event_stacks.push((index, s));
        }
        // An allocation's entry gives what was asked for; the event, the block.
        if e.action == Action::Alloc && e.size > 0 && e.size <= sized.size_bytes {
            trace.event_requested.push((index, e.size));
        }
        let pool = self.pool_of(e, extra, segment_pool, index);
        if let Some(p) = pool {
            trace.event_pools.push((index, p));
        }
        for (text, kind) in [(extra.user, NoteKind::UserMetadata), (extra.internal, NoteKind::Internal)] {
            if let Some(k) = text {
                let text = compactor.extras.trace_text(k, trace);
                trace.event_notes.push(EventNote { event: index, kind, text, ts_ns, stack: None });
            }
        }
        if sized.completes {
            // Older snapshots (and some tools) free in one step: record the completion too, so
            // replays of the segment state see the block released.
            trace.events.push(EventRecord { event_type: EventType::FreeCompleted, ..rec });
            if let Some(p) = pool {
                trace.event_pools.push((index + 1, p));
            }
        }
        Ok(())
    }

    /// The private pool of entry `e` (event `index`), given the pool of the segment that held
    /// its address before it: an allocation's free is in its allocation's pool; otherwise
    /// the entry's own `pool_id` (torch 2.12+) wins over its segment's (older snapshots name
    /// pools only on final segments).
    fn pool_of(&mut self, e: &Entry, extra: Extra, segment_pool: Option<u16>, index: u32) -> Option<u16> {
        let dev = e.device as usize;
        let given = extra.pool_given.then_some(extra.pool);
        match e.action {
            Action::Alloc => {
                let pool = given.unwrap_or_else(|| self.states[dev].private_pool_at(e.addr));
                if self.track_live {
                    self.live.insert((e.device, e.addr), (index, pool));
                }
                pool
            }
            Action::FreeRequested | Action::Free | Action::FreeCompleted => {
                let allocated = if self.track_live { self.live.remove(&(e.device, e.addr)).map(|(_, p)| p) } else { None };
                if let (Some(a), Some(g)) = (allocated, given) {
                    if a != g {
                        self.pool_mismatches += 1;
                    }
                }
                allocated.or(given).unwrap_or(segment_pool)
            }
            Action::SegmentAlloc | Action::SegmentMap => {
                let pool = given.unwrap_or_else(|| self.final_private.get(&(dev, e.addr)).copied());
                self.states[dev].set_private_pool(e.addr, pool);
                pool
            }
            Action::SegmentFree | Action::SegmentUnmap => segment_pool.or(given.flatten()),
            Action::Snapshot | Action::Oom | Action::Annotate => given.flatten(),
        }
    }

    /// An `annotate` entry: its text becomes a note of the live allocation at its address,
    /// with the annotating call's stack.
    fn annotate(&mut self, v: &View, e: &Entry, compactor: &mut Compactor, trace: &mut Trace) -> Result<(), ImportError> {
        let Some(&(event, _)) = self.live.get(&(e.device, e.addr)) else {
            self.annotations_not_live += 1;
            return Ok(());
        };
        let Some(text) = compactor.extras.get(e.extra).user else { return Ok(()) };
        let ts_ns = (e.time_us.max(0) as u64).saturating_mul(1000);
        let stack = self.attribute(v, e, ts_ns, &mut compactor.local, trace)?.stack;
        let text = compactor.extras.trace_text(text, trace);
        trace.event_notes.push(EventNote { event, kind: NoteKind::Annotation, text, ts_ns, stack });
        Ok(())
    }

    /// Takes an entry; applies it to its device's allocator model and gives the event it makes.
    fn size_event(&mut self, e: &Entry, local_streams: &LocalStreams, trace: &mut Trace) -> Result<SizedEvent, ImportError> {
        let dev = e.device as usize;
        let state = &mut self.states[dev];
        let mut completes = false;
        let (event_type, size_bytes) = match e.action {
            Action::Alloc => (EventType::Alloc, state.alloc(e.addr, e.size)),
            Action::FreeRequested => {
                let size = match state.free_requested(e.addr) {
                    Some(s) => s,
                    None => {
                        let size = self.loose_allocated.remove(&(dev, e.addr)).unwrap_or_else(|| {
                            self.estimated += 1;
                            state.config().round_size(e.size)
                        });
                        self.pending_free.insert((dev, e.addr), size);
                        size
                    }
                };
                (EventType::Free, size)
            }
            Action::Free => {
                let size = match state.free(e.addr).or_else(|| self.loose_allocated.remove(&(dev, e.addr))) {
                    Some(s) => s,
                    None => {
                        self.estimated += 1;
                        state.config().round_size(e.size)
                    }
                };
                completes = true;
                (EventType::Free, size)
            }
            Action::FreeCompleted => {
                if let Some(size) = state.free_pending(e.addr) {
                    (EventType::FreeCompleted, size)
                } else if let Some(size) = self.pending_free.remove(&(dev, e.addr)) {
                    state.free(e.addr);
                    (EventType::FreeCompleted, size)
                } else if let Some(size) = state.free_allocated(e.addr) {
                    // No request came first: the completion is the free (memory_viz reads it so).
                    completes = true;
                    (EventType::Free, size)
                } else if let Some(size) = self.loose_allocated.remove(&(dev, e.addr)) {
                    // (No block of the model is allocated there: nothing to free in it.)
                    completes = true;
                    (EventType::Free, size)
                } else {
                    (EventType::FreeCompleted, state.config().round_size(e.size))
                }
            }
            Action::SegmentAlloc | Action::SegmentMap => {
                let stream = self.streams.index(trace, local_streams.raw(e.stream))?;
                let pool = self.final_pool.get(&(dev, e.addr)).copied().unwrap_or_else(|| pool_for_segment(e.size));
                self.states[dev].segment_alloc(e.addr, e.size, dev as u8, stream, pool);
                let et = if e.action == Action::SegmentAlloc { EventType::SegmentAlloc } else { EventType::SegmentMap };
                (et, e.size)
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                state.segment_free(e.addr);
                let et = if e.action == Action::SegmentFree { EventType::SegmentFree } else { EventType::SegmentUnmap };
                (et, e.size)
            }
            Action::Snapshot | Action::Annotate => (EventType::Snapshot, 0),
            Action::Oom => (EventType::Oom, e.size),
        };
        Ok(SizedEvent { event_type, size_bytes, completes })
    }

    /// Takes an entry at `ts_ns`; gives its stack, and the phase and layer the stack names,
    /// unless an optimizer step was running then.
    fn attribute(
        &mut self,
        v: &View,
        e: &Entry,
        ts_ns: u64,
        local: &mut LocalFrames,
        trace: &mut Trace,
    ) -> Result<Attribution, ImportError> {
        let dev = e.device as usize;
        let mut by = match e.frames.get() {
            Some(f) => {
                let s = self.interner.stack(v, local, trace, f, &|| format!("device_traces[{dev}][{}].frames", e.index))?;
                Attribution { stack: Some(s.stack), phase: s.phase, layer: s.layer }
            }
            None => Attribution { stack: None, phase: Phase::Other, layer: StrId::NONE },
        };
        while self.span_cursor < self.optimizer_spans.len() && self.optimizer_spans[self.span_cursor].end_ns < ts_ns {
            self.span_cursor += 1;
        }
        if let Some(span) = self.optimizer_spans.get(self.span_cursor) {
            if span.start_ns <= ts_ns {
                by.phase = Phase::Optimizer;
                by.layer = span.name;
            }
        }
        Ok(by)
    }
}

/// The annotations of `ann` as scopes, within `entries_ns` (the first and last trace entries'
/// times): those wholly outside are left out, and one that crosses an end is cut there. The
/// recorder keeps as many annotations as trace entries (its annotation buffer takes the same
/// `max_entries`), and with a few annotations per iteration against hundreds of entries, a
/// snapshot whose trace buffer wrapped holds annotations from long before its first entry (a
/// window of 70 000 entries of a real run, 1.07 s, came with annotations over 69 s). Kept, they
/// stretched the timeline over time without memory data (the peak drawn at 35 s of 36, its
/// 1.07 s in the last 3 % of the chart) and counted 4 531 iterations where there were 73.
pub(super) fn import_annotations(
    v: &View,
    trace: &mut Trace,
    ann: ValueId,
    entries_ns: Option<(u64, u64)>,
    budget: &mut WalkBudget,
) -> Result<(), ImportError> {
    let (from, to) = entries_ns.unwrap_or((0, u64::MAX));
    let mut outside = 0usize;
    let mut open: HashMap<String, Vec<u64>> = HashMap::default();
    for (i, &a) in v.list(ann, "external_annotations")?.iter().enumerate() {
        let path = format!("external_annotations[{i}]");
        budget.charge(v, a, &path)?;
        let (Some(stage), Some(name)) = (v.opt_str(a, "stage"), v.opt_str(a, "name")) else {
            continue;
        };
        let ts = (v.int(a, "time_us", &path)?.max(0) as u64).saturating_mul(1000);
        match stage {
            "START" => open.entry(name.to_owned()).or_default().push(ts),
            "END" => {
                if let Some(start) = open.get_mut(name).and_then(Vec::pop) {
                    if ts < from || start > to {
                        outside += 1;
                        continue;
                    }
                    let phase = if name.starts_with("Optimizer.") { Phase::Optimizer } else { Phase::Other };
                    let id = trace.strings.intern(name);
                    let (start_ns, end_ns) = (start.max(from), ts.min(to));
                    trace.scopes.push(LayerScope { name: id, start_ns, end_ns, depth: 0, phase, thread: 0 });
                }
            }
            _ => {}
        }
    }
    if outside > 0 {
        trace.meta.warnings.push(format!(
            "{outside} annotated spans outside the trace entries' time were left out (the recorder keeps as many annotations as \
             trace entries, so a wrapped trace's annotations reach further than its entries)"
        ));
    }
    trace.scopes.sort_by_key(|s| (s.start_ns, std::cmp::Reverse(s.end_ns)));
    Ok(())
}
