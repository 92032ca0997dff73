//! `zero_grad(set_to_none=True)` advice: gradients zeroed in place, absent from each later forward
//! until the backward writes them again.

use super::curve::{Block, Range};
use super::reserved::{BlockEdit, Proposal, ReservedBy};
use super::{Ctx, SuggestionKind};
use crate::hash::FastMap;
use crate::model::Phase;
use crate::units::format_bytes;
use std::collections::BTreeSet;

/// Gradients zeroed in place rather than freed: absent from each later forward until the
/// backward first touches them (or, without tensor ids, until the backward starts).
pub(super) fn set_to_none_advice(ctx: &Ctx, out: &mut Vec<Proposal>) {
    let c = &ctx.c;
    let trace = c.trace;
    let kept: Vec<(u32, &Block)> = c
        .blocks
        .iter()
        .enumerate()
        .map(|(k, b)| (k as u32, b))
        .filter(|(_, b)| c.is_gradient(b))
        .filter(|(_, b)| {
            c.iteration[b.alloc_pos]
                .is_some_and(|k| (k as usize + 1) < c.spans.len() && b.free_pos.is_none_or(|f| c.iteration[f].is_none_or(|fk| fk > k)))
        })
        .collect();
    if kept.is_empty() {
        return;
    }
    let addresses: BTreeSet<u64> = kept.iter().map(|(_, b)| b.address).collect();
    let mut touches: FastMap<u64, Vec<u64>> = FastMap::default();
    for o in trace.ops.iter().filter(|o| o.phase == Phase::Backward) {
        for r in [o.inputs, o.outputs] {
            for t in trace.tensors.get(r.0 as usize..r.1 as usize).unwrap_or(&[]) {
                if addresses.contains(&t.storage_id) {
                    touches.entry(t.storage_id).or_default().push(o.start_ns);
                }
            }
        }
    }
    for v in touches.values_mut() {
        v.sort_unstable();
    }
    let mut ranges: Vec<Range> = Vec::new();
    let mut edit = BlockEdit::default();
    let mut kept_bytes = 0u64;
    for &(k_block, b) in &kept {
        let born = c.iteration[b.alloc_pos].unwrap_or(0) as usize;
        let mut counted = false;
        for k in born + 1..c.spans.len() {
            let e = c.spans[k].1;
            let (Some((f, _)), Some((bw, _))) = (c.bounds(k, Phase::Forward), c.bounds(k, Phase::Backward)) else {
                continue;
            };
            if !c.alive_at(b, f) {
                continue;
            }
            let bw_ts = c.ts[bw];
            let touched = touches.get(&b.address).and_then(|v| v.get(v.partition_point(|&t| t < bw_ts)).copied()).filter(|&t| t <= e);
            let back = touched.map_or(bw, |t| c.pos_at_or_after(t).max(bw));
            let back = b.free_pos.map_or(back, |fp| back.min(fp));
            if f < back {
                ranges.push((f, back, -(b.size_bytes as i64)));
                edit.absent.push((k_block, f, back));
                counted = true;
            }
        }
        if counted {
            kept_bytes += b.size_bytes;
        }
    }
    if kept_bytes == 0 {
        return;
    }
    let (p, pos) = c.peak_of(&c.replay(&|_| None, &ranges));
    let s = ctx.suggestion(
        SuggestionKind::SetToNone,
        "optimizer.zero_grad(set_to_none=True) (the default since PyTorch 2.0; also model.zero_grad)".to_owned(),
        p,
        format!(
            "{} of gradients stay allocated from one iteration to the next (zeroed, not freed); freed instead, they are absent from each forward until the backward writes them{}; replayed, the peak is {} {}. Time: one memset less per gradient",
            format_bytes(kept_bytes),
            if ctx.has_tensor_ids { "" } else { " (assumed at the backward's start: the trace has no tensor ids)" },
            format_bytes(p),
            c.describe(pos)
        ),
        vec![("gradient_bytes_kept_across_iterations", kept_bytes as f64)],
    );
    out.push(Proposal::new(s, ReservedBy::Blocks(edit)));
}
