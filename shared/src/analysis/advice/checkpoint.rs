//! Checkpointing advice: the candidate modules (repeated blocks, else the root's children), each
//! forward call's activations a checkpoint drops and its recomputation, and the parts of memory
//! checkpointing cannot reduce.

use super::curve::{span_of, Block, Curve, NO_BLOCK};
use super::reserved::{Proposal, ReservedBy};
use super::search::{greedy, scenario, Call, CandidateDef, Engine, Step};
use super::{budget_reason, CheckpointCandidate, Ctx, SuggestionKind};
use crate::analysis::median_f64;
use crate::analysis::profile::GraphProfile;
use crate::hash::FastMap;
use crate::model::{Phase, StrId, Trace, INPUT_LAYER};
use crate::units::{format_bytes, format_seconds};
use std::collections::{BTreeMap, BTreeSet};

pub(super) fn under(layer: &str, path: &str) -> bool {
    layer.strip_prefix(path).is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

pub(super) fn is_indexed(path: &str) -> bool {
    path.rsplit('.').next().is_some_and(|c| !c.is_empty() && c.bytes().all(|b| b.is_ascii_digit()))
}

/// The modules to consider for checkpointing: repeated blocks where the model has them, the
/// root's children elsewhere (see the module docs).
pub(super) fn partition(paths: &BTreeSet<&str>) -> Vec<String> {
    fn expand(node: &str, paths: &BTreeSet<&str>, out: &mut Vec<String>, depth: usize) {
        let has_scope = paths.contains(node);
        if has_scope && is_indexed(node) || depth > 64 {
            out.push(node.to_owned());
            return;
        }
        let prefix = format!("{node}.");
        let descendants: Vec<&str> = paths.range(prefix.as_str()..).take_while(|p| p.starts_with(&prefix)).copied().collect();
        if has_scope && !descendants.iter().any(|p| is_indexed(p)) {
            out.push(node.to_owned());
            return;
        }
        let children: BTreeSet<String> =
            descendants.iter().filter_map(|p| p[prefix.len()..].split('.').next().map(|c| format!("{prefix}{c}"))).collect();
        if children.is_empty() {
            if has_scope {
                out.push(node.to_owned());
            }
            return;
        }
        for c in children {
            expand(&c, paths, out, depth + 1);
        }
    }
    let roots: BTreeSet<&str> = paths.iter().filter_map(|p| p.split('.').next()).filter(|r| !r.is_empty()).collect();
    let mut out = Vec::new();
    for r in roots {
        expand(r, paths, &mut out, 0);
    }
    out
}

/// Forward calls of each candidate module, with the activations a checkpoint drops.
pub(super) fn checkpoint_candidates(c: &Curve, notes: &mut Vec<String>) -> Vec<CandidateDef> {
    let by_path = forward_scopes(c.trace);
    let paths: BTreeSet<&str> = by_path.keys().copied().collect();
    let chosen = partition(&paths);
    let mut out = module_calls(c, &by_path, &chosen, notes);
    out.retain(|d| d.calls.iter().any(|call| !call.dropped.is_empty()));
    out.sort_by(|a, b| a.first_start_ns.cmp(&b.first_start_ns).then_with(|| a.path.cmp(&b.path)));
    out
}

/// Forward scopes by module path.
pub(super) fn forward_scopes(trace: &Trace) -> BTreeMap<&str, Vec<(u64, u64)>> {
    let mut by_path: BTreeMap<&str, Vec<(u64, u64)>> = BTreeMap::new();
    for s in &trace.scopes {
        if s.phase != Phase::Forward {
            continue;
        }
        let Some(name) = trace.opt_str(s.name) else {
            continue;
        };
        if name.is_empty() || name == INPUT_LAYER {
            continue;
        }
        by_path.entry(name).or_default().push((s.start_ns, s.end_ns.max(s.start_ns)));
    }
    by_path
}

/// The forward calls of each of `chosen` (module paths with forward scopes) and what their
/// checkpoint would drop.
pub(super) fn module_calls(
    c: &Curve,
    by_path: &BTreeMap<&str, Vec<(u64, u64)>>,
    chosen: &[String],
    notes: &mut Vec<String>,
) -> Vec<CandidateDef> {
    let trace = c.trace;
    // Backward ops (start, layer) and forward ops in start order.
    let mut backward_ops: Vec<(u64, StrId)> = Vec::new();
    let mut forward_ops: Vec<usize> = Vec::new();
    for (i, o) in trace.ops.iter().enumerate() {
        match o.phase {
            Phase::Backward if !o.layer.is_none() => backward_ops.push((o.start_ns, o.layer)),
            Phase::Forward => forward_ops.push(i),
            _ => {}
        }
    }
    backward_ops.sort_unstable();
    forward_ops.sort_by_key(|&i| (trace.ops[i].start_ns, i));
    let has_tensor_ids = trace.tensors.iter().any(|t| t.storage_id != 0);
    if !has_tensor_ids && !chosen.is_empty() {
        notes.push(
            "operators carry no tensor storage ids, so each checkpointed module is assumed to keep only its last allocation alive at its forward's end as its output".to_owned(),
        );
    }
    let mut under_cache: FastMap<(u32, usize), bool> = FastMap::default();

    let mut out = Vec::new();
    for (k, path) in chosen.iter().enumerate() {
        let Some(spans) = by_path.get(path.as_str()) else {
            continue;
        };
        let mut calls = Vec::new();
        for &(fs, fe) in spans {
            let iteration = span_of(&c.spans, fs);
            let it_end = iteration.and_then(|k| c.spans.get(k as usize)).map_or(u64::MAX, |s| s.1);
            let first = c.pos_at_or_after(fs);
            let end = c.pos_after(fe);
            // The module's backward: its first backward op after the forward, else its first
            // backward event.
            let from = backward_ops.partition_point(|o| o.0 <= fe);
            let mut is_under = |layer: StrId| *under_cache.entry((layer.0, k)).or_insert_with(|| under(trace.str(layer), path));
            let bs_op = backward_ops[from..].iter().take_while(|o| o.0 <= it_end).find(|o| is_under(o.1)).map(|o| o.0);
            let backward_pos = match bs_op {
                Some(bs) => c.pos_at_or_after(bs),
                None => match (end..c.len())
                    .take_while(|&p| c.ts[p] <= it_end)
                    .find(|&p| c.phase[p] == Phase::Backward && is_under(trace.events.layer[c.event[p]]))
                {
                    Some(p) => p,
                    None => continue,
                },
            };
            // Kept for the backward: allocated in this forward, alive at its end, freed in
            // the backward.
            let mut kept: Vec<u32> = (first..end)
                .map(|p| c.block_at[p])
                .filter(|&b| b != NO_BLOCK)
                .filter(|&b| {
                    let bl = &c.blocks[b as usize];
                    c.is_activation(bl) && bl.free_pos.is_some_and(|f| f >= end)
                })
                .collect();
            if kept.is_empty() {
                calls.push(Call { first, end, backward_pos, dropped: kept, iteration, forward_ns: fe - fs });
                continue;
            }
            // Outputs: read by a later forward op of another module; they stay.
            let mut outputs: BTreeSet<u32> = BTreeSet::new();
            if has_tensor_ids {
                let by_addr: FastMap<u64, u32> = kept.iter().map(|&b| (c.blocks[b as usize].address, b)).collect();
                let f0 = forward_ops.partition_point(|&i| trace.ops[i].start_ns <= fe);
                let bw_start = bs_op.unwrap_or(u64::MAX).min(it_end);
                for &i in forward_ops[f0..].iter().take_while(|&&i| trace.ops[i].start_ns <= bw_start) {
                    let o = &trace.ops[i];
                    if under(trace.str(o.layer), path) {
                        continue;
                    }
                    for t in trace.tensors.get(o.inputs.0 as usize..o.inputs.1 as usize).unwrap_or(&[]) {
                        if let Some(&b) = by_addr.get(&t.storage_id) {
                            let bl = &c.blocks[b as usize];
                            if bl.free_pos.is_none_or(|f| c.ts[f] >= o.start_ns) {
                                outputs.insert(b);
                            }
                        }
                    }
                }
            } else if let Some(&last) = kept.iter().max_by_key(|&&b| c.blocks[b as usize].alloc_pos) {
                outputs.insert(last);
            }
            kept.retain(|b| !outputs.contains(b));
            calls.push(Call { first, end, backward_pos, dropped: kept, iteration, forward_ns: fe - fs });
        }
        let first_start_ns = spans.iter().map(|s| s.0).min().unwrap_or(0);
        out.push(CandidateDef { path: path.clone(), calls, first_start_ns });
    }
    out
}

/// Median over iterations (after the first, when there are several) of the forward time.
pub(super) fn forward_time_s(def: &CandidateDef) -> f64 {
    let mut per_iter: BTreeMap<Option<u32>, u64> = BTreeMap::new();
    for call in &def.calls {
        *per_iter.entry(call.iteration).or_default() += call.forward_ns;
    }
    let mut v: Vec<f64> = per_iter.values().map(|&ns| ns as f64 * 1e-9).collect();
    if v.len() >= 2 {
        v.remove(0);
    }
    median_f64(&mut v).unwrap_or(0.0)
}

/// The parts of memory checkpointing cannot reduce, where known.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Persistent {
    pub(super) weights: Option<u64>,
    pub(super) gradients: Option<u64>,
    pub(super) optimizer_state: Option<u64>,
    /// The most weights + gradients + optimizer state together.
    pub(super) floor: Option<u64>,
}

