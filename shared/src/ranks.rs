//! The ranks of a merged trace ([`crate::merge`]): which there are, one rank as a trace of its
//! own, and what merging and cutting share (thread ids that carry their rank, pools and notes
//! carried over to another trace's events). Depends on the model only, so analyses that look
//! at one rank need not depend on merging.

use crate::model::{EventRecord, Mark, StrId, Trace};

/// Threads of different processes get distinct ids: the rank goes in the top bits.
pub(crate) fn thread_of(rank: u32, thread: u64) -> u64 {
    (u64::from(rank) + 1) << 48 | (thread & ((1 << 48) - 1))
}

/// The rank a merged thread id belongs to.
fn rank_of_thread(thread: u64) -> Option<u32> {
    u32::try_from(thread >> 48).ok()?.checked_sub(1)
}

/// How one trace's strings and stacks appear in another.
pub trait IdMap {
    fn text(&mut self, out: &mut Trace, id: StrId) -> StrId;
    fn stack(&mut self, out: &mut Trace, stack: u32) -> u32;
    /// A time on the other trace's clock (merged ranks are shifted onto one).
    fn time(&self, ts_ns: u64) -> u64 {
        ts_ns
    }
}

/// The same tables (a trace cut from another with its strings and stacks).
struct SameIds;

impl IdMap for SameIds {
    fn text(&mut self, _: &mut Trace, id: StrId) -> StrId {
        id
    }
    fn stack(&mut self, _: &mut Trace, stack: u32) -> u32 {
        stack
    }
}

/// Each of `src`'s pools as an index into `out`'s, added there if new: pools are one by id.
pub fn pool_map(out: &mut Trace, src: &Trace) -> Vec<u16> {
    src.pools
        .iter()
        .map(|id| match out.pools.iter().position(|p| p == id) {
            Some(k) => k as u16,
            None => {
                out.pools.push(*id);
                (out.pools.len() - 1) as u16
            }
        })
        .collect()
}

/// Appends to `out` the pools, notes, requested sizes and holders of `src`'s events, where event `i`
/// of `src` became `new_index(i)` (`None`: left out), with strings and stacks mapped by `ids`.
/// Pools are shared by id (a device tells two processes' apart). Leaves the lists unsorted.
pub fn carry_event_extras(out: &mut Trace, src: &Trace, new_index: &dyn Fn(u32) -> Option<u32>, ids: &mut dyn IdMap) {
    let pools = pool_map(out, src);
    for &(e, p) in &src.event_pools {
        if let (Some(n), Some(&p)) = (new_index(e), pools.get(p as usize)) {
            out.event_pools.push((n, p));
        }
    }
    for note in &src.event_notes {
        if let Some(n) = new_index(note.event) {
            let stack = note.stack.map(|s| ids.stack(out, s));
            let text = ids.text(out, note.text);
            let ts_ns = ids.time(note.ts_ns);
            out.event_notes.push(crate::model::EventNote { event: n, text, stack, ts_ns, ..*note });
        }
    }
    out.event_requested.extend(src.event_requested.iter().filter_map(|&(e, bytes)| Some((new_index(e)?, bytes))));
    for h in &src.event_holders {
        if let Some(event) = new_index(h.event) {
            let (name, module) = (ids.text(out, h.name), ids.text(out, h.module));
            let (taken_ns, released_ns) = (ids.time(h.taken_ns), h.released_ns.map(|t| ids.time(t)));
            out.event_holders.push(crate::model::EventHolder { event, name, module, taken_ns, released_ns, ..*h });
        }
    }
}

/// The ranks of a merged trace, ascending (empty for a trace of one process).
pub fn ranks(trace: &Trace) -> Vec<u32> {
    let mut r: Vec<u32> = trace.devices.iter().filter_map(|d| d.rank).collect();
    r.sort_unstable();
    r.dedup();
    r
}

