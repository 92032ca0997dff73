//! The memory breakdown: allocated bytes by tensor class at each node's peak in the reference
//! iteration, replayed from the main device's events.

use super::blocks::{Blocks, NO_BLOCK};
use super::measure::{AllocationCurve, NodeMeasure};
use super::{BreakdownRow, TensorClass};
use crate::model::{EventType, Trace};

/// Where to take the parts for one rank; ordered by position, as the replay meets them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Sample {
    /// Position in the curve; `None`: before every event.
    pos: Option<usize>,
    rank: usize,
}

/// Takes the curve, the classified blocks and the reference iteration's measures; gives one
/// row per rank of that iteration, taken at the node's peak.
pub(super) fn breakdown(
    trace: &Trace,
    curve: &AllocationCurve,
    blocks: &Blocks,
    class: &[TensorClass],
    reference: &[NodeMeasure],
) -> Vec<BreakdownRow> {
    let ev = &trace.events;
    let base_alloc = curve.base_alloc;
    let known_base: u64 = blocks.blocks.iter().filter(|b| b.from_event && b.alloc_ts.is_none()).map(|b| b.size_bytes).sum();
    let mut parts = [0u64; 5];
    parts[4] = base_alloc.saturating_sub(known_base);
    for (b, c) in blocks.blocks.iter().zip(class) {
        if b.from_event && b.alloc_ts.is_none() {
            parts[*c as usize] += b.size_bytes;
        }
    }
    let mut wanted: Vec<Sample> = reference.iter().enumerate().map(|(rank, m)| Sample { pos: m.peak_pos, rank }).collect();
    wanted.sort_unstable();
    let mut rows = vec![BreakdownRow::default(); wanted.len()];
    let mut w = 0;
    while w < wanted.len() && wanted[w].pos.is_none() {
        rows[wanted[w].rank] = row(wanted[w].rank, &parts, base_alloc);
        w += 1;
    }
    for (pos, &i) in curve.ev_index.iter().enumerate() {
        if w >= wanted.len() {
            break;
        }
        let b = blocks.event_block[i];
        if b != NO_BLOCK {
            let c = class[b as usize] as usize;
            let s = blocks.blocks[b as usize].size_bytes;
            match ev.event_type(i) {
                EventType::Alloc => parts[c] += s,
                EventType::Free => parts[c] = parts[c].saturating_sub(s),
                _ => {}
            }
        }
        while w < wanted.len() && wanted[w].pos == Some(pos) {
            rows[wanted[w].rank] = row(wanted[w].rank, &parts, curve.alloc[pos]);
            w += 1;
        }
    }
    rows
}

/// Takes the breakdown; gives a warning when some rows' parts do not add up to their total.
pub(super) fn mismatch_warning(rows: &[BreakdownRow]) -> Option<String> {
    let mismatched =
        rows.iter().filter(|r| r.weights + r.gradients + r.activations + r.optimizer_state + r.other != r.total_allocated).count();
    (mismatched > 0).then(|| {
        format!(
            "at {mismatched} ranks the allocator's total differs from the sum of the blocks it reported (the source corrected its running totals)"
        )
    })
}

fn row(rank: usize, parts: &[u64; 5], total_allocated: u64) -> BreakdownRow {
    BreakdownRow {
        rank,
        weights: parts[TensorClass::Param as usize],
        gradients: parts[TensorClass::Grad as usize],
        activations: parts[TensorClass::Act as usize],
        optimizer_state: parts[TensorClass::OptState as usize],
        other: parts[TensorClass::Other as usize],
        total_allocated,
    }
}