pub(super) fn persistent_from_profile(p: &GraphProfile) -> Option<Persistent> {
    if p.breakdown.is_empty() {
        return None;
    }
    Some(Persistent {
        weights: p.breakdown.iter().map(|r| r.weights).max(),
        gradients: p.breakdown.iter().map(|r| r.gradients).max(),
        optimizer_state: p.breakdown.iter().map(|r| r.optimizer_state).max(),
        floor: p.breakdown.iter().map(|r| r.weights + r.gradients + r.optimizer_state).max(),
    })
}

/// Parameters from allocation stacks (snapshots): blocks alive at `pos` that `nn.Module.to` /
/// `_apply` or a module's constructor allocated.
pub(super) fn weights_from_stacks(c: &Curve, pos: Option<usize>) -> Option<u64> {
    let trace = c.trace;
    let pos = pos?;
    if trace.stacks.event_stacks.is_empty() {
        return None;
    }
    let mut total = 0u64;
    let mut any = false;
    for b in c.blocks.iter().filter(|b| c.alive_at(b, pos)) {
        let Some(s) = trace.stacks.stack_of_event(c.event[b.alloc_pos]) else {
            continue;
        };
        let param = trace.stacks.stack(s).any(|f| {
            let file = trace.str(f.filename);
            let name = trace.str(f.name);
            file.contains("torch/nn/modules/") && matches!(name, "convert" | "_apply" | "__init__" | "reset_parameters")
        });
        if param {
            total += b.size_bytes;
            any = true;
        }
    }
    any.then_some(total)
}

