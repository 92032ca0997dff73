//! The ranks of a merged trace, and one rank taken back out as a trace of its own.

use super::carry::{carry_event_extras, rank_of_thread, IdMap};
use crate::model::{EventRecord, Mark, StrId, Trace};

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
