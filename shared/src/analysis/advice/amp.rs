//! AMP advice: the allocated curve under autocast (activations in half precision, the weights'
//! half-precision copies from [`weight_copies`]), and checkpointing under AMP where it lowers the
//! AMP peak further. Which operators autocast casts is `autocast.rs`'s.

use super::curve::{span_of, Block, Curve, Range};
use super::reserved::{Proposal, ReservedBy};
use super::search::{greedy, scenario, CandidateDef, Engine};
use super::{autocast, Ctx, SuggestionKind};
use crate::hash::FastMap;
use crate::model::{Phase, INPUT_LAYER};
use crate::units::{format_bytes, format_seconds};
use std::collections::{BTreeMap, BTreeSet};

/// Autocast's half-precision weight copies: each weight a half-precision op reads in a forward
/// is cast once and kept (saved for the backward) until the last backward op that reads it, or
/// the forward's end when none does. Ranges of positions with their bytes, and the bytes of
/// all copies. `None` without tensor ids.
pub(super) fn weight_copies(c: &Curve) -> Option<(Vec<Range>, u64, crate::hash::FastSet<u64>)> {
    let trace = c.trace;
    if !trace.tensors.iter().any(|t| t.storage_id != 0) {
        return None;
    }
    // Before the first forward: model building (an iteration found from the run's own marks
    // can start at the trace's start, with the weights inside it).
    let first_forward = trace.ops.iter().filter(|o| o.phase == Phase::Forward).map(|o| o.start_ns).min();
    let first = first_forward.or_else(|| c.spans.first().map(|s| s.0)).unwrap_or(0);
    let input = trace.strings.lookup(INPUT_LAYER);
    // Alive throughout: to the trace's end, or to the teardown after the last operator.
    let last_ts = c.ts.last().copied().unwrap_or(0);
    let last_op = trace.ops.iter().map(|o| o.end_ns).max().unwrap_or(last_ts).min(last_ts);
    // Weights: allocated before the first iteration (not the input batch), alive throughout.
    let weights: FastMap<u64, u64> = c
        .blocks
        .iter()
        .filter(|b| c.ts[b.alloc_pos] < first && b.free_pos.is_none_or(|f| c.ts[f] >= last_op))
        .filter(|b| Some(trace.events.layer[c.event[b.alloc_pos]]) != input)
        .map(|b| (b.address, b.size_bytes))
        .collect();
    // (iteration, address) → (first forward read, last backward read).
    let mut uses: BTreeMap<(Option<u32>, u64), (u64, Option<u64>)> = BTreeMap::new();
    for o in &trace.ops {
        let fwd = o.phase == Phase::Forward && autocast::is_lower_precision(trace.str(o.name));
        if !fwd && o.phase != Phase::Backward {
            continue;
        }
        let k = span_of(&c.spans, o.start_ns);
        for t in trace.tensors.get(o.inputs.0 as usize..o.inputs.1 as usize).unwrap_or(&[]) {
            if !weights.contains_key(&t.storage_id) {
                continue;
            }
            if fwd {
                let e = uses.entry((k, t.storage_id)).or_insert((o.start_ns, None));
                e.0 = e.0.min(o.start_ns);
            } else if let Some(e) = uses.get_mut(&(k, t.storage_id)) {
                e.1 = Some(e.1.map_or(o.end_ns, |x: u64| x.max(o.end_ns)));
            }
        }
    }
    let mut ranges = Vec::new();
    let mut cast: BTreeSet<u64> = BTreeSet::new();
    for (&(k, addr), &(start, last_bwd)) in &uses {
        let bytes = weights.get(&addr).copied().unwrap_or(0) / 2;
        let end = match last_bwd {
            Some(t) => c.pos_after(t),
            None => k.and_then(|k| c.bounds(k as usize, Phase::Forward)).map_or(c.len(), |(_, l)| l + 1),
        };
        ranges.push((c.pos_at_or_after(start), end, bytes as i64));
        cast.insert(addr);
    }
    let total = cast.iter().map(|a| weights.get(a).copied().unwrap_or(0) / 2).sum();
    Some((ranges, total, weights.keys().copied().collect()))
}

/// The replay under autocast.
pub(super) struct Amp {
    pub(super) curve: Vec<i64>,
    /// Bytes of the weights' half-precision copies.
    pub(super) weight_copies: u64,
    /// What the replay changed, in words.
    pub(super) text: String,
    /// The operator-level model, where the trace has tensor ids.
    pub(super) plan: Option<autocast::Plan>,
}

impl Amp {
    /// The size of a block under autocast.
    pub(super) fn size(&self, c: &Curve, b: &Block) -> u64 {
        match &self.plan {
            Some(p) => p.size(c, b),
            None if c.is_activation(b) => b.size_bytes / 2,
            None => b.size_bytes,
        }
    }
}