/// One rank of a merged trace as a trace of its own: its devices, events (with their
/// totals), stacks, operators, scopes, segments, samples and marks; the job's iterations.
/// `None` when the trace has no such rank.
pub fn rank_trace(trace: &Trace, rank: u32) -> Option<Trace> {
    let keep: Vec<bool> = trace.devices.iter().map(|d| d.rank == Some(rank)).collect();
    if !keep.contains(&true) {
        return None;
    }
    let mut meta = trace.meta.clone();
    let prefix = format!("rank{rank}.");
    meta.reported = trace.meta.reported.iter().filter_map(|(k, v)| Some((k.strip_prefix(&prefix)?.to_owned(), *v))).collect();
    let said = format!("rank {rank}: ");
    meta.warnings = trace.meta.warnings.iter().filter_map(|w| w.strip_prefix(&said).map(str::to_owned)).collect();
    meta.missing_ranks.clear();
    let mut out = Trace::new(meta);
    out.strings = trace.strings.clone();
    out.streams = trace.streams.clone();
    let devices: Vec<u8> = trace
        .devices
        .iter()
        .enumerate()
        .map(|(k, d)| {
            if !keep[k] {
                return u8::MAX;
            }
            let nd = out.device_index(d.clone());
            out.events.set_base_totals(nd as usize, trace.events.base_totals.get(k).copied().unwrap_or_default());
            nd
        })
        .collect();
    let kept = |d: u8| devices.get(d as usize).copied().filter(|&n| n != u8::MAX);
    out.stacks.frames = trace.stacks.frames.clone();
    out.stacks.stacks = trace.stacks.stacks.clone();
    out.stacks.frame_ids = trace.stacks.frame_ids.clone();
    let mut cur = trace.events.cursor();
    let mut new_of = if trace.has_event_extras() { vec![u32::MAX; trace.events.len()] } else { Vec::new() };
    for i in 0..trace.events.len() {
        let totals = cur.advance();
        let rec = trace.events.record(i);
        let Some(device) = kept(rec.device) else { continue };
        if let Some(stack) = trace.stacks.stack_of_event(i) {
            out.stacks.event_stacks.push((out.events.len() as u32, stack));
        }
        if let Some(slot) = new_of.get_mut(i) {
            *slot = out.events.len() as u32;
        }
        out.events.push(EventRecord { device, totals: Some(totals), ..rec });
    }
    let new_index = |i: u32| new_of.get(i as usize).copied().filter(|&n| n != u32::MAX);
    // Into an empty list, the pools keep their indices, as the segments copied below expect.
    carry_event_extras(&mut out, trace, &new_index, &mut SameIds);
    let mine = |thread: u64| rank_of_thread(thread) == Some(rank);
    out.shapes = trace.shapes.clone();
    out.tensors = trace.tensors.clone();
    out.ops = trace.ops.iter().filter(|o| mine(o.thread)).cloned().collect();
    out.scopes = trace.scopes.iter().filter(|s| mine(s.thread)).cloned().collect();
    out.initial_segments =
        trace.initial_segments.iter().filter_map(|s| Some(crate::model::SegmentInfo { device: kept(s.device)?, ..s.clone() })).collect();
    out.device_samples =
        trace.device_samples.iter().filter_map(|s| Some(crate::model::DeviceSample { device: kept(s.device)?, ..*s })).collect();
    out.marks = trace.marks.iter().filter(|m| m.rank == Some(rank)).map(|m| Mark { rank: None, ..*m }).collect();
    out.ledger.events =
        trace.ledger.events.iter().filter_map(|e| Some(crate::model::LedgerEvent { device: kept(e.device)?, ..*e })).collect();
    out.ledger.process =
        trace.ledger.process.iter().filter_map(|p| Some(crate::model::ProcessSample { device: kept(p.device)?, ..*p })).collect();
    let prefix = format!("rank {rank}: ");
    out.ledger.missing = trace.ledger.missing.iter().filter_map(|w| w.strip_prefix(&prefix).map(str::to_owned)).collect();
    out.iterations = trace.iterations.clone();
    out.finish();
    Some(out)
}
