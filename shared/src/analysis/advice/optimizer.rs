//! Optimizer advice: state bytes per parameter, and the peak with less of it.

use super::curve::Block;
use super::reserved::{BlockEdit, Proposal, ReservedBy};
use super::{Ctx, SuggestionKind};
use crate::units::format_bytes;

/// Optimizer state: bytes per parameter, and the peak with less of it.
pub(super) fn optimizer_advice(ctx: &Ctx, out: &mut Vec<Proposal>) {
    let c = &ctx.c;
    let state: Vec<&Block> = c.blocks.iter().filter(|b| c.is_optimizer_state(b)).collect();
    if state.is_empty() {
        return;
    }
    let state_bytes = ctx.persistent.optimizer_state.filter(|&s| s > 0).unwrap_or_else(|| {
        // The most state alive at once.
        let mut deltas: Vec<(usize, i64)> = Vec::new();
        for b in &state {
            deltas.push((b.alloc_pos, b.size_bytes as i64));
            if let Some(f) = b.free_pos {
                deltas.push((f, -(b.size_bytes as i64)));
            }
        }
        deltas.sort_unstable();
        let (mut run, mut best) = (0i64, 0i64);
        for (_, d) in deltas {
            run += d;
            best = best.max(run);
        }
        best.max(0) as u64
    });
    let scaled = |num: u64, den: u64| {
        let f = |b: &Block| c.is_optimizer_state(b).then(|| (b.size_bytes as u128 * num as u128 / den as u128) as u64);
        c.peak_of(&c.replay(&f, &[]))
    };
    let (p0, pos0) = scaled(0, 1);
    let per_param = ctx.persistent.weights.filter(|&w| w >= 4).map(|w| state_bytes as f64 / (w as f64 / 4.0));
    let mut numbers = vec![("optimizer_state_bytes", state_bytes as f64)];
    let (what, alternatives) = match per_param {
        Some(bpp) if bpp >= 6.0 => {
            let (p8, _) = scaled(1, 4);
            let (p4, _) = scaled(1, 2);
            numbers.push(("peak_with_8bit_state_bytes", p8 as f64));
            numbers.push(("peak_with_half_state_bytes", p4 as f64));
            (
                format!("{bpp:.1} B of state per parameter: Adam/AdamW-like (8 B/param fp32)"),
                format!(
                    "8-bit Adam/AdamW (bitsandbytes, 2 B/param: peak {}), Adafactor (factored second moments, near 0 B/param for matrices: peak {} with the state dropped) or SGD with momentum (4 B/param: peak {})",
                    format_bytes(p8),
                    format_bytes(p0),
                    format_bytes(p4)
                ),
            )
        }
        Some(bpp) if bpp >= 2.0 => (
            format!("{bpp:.1} B of state per parameter: SGD with momentum-like (4 B/param fp32)"),
            format!("plain SGD (no momentum, 0 B/param: peak {}), at the cost of convergence", format_bytes(p0)),
        ),
        Some(bpp) => (format!("{bpp:.1} B of state per parameter"), format!("an optimizer without state (peak {})", format_bytes(p0))),
        None => (
            "state per parameter unknown: the trace does not tell the parameters' size".to_owned(),
            format!("8-bit Adam, Adafactor or plain SGD (all state dropped: peak {})", format_bytes(p0)),
        ),
    };
    if let Some(bpp) = per_param {
        numbers.push(("state_bytes_per_parameter", bpp));
    }
    // The suggestion's peak is the one with all state dropped: so is its replay.
    let edit = BlockEdit {
        sizes: (0..c.blocks.len() as u32).filter(|&b| c.is_optimizer_state(&c.blocks[b as usize])).map(|b| (b, 0)).collect(),
        absent: Vec::new(),
    };
    let s = ctx.suggestion(
        SuggestionKind::Optimizer,
        format!("an optimizer with less state: {alternatives}"),
        p0,
        format!(
            "{} of optimizer state ({what}); with it dropped, the replayed peak is {} {}. Convergence and time are not predicted",
            format_bytes(state_bytes),
            format_bytes(p0),
            c.describe(pos0)
        ),
        numbers,
    );
    out.push(Proposal::new(s, ReservedBy::Blocks(edit)));
}