/// Checkpointing: the candidates' table and the suggestions (the set meeting the budget, or
/// without one the lowest set, the set reaching 90 % of its saving, the best single module).
/// Returns the lowest set's candidates, for the AMP combination.
pub(super) fn checkpoint_advice(
    ctx: &Ctx,
    defs: &[CandidateDef],
    times: &[f64],
    out: &mut Vec<Proposal>,
    notes: &mut Vec<String>,
) -> Vec<CheckpointCandidate> {
    let c = &ctx.c;
    let measured: Vec<i64> = c.alloc.iter().map(|&a| a as i64).collect();
    let cands = scenario(c, defs, &measured, &|b: &Block| b.size_bytes, &[]);
    let peak_q = ctx.peak_pos.map(|p| 4 * p as u64);
    let rows: Vec<CheckpointCandidate> = defs
        .iter()
        .zip(&cands)
        .zip(times)
        .map(|((d, sc), &t)| {
            let mut per_iter: BTreeMap<Option<u32>, u64> = BTreeMap::new();
            for call in &d.calls {
                *per_iter.entry(call.iteration).or_default() += call.dropped.iter().map(|&b| c.blocks[b as usize].size_bytes).sum::<u64>();
            }
            let at_peak: i64 = peak_q.map_or(0, |q| sc.windows.iter().filter(|w| w.0 <= q && q < w.1).map(|w| w.2).sum());
            CheckpointCandidate {
                layer: d.path.clone(),
                calls: d.calls.len(),
                activation_bytes: per_iter.values().copied().max().unwrap_or(0),
                activation_bytes_at_peak: at_peak.max(0) as u64,
                forward_time_s: t,
                recompute_working_set_bytes: sc.working_set_max.max(0) as u64,
            }
        })
        .collect();
    let mut engine = Engine::new(c, &measured, cands);
    let steps = greedy(&mut engine, times, ctx.target, ctx.min_gain());
    let make = |step: &Step, label: &str| -> Proposal {
        let mut chosen = step.chosen.clone();
        chosen.sort_by_key(|&k| (defs[k].first_start_ns, k));
        let extra: f64 = chosen.iter().map(|&k| times[k]).sum();
        let dropped_at_peak: u64 = chosen.iter().map(|&k| rows[k].activation_bytes_at_peak).sum();
        let working_set = chosen.iter().map(|&k| rows[k].recompute_working_set_bytes).max().unwrap_or(0);
        let mut numbers = vec![
            ("activation_bytes_dropped_at_measured_peak", dropped_at_peak as f64),
            ("recompute_s", extra),
            ("largest_recompute_working_set_bytes", working_set as f64),
            ("layers", chosen.len() as f64),
        ];
        let mut share = String::new();
        if let Some(t) = ctx.iteration_time_s.filter(|&t| t > 0.0) {
            numbers.push(("iteration_time_s", t));
            numbers.push(("extra_time_fraction", extra / t));
            share = format!(" ({:.1} % of the {} iteration)", 100.0 * extra / t, format_seconds(t));
        }
        let layers: Vec<String> = chosen.iter().map(|&k| defs[k].path.clone()).collect();
        let mut s = ctx.suggestion(
            SuggestionKind::Checkpoint,
            format!("checkpoint {} (torch.utils.checkpoint.checkpoint around each of these modules, use_reentrant=False){label}", layers.join(", ")),
            step.peak,
            format!(
                "frees {} of activations alive at the measured peak; recomputing these forwards in the backward costs {} per iteration{share}; replayed, the peak is {} {}",
                format_bytes(dropped_at_peak),
                format_seconds(extra),
                format_bytes(step.peak),
                ctx.describe_at(defs, step.at),
            ),
            numbers,
        );
        s.layers = layers;
        s.extra_time_per_iteration_s = Some(extra);
        Proposal::new(s, ReservedBy::AllocatedSaving)
    };
    let Some(last) = steps.last() else {
        return rows;
    };
    if last.chosen.is_empty() {
        if ctx.target.is_some() || ctx.budget.is_none() {
            notes.push(format!(
                "checkpointing does not lower the peak: at the peak ({}) no candidate module's activations are alive, or recomputing them costs as much memory as they free",
                ctx.describe_at(defs, last.at)
            ));
        }
        return rows;
    }
    match ctx.target {
        Some(b) => {
            let met = last.peak <= b;
            out.push(make(last, if met { "" } else { " — the lowest peak checkpointing reaches, still above the budget" }));
            if !met {
                notes.push(budget_reason(b, last.peak, &ctx.describe_at(defs, last.at), &ctx.persistent));
            }
        }
        None => {
            out.push(make(last, " — the lowest peak checkpointing reaches"));
            let first_len = steps[1].chosen.len();
            let total = steps[0].peak.saturating_sub(last.peak);
            let knee = steps.iter().skip(1).find(|s| steps[0].peak.saturating_sub(s.peak) * 10 >= total * 9);
            if let Some(knee) = knee.filter(|k| k.chosen.len() != last.chosen.len() && k.chosen.len() != first_len) {
                out.push(make(knee, " — 90 % of the saving for fewer modules"));
            }
            // The best single module: each alone, replayed.
            for k in 0..defs.len() {
                engine.set(k, false);
            }
            let mut best: Option<Step> = None;
            for k in 0..defs.len() {
                engine.set(k, true);
                let (p, at) = engine.eval();
                engine.set(k, false);
                let p = p.max(0) as u64;
                if p.saturating_add(ctx.min_gain()) <= steps[0].peak
                    && best.as_ref().is_none_or(|b| (p, times[k]) < (b.peak, times[b.chosen[0]]))
                {
                    best = Some(Step { chosen: vec![k], peak: p, at });
                }
            }
            if let Some(single) = best.filter(|_| last.chosen.len() > 1) {
                out.push(make(&single, " — the best single module"));
            }
        }
    }
    rows
}
