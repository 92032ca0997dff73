//! Smaller-batch advice: the largest batch that meets the budget, or half the batch without one.

use super::curve::Block;
use super::reserved::{BlockEdit, Proposal, ReservedBy};
use super::{Ctx, SuggestionKind, NEW_BATCH, NEW_PERCENT};
use crate::units::format_bytes;

/// A smaller batch: the largest that meets the budget, or half the batch without one.
pub(super) fn batch_advice(ctx: &Ctx, batch: Option<u64>, out: &mut Vec<Proposal>, notes: &mut Vec<String>) {
    let c = &ctx.c;
    let peak_for = |num: u64, den: u64| -> (u64, Option<usize>) {
        let scaled = |b: &Block| c.is_batch_dependent(b).then(|| (b.size_bytes as u128 * num as u128 / den as u128) as u64);
        c.peak_of(&c.replay(&scaled, &[]))
    };
    // The scale is num / den: the batch, or percent where the trace does not record it.
    let (den, unit) = match batch.filter(|&b| b > 0) {
        Some(b) => (b, "batch"),
        None => (100, "percent"),
    };
    if den < 2 {
        notes.push("the trace's batch is 1: a smaller batch is not possible".to_owned());
        return;
    }
    let num = match ctx.target {
        // The peak grows with the batch: the largest smaller one that fits.
        Some(b) if peak_for(1, den).0 <= b => {
            let (mut lo, mut hi) = (1u64, den - 1);
            while lo < hi {
                let mid = lo + (hi - lo).div_ceil(2);
                if peak_for(mid, den).0 <= b {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            lo
        }
        Some(_) => 1,
        None => den / 2,
    };
    let (p, pos) = peak_for(num, den);
    let scalable: u64 =
        ctx.peak_pos.map_or(0, |pp| c.blocks.iter().filter(|b| c.is_batch_dependent(b) && c.alive_at(b, pp)).map(|b| b.size_bytes).sum());
    let steps = den.div_ceil(num);
    let edit = BlockEdit {
        sizes: (0..c.blocks.len() as u32)
            .filter(|&b| c.is_batch_dependent(&c.blocks[b as usize]))
            .map(|b| (b, (c.blocks[b as usize].size_bytes as u128 * num as u128 / den as u128) as u64))
            .collect(),
        absent: Vec::new(),
    };
    let change = if unit == "batch" {
        format!("batch {num} instead of {den} (gradient accumulation over {steps} steps keeps an effective batch of {})", num * steps)
    } else {
        format!(
            "a batch {num} % of the traced one (the trace does not record its batch size), with gradient accumulation over {steps} steps"
        )
    };
    let s = ctx.suggestion(
        SuggestionKind::SmallerBatch,
        change,
        p,
        format!(
            "memory allocated and freed within the forward and backward ({} at the measured peak: activations, temporaries, activation gradients) scales with the batch; replayed at {num}/{den}, the peak is {} {}. Time is not predicted: each step takes less, the same samples take about as long (longer at small batches)",
            format_bytes(scalable),
            format_bytes(p),
            c.describe(pos)
        ),
        vec![
            ("batch_dependent_bytes_at_measured_peak", scalable as f64),
            (if unit == "batch" { NEW_BATCH } else { NEW_PERCENT }, num as f64),
            (if unit == "batch" { "traced_batch" } else { "traced_percent" }, den as f64),
            ("accumulation_steps", steps as f64),
        ],
    );
    out.push(Proposal::new(s, ReservedBy::Blocks(edit)));
}