/// The allocated curve under autocast. With tensor ids, the operators' own types under
/// autocast ([`autocast`]) and the weights' half-precision copies; without them, activations
/// halved and the weights' copies (`weights`, from the graph profile) alive over each forward
/// and backward.
pub(super) fn amp_curve(c: &Curve, weights: Option<u64>) -> Amp {
    let half = |b: &Block| c.is_activation(b).then_some(b.size_bytes / 2);
    if let Some((ranges, total, cast)) = weight_copies(c) {
        let plan = autocast::plan(c, &cast);
        let weights_text = format!(
            "autocast keeps a half-precision copy of each weight a convolution or matmul reads ({}) from its forward use to its last backward use",
            format_bytes(total)
        );
        if plan.typed == 0 {
            // Tensor ids without shapes: no types to follow; activations halve.
            let text = format!("activations (allocated in the forward, freed in the backward) halve (the trace tells no tensor's type), and {weights_text}");
            return Amp { curve: c.replay(&half, &ranges), weight_copies: total, text, plan: None };
        }
        let size = |b: &Block| Some(plan.size(c, b)).filter(|&s| s != b.size_bytes);
        let mut extra = ranges;
        extra.extend_from_slice(&plan.copies);
        extra.extend(plan.shortened.values().copied());
        let curve = c.replay(&size, &extra);
        let mut text = format!(
            "each operator's output takes the type autocast gives it ({} operators run in bf16; fp32 for norms, softmax and losses, the promoted type elsewhere), gradients their tensors' types, autocast's copies of fp32 activations for bf16 operators and of bf16 inputs for fp32 ones ({} over the trace) are added while they are kept, fp32 activations only bf16 operators read go once read, and {weights_text}",
            plan.lower_ops,
            format_bytes(plan.copy_bytes),
        );
        if plan.fused_attention > 0 {
            text.push_str(&format!(
                "; {} attention calls the fp32 run computed by the math path run fused in bf16 (only their output and log-sum-exp are kept)",
                plan.fused_attention
            ));
        }
        return Amp { curve, weight_copies: total, text, plan: Some(plan) };
    }
    // Without tensor ids: every weight's copy from the forward's start to the backward's end.
    let w = weights.map_or(0, |w| w / 2);
    let mut ranges = Vec::new();
    for k in 0..c.spans.len() {
        if let (Some((f, _)), Some((_, l))) = (c.bounds(k, Phase::Forward), c.bounds(k, Phase::Backward)) {
            ranges.push((f, l + 1, w as i64));
        }
    }
    let text = if w > 0 {
        format!("activations (allocated in the forward, freed in the backward) halve, and autocast's half-precision weight copies ({}) are assumed alive from the forward's start to the backward's end (the trace has no tensor ids)", format_bytes(w))
    } else {
        "activations (allocated in the forward, freed in the backward) halve; autocast's half-precision weight copies are not counted (the trace tells neither the weights nor the tensors)".to_owned()
    };
    Amp { curve: c.replay(&half, &ranges), weight_copies: w, text, plan: None }
}

/// AMP, and checkpointing under AMP where it lowers the AMP peak further.
pub(super) fn amp_advice(ctx: &Ctx, defs: &[CandidateDef], times: &[f64], out: &mut Vec<Proposal>, notes: &mut Vec<String>) {
    let c = &ctx.c;
    let amp = amp_curve(c, ctx.persistent.weights);
    if amp.plan.as_ref().is_some_and(|p| p.lower_ops == 0) {
        notes.push("mixed precision would not change this run's memory: the trace records no operator autocast runs in bf16 (matmul, linear, convolution, attention)".to_owned());
        return;
    }
    let (amp_peak, amp_pos) = c.peak_of(&amp.curve);
    let s = ctx.suggestion(
        SuggestionKind::Amp,
        "mixed precision: run the forward under torch.autocast (bf16, or fp16 with a GradScaler)".to_owned(),
        amp_peak,
        format!(
            "parameters, gradients and optimizer state stay fp32; {} ({} of activations alive at the measured peak); replayed, the peak is {} {}. Time is not predicted: on GPUs with tensor cores it usually drops",
            amp.text,
            format_bytes(ctx.activations_at_peak),
            format_bytes(amp_peak),
            c.describe(amp_pos)
        ),
        vec![
            ("activation_bytes_at_measured_peak", ctx.activations_at_peak as f64),
            ("half_precision_weight_copies_bytes", amp.weight_copies as f64),
            ("autocast_copies_bytes", amp.plan.as_ref().map_or(0, |p| p.copy_bytes) as f64),
        ],
    );
    out.push(Proposal::new(s, ReservedBy::AllocatedSaving));
    if defs.is_empty() || ctx.target.is_some_and(|b| amp_peak <= b) {
        return;
    }
    let size = |b: &Block| amp.size(c, b);
    let copies = amp.plan.as_ref().map_or(&[][..], |p| &p.copies[..]);
    let mut engine = Engine::new(c, &amp.curve, scenario(c, defs, &amp.curve, &size, copies));
    let Some(step) = greedy(&mut engine, times, ctx.target, ctx.min_gain()).pop().filter(|s| !s.chosen.is_empty() && s.peak < amp_peak)
    else {
        return;
    };
    let mut ks = step.chosen.clone();
    ks.sort_by_key(|&k| (defs[k].first_start_ns, k));
    let layers: Vec<String> = ks.iter().map(|&k| defs[k].path.clone()).collect();
    let extra_s: f64 = ks.iter().map(|&k| times[k]).sum();
    let mut s = ctx.suggestion(
        SuggestionKind::CheckpointAmp,
        format!("mixed precision (torch.autocast) and checkpoint {}", layers.join(", ")),
        step.peak,
        format!(
            "the AMP replay ({} peak) with these modules' half-precision activations dropped until their backward and recomputed there ({} per iteration, before AMP's speed-up); replayed, the peak is {} {}",
            format_bytes(amp_peak),
            format_seconds(extra_s),
            format_bytes(step.peak),
            ctx.describe_at(defs, step.at)
        ),
        vec![("recompute_s", extra_s), ("amp_peak_bytes", amp_peak as f64), ("layers", layers.len() as f64)],
    );
    s.layers = layers;
    s.extra_time_per_iteration_s = Some(extra_s);
    out.push(Proposal::new(s, ReservedBy::AllocatedSaving));
}
