//! Advice with predictions: what to change so that a training run needs less memory, each
//! change with the peak it is predicted to reach and the time it is predicted to cost.
//!
//! Every prediction is a replay of the trace's own allocated-memory curve on its peak device,
//! with the blocks a change affects resized or removed over the span the change affects them:
//!
//! - *activations* are blocks allocated in the forward and freed in the backward of the same
//!   iteration (what autograd keeps for the backward);
//! - **checkpoint** a module: the activations allocated during its forward are gone from the
//!   end of that forward until its backward begins, except its outputs (the blocks a later
//!   forward op of another module reads); at the start of its backward its forward runs again
//!   (the recomputation), a transient of its forward working set (the highest allocated memory
//!   during its forward above the level at its start) on top of the memory then;
//! - **amp**: activations halve (bf16/fp16); parameters, gradients and optimizer state stay
//!   fp32, and autocast keeps a half-precision copy of the weights from the forward to the end
//!   of the backward;
//! - **smaller batch**: the blocks allocated and freed within the forward and backward scale
//!   with the batch;
//! - **set_to_none**: gradients kept allocated across iterations are absent from the next
//!   forward until the backward writes them again;
//! - **optimizer**: optimizer state (allocated by the optimizer, alive across iterations)
//!   dropped or shrunk;
//! - **allocator settings** (`expandable_segments`, ...): the trace replayed through PyTorch's caching
//!   allocator under each (`crate::whatif`), the one that saves the most reserved memory.
//!
//! Candidate modules for checkpointing partition the model at its repeated blocks: module
//! paths ending in an index (`layer3.1`, `transformer.h.7`) and, elsewhere, the children of the
//! root (`conv1`, `fc`). A set is chosen greedily: at the predicted peak, the module whose
//! activations there save the most bytes per second of recomputation, as long as the replayed
//! peak goes down, until the budget is met.

mod autocast;

use crate::analysis::profile::{graph_profile, GraphProfile, IterationRole};
use crate::analysis::{median_f64, peak_device};
use crate::hash::FastMap;
use crate::model::{EventType, Phase, StrId, Trace, INPUT_LAYER};
use crate::units::{format_bytes, format_seconds};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// What to advise on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdviceOptions {
    /// The memory the run must fit in (allocated bytes at the peak). Default is `None`: the
    /// best few changes, without a target.
    pub budget_bytes: Option<u64>,
    /// How many suggestions and checkpoint candidates to list. Default is 10.
    pub top: usize,
    /// Fragmentation at the peak ((reserved − allocated) / reserved) above which
    /// `expandable_segments` is suggested. Default is 0.2.
    pub fragmentation_threshold: f64,
}

impl Default for AdviceOptions {
    fn default() -> Self {
        Self { budget_bytes: None, top: 10, fragmentation_threshold: 0.2 }
    }
}

/// What a suggestion changes. Stable names: other tools apply suggestions by kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SuggestionKind {
    /// Activation checkpointing of `layers` (`torch.utils.checkpoint`).
    Checkpoint,
    /// Mixed precision (autocast).
    Amp,
    /// Activation checkpointing of `layers` under autocast.
    CheckpointAmp,
    /// A smaller batch (with gradient accumulation to keep the effective batch).
    SmallerBatch,
    /// `optimizer.zero_grad(set_to_none=True)`.
    SetToNone,
    /// An optimizer with less state per parameter.
    Optimizer,
    /// `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`.
    ExpandableSegments,
    /// Another `PYTORCH_CUDA_ALLOC_CONF` setting (`change` names it).
    AllocatorSetting,
}

impl SuggestionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SuggestionKind::Checkpoint => "checkpoint",
            SuggestionKind::Amp => "amp",
            SuggestionKind::CheckpointAmp => "checkpoint_amp",
            SuggestionKind::SmallerBatch => "smaller_batch",
            SuggestionKind::SetToNone => "set_to_none",
            SuggestionKind::Optimizer => "optimizer",
            SuggestionKind::ExpandableSegments => "expandable_segments",
            SuggestionKind::AllocatorSetting => "allocator_setting",
        }
    }
}

/// One change and what it is predicted to do.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Suggestion {
    pub kind: SuggestionKind,
    /// What to change, in plain words.
    pub change: String,
    /// Module paths as the trace names them (`checkpoint`, `checkpoint_amp`), in forward order.
    pub layers: Vec<String>,
    /// Predicted allocated peak with the change.
    pub predicted_peak_bytes: u64,
    /// Predicted reserved peak, where the change is about reserved memory
    /// (`expandable_segments`).
    pub predicted_reserved_peak_bytes: Option<u64>,
    /// Measured peak minus predicted peak (the reserved ones for `expandable_segments`).
    pub saving_bytes: i64,
    /// Predicted extra time per iteration (recomputation); `None` where the change's time is
    /// not predicted (`reasoning` says why).
    pub extra_time_per_iteration_s: Option<f64>,
    /// Whether the predicted peak fits the budget (`None` without a budget).
    pub meets_budget: Option<bool>,
    /// Why, with the numbers.
    pub reasoning: String,
    /// The numbers behind the prediction, by name (unit in the name).
    pub numbers: BTreeMap<String, f64>,
}

/// A smaller batch's new size in [`Suggestion::numbers`], in samples (where the trace knew its
/// batch) or in percent of the traced one.
const NEW_BATCH: &str = "new_batch";
const NEW_PERCENT: &str = "new_percent";

/// The batch a [`SuggestionKind::SmallerBatch`] suggests.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BatchSize {
    Samples(f64),
    Percent(f64),
}

impl Suggestion {
    /// The batch a smaller-batch suggestion suggests (`None` for any other).
    pub fn smaller_batch(&self) -> Option<BatchSize> {
        if self.kind != SuggestionKind::SmallerBatch {
            return None;
        }
        let n = |k: &str| self.numbers.get(k).copied();
        n(NEW_BATCH).map(BatchSize::Samples).or_else(|| n(NEW_PERCENT).map(BatchSize::Percent))
    }
}

/// A module that checkpointing could wrap.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointCandidate {
    /// Module path as in the trace.
    pub layer: String,
    /// Forward calls of the module in the trace.
    pub calls: usize,
    /// Activations its checkpoint drops, per iteration (largest iteration).
    pub activation_bytes: u64,
    /// Of those, the bytes alive at the measured peak.
    pub activation_bytes_at_peak: u64,
    /// Its forward time per iteration (median over iterations after the first): the
    /// recomputation cost.
    pub forward_time_s: f64,
    /// The largest forward working set of one call: the recomputation's transient.
    pub recompute_working_set_bytes: u64,
}

/// The measured run the predictions start from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Baseline {
    /// The device analysed (the one with the highest allocated peak).
    pub device: String,
    pub source_format: String,
    pub peak_allocated_bytes: u64,
    /// Seconds since the trace's start.
    pub peak_time_s: f64,
    pub peak_phase: Phase,
    /// Layer of the allocation that reached the peak (empty when none).
    pub peak_layer: String,
    /// Highest reserved bytes on the device.
    pub peak_reserved_bytes: u64,
    /// Reserved bytes at the allocated peak.
    pub reserved_at_peak_bytes: u64,
    /// (reserved − allocated) / reserved at the allocated peak; 0 where nothing is reserved.
    pub fragmentation_at_peak: f64,
    /// Median iteration duration (iterations after the first); `None` without iterations.
    pub iteration_time_s: Option<f64>,
    pub iterations: usize,
    pub batch_size: Option<u64>,
    /// Parameters, where known (graph profile, or allocation stacks of snapshots).
    pub weights_bytes: Option<u64>,
    /// Gradients at their most.
    pub gradients_bytes: Option<u64>,
    pub optimizer_state_bytes: Option<u64>,
    /// Activations (allocated in a forward, freed in its backward) alive at the peak.
    pub activations_at_peak_bytes: u64,
    /// Whether the trace has operators (what checkpointing, AMP and batch advice need).
    pub operator_data: bool,
}

/// Everything `advise` found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdviceReport {
    pub baseline: Baseline,
    pub budget_bytes: Option<u64>,
    /// Whether some suggestion meets the budget (`None` without a budget).
    pub budget_met: Option<bool>,
    /// Ranked: with a budget, those meeting it first (least extra time first), then the others
    /// by predicted peak; without one, by saving.
    pub suggestions: Vec<Suggestion>,
    /// By activation bytes at the peak, largest first.
    pub checkpoint_candidates: Vec<CheckpointCandidate>,
    /// Advice not given, and what it would need.
    pub not_available: Vec<String>,
    pub notes: Vec<String>,
}

const NO_BLOCK: u32 = u32::MAX;
/// Bytes added over the positions `[from, to)` of a replay.
type Range = (usize, usize, i64);

/// One allocation on the analysed device, from its alloc event to its free event.
#[derive(Clone, Debug)]
struct Block {
    alloc_pos: usize,
    /// `None`: alive at the trace's end.
    free_pos: Option<usize>,
    size_bytes: u64,
    address: u64,
}

/// The analysed device's events as positions, with the totals after each and the blocks.
struct Curve<'a> {
    trace: &'a Trace,
    /// Global event index of each position.
    event: Vec<usize>,
    ts: Vec<u64>,
    alloc: Vec<u64>,
    reserved: Vec<u64>,
    phase: Vec<Phase>,
    /// Iteration of each position.
    iteration: Vec<Option<u32>>,
    base_alloc: u64,
    base_reserved: u64,
    blocks: Vec<Block>,
    /// Block allocated at each position (`NO_BLOCK` elsewhere).
    block_at: Vec<u32>,
    spans: Vec<(u64, u64)>,
    /// First and last position of each phase (indexed as `Phase as usize`) in each iteration.
    phase_bounds: Vec<[Option<(usize, usize)>; 4]>,
}

impl<'a> Curve<'a> {
    fn build(trace: &'a Trace, device: u8) -> Self {
        let ev = &trace.events;
        let spans = crate::analysis::iterations::spans(trace).bounds();
        let mut c = Curve {
            trace,
            event: Vec::new(),
            ts: Vec::new(),
            alloc: Vec::new(),
            reserved: Vec::new(),
            phase: Vec::new(),
            iteration: Vec::new(),
            base_alloc: ev.base_totals.get(device as usize).map_or(0, |t| t.allocated_bytes),
            base_reserved: ev.base_totals.get(device as usize).map_or(0, |t| t.reserved_bytes),
            blocks: Vec::new(),
            block_at: Vec::new(),
            phase_bounds: vec![[None; 4]; spans.len()],
            spans,
        };
        let mut open: FastMap<u64, u32> = FastMap::default();
        let mut cursor = ev.cursor();
        for i in 0..ev.len() {
            let t = cursor.advance();
            if ev.device[i] != device {
                continue;
            }
            let pos = c.event.len();
            let ts = ev.ts_ns[i];
            c.event.push(i);
            c.ts.push(ts);
            c.alloc.push(t.allocated_bytes);
            c.reserved.push(t.reserved_bytes);
            c.phase.push(ev.phase(i));
            let k = span_of(&c.spans, ts);
            c.iteration.push(k);
            if let Some(slot) = k.and_then(|k| c.phase_bounds.get_mut(k as usize)) {
                let b = &mut slot[ev.phase(i) as usize];
                *b = Some(b.map_or((pos, pos), |(f, _)| (f, pos)));
            }
            let mut at = NO_BLOCK;
            match ev.event_type(i) {
                EventType::Alloc => {
                    at = c.blocks.len() as u32;
                    c.blocks.push(Block { alloc_pos: pos, free_pos: None, size_bytes: ev.size_bytes[i], address: ev.address[i] });
                    // A second alloc at an open address means its free was lost: close it here.
                    if let Some(old) = open.insert(ev.address[i], at) {
                        c.blocks[old as usize].free_pos.get_or_insert(pos);
                    }
                }
                EventType::Free => {
                    if let Some(b) = open.remove(&ev.address[i]) {
                        c.blocks[b as usize].free_pos = Some(pos);
                    }
                }
                _ => {}
            }
            c.block_at.push(at);
        }
        c
    }

    fn len(&self) -> usize {
        self.ts.len()
    }

    fn alloc_phase(&self, b: &Block) -> Phase {
        self.phase[b.alloc_pos]
    }

    fn free_phase(&self, b: &Block) -> Option<Phase> {
        b.free_pos.map(|p| self.phase[p])
    }

    /// Allocated in a forward and freed in the backward of the same iteration.
    fn is_activation(&self, b: &Block) -> bool {
        self.alloc_phase(b) == Phase::Forward
            && self.free_phase(b) == Some(Phase::Backward)
            && b.free_pos.is_some_and(|f| self.iteration[f] == self.iteration[b.alloc_pos])
    }

    /// Allocated and freed within the forward and backward of one iteration: what scales with
    /// the batch.
    fn is_batch_dependent(&self, b: &Block) -> bool {
        let fb = |p: Phase| matches!(p, Phase::Forward | Phase::Backward);
        fb(self.alloc_phase(b))
            && self.free_phase(b).is_some_and(fb)
            && b.free_pos.is_some_and(|f| self.iteration[f] == self.iteration[b.alloc_pos])
    }

    /// Allocated by the optimizer and alive past its iteration (never freed, where the trace
    /// has no iterations).
    fn is_optimizer_state(&self, b: &Block) -> bool {
        if self.alloc_phase(b) != Phase::Optimizer {
            return false;
        }
        match (b.free_pos, self.iteration[b.alloc_pos]) {
            (None, _) => true,
            (Some(f), Some(k)) => self.iteration[f] != Some(k),
            (Some(_), None) => false,
        }
    }

    /// First and last position of `phase` in iteration `k`.
    fn bounds(&self, k: usize, phase: Phase) -> Option<(usize, usize)> {
        self.phase_bounds.get(k).and_then(|b| b[phase as usize])
    }

    /// Allocated in a backward and outliving it (parameter gradients).
    fn is_gradient(&self, b: &Block) -> bool {
        self.alloc_phase(b) == Phase::Backward && self.free_phase(b) != Some(Phase::Backward)
    }

    fn alive_at(&self, b: &Block, pos: usize) -> bool {
        b.alloc_pos <= pos && b.free_pos.is_none_or(|f| f > pos)
    }

    /// The measured allocated curve with blocks resized (`new_size`: `None` keeps a block) and
    /// `extra` bytes added over position ranges `[from, to)`.
    fn replay(&self, new_size: &dyn Fn(&Block) -> Option<u64>, extra: &[Range]) -> Vec<i64> {
        let n = self.len();
        let mut diff = vec![0i64; n + 1];
        for b in &self.blocks {
            if let Some(s) = new_size(b) {
                let d = clamp_i64(s as i128 - b.size_bytes as i128);
                diff[b.alloc_pos] = diff[b.alloc_pos].saturating_add(d);
                let end = b.free_pos.unwrap_or(n);
                diff[end] = diff[end].saturating_sub(d);
            }
        }
        for &(from, to, v) in extra {
            if from < to && to <= n {
                diff[from] = diff[from].saturating_add(v);
                diff[to] = diff[to].saturating_sub(v);
            }
        }
        let mut run = 0i64;
        (0..n)
            .map(|j| {
                run = run.saturating_add(diff[j]);
                clamp_i64(self.alloc[j] as i128 + run as i128)
            })
            .collect()
    }

    /// Highest value of a replayed curve (or the base) and its position.
    fn peak_of(&self, curve: &[i64]) -> (u64, Option<usize>) {
        let mut best = (self.base_alloc as i64, None);
        for (j, &v) in curve.iter().enumerate() {
            if v > best.0 {
                best = (v, Some(j));
            }
        }
        (best.0.max(0) as u64, best.1)
    }

    /// First position at or after `ts`.
    fn pos_at_or_after(&self, ts: u64) -> usize {
        self.ts.partition_point(|&t| t < ts)
    }

    /// First position after `ts`.
    fn pos_after(&self, ts: u64) -> usize {
        self.ts.partition_point(|&t| t <= ts)
    }

    fn describe(&self, pos: Option<usize>) -> String {
        match pos {
            None => "before the first event".to_owned(),
            Some(p) => {
                let layer = self.trace.str(self.trace.events.layer[self.event[p]]);
                let phase = self.phase[p].as_str();
                if layer.is_empty() {
                    format!("in the {phase} phase")
                } else {
                    format!("in {layer} ({phase})")
                }
            }
        }
    }
}

fn clamp_i64(v: i128) -> i64 {
    v.clamp(i64::MIN as i128 / 4, i64::MAX as i128 / 4) as i64
}

fn span_of(spans: &[(u64, u64)], ts: u64) -> Option<u32> {
    let k = spans.partition_point(|s| s.1 < ts);
    spans.get(k).filter(|s| s.0 <= ts).map(|_| k as u32)
}

fn under(layer: &str, path: &str) -> bool {
    layer.strip_prefix(path).is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

fn is_indexed(path: &str) -> bool {
    path.rsplit('.').next().is_some_and(|c| !c.is_empty() && c.bytes().all(|b| b.is_ascii_digit()))
}

/// The modules to consider for checkpointing: repeated blocks where the model has them, the
/// root's children elsewhere (see the module docs).
fn partition(paths: &BTreeSet<&str>) -> Vec<String> {
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

/// One forward call of a candidate module and what its checkpoint changes.
#[derive(Clone, Debug)]
struct Call {
    /// Positions of the forward: `[first, end)`.
    first: usize,
    end: usize,
    /// Position of the first event of the module's backward.
    backward_pos: usize,
    /// Blocks dropped from the forward's end to the backward's start.
    dropped: Vec<u32>,
    iteration: Option<u32>,
    forward_ns: u64,
}

#[derive(Clone, Debug)]
struct CandidateDef {
    path: String,
    calls: Vec<Call>,
    first_start_ns: u64,
}

/// Forward calls of each candidate module, with the activations a checkpoint drops.
fn checkpoint_candidates(c: &Curve, notes: &mut Vec<String>) -> Vec<CandidateDef> {
    let by_path = forward_scopes(c.trace);
    let paths: BTreeSet<&str> = by_path.keys().copied().collect();
    let chosen = partition(&paths);
    let mut out = module_calls(c, &by_path, &chosen, notes);
    out.retain(|d| d.calls.iter().any(|call| !call.dropped.is_empty()));
    out.sort_by(|a, b| a.first_start_ns.cmp(&b.first_start_ns).then_with(|| a.path.cmp(&b.path)));
    out
}

/// Forward scopes by module path.
fn forward_scopes(trace: &Trace) -> BTreeMap<&str, Vec<(u64, u64)>> {
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
fn module_calls(c: &Curve, by_path: &BTreeMap<&str, Vec<(u64, u64)>>, chosen: &[String], notes: &mut Vec<String>) -> Vec<CandidateDef> {
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
fn forward_time_s(def: &CandidateDef) -> f64 {
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

/// A range-add, max tree over leaves (recursive, lazy: a node's max includes its own pending
/// add; a leaf's value is its max plus its ancestors' pending adds).
struct MaxTree {
    size: usize,
    mx: Vec<i64>,
    lz: Vec<i64>,
}

impl MaxTree {
    fn new(leaves: &[i64]) -> Self {
        let size = leaves.len().max(1).next_power_of_two();
        let mut mx = vec![NEG; 2 * size];
        mx[size..size + leaves.len()].copy_from_slice(leaves);
        for i in (1..size).rev() {
            mx[i] = mx[2 * i].max(mx[2 * i + 1]);
        }
        Self { size, mx, lz: vec![0; 2 * size] }
    }

    fn add(&mut self, l: usize, r: usize, v: i64) {
        if l < r {
            self.add_at(1, 0, self.size, l, r, v);
        }
    }

    fn add_at(&mut self, node: usize, nl: usize, nr: usize, l: usize, r: usize, v: i64) {
        if r <= nl || nr <= l {
            return;
        }
        if l <= nl && nr <= r {
            self.mx[node] += v;
            self.lz[node] += v;
            return;
        }
        let mid = (nl + nr) / 2;
        self.add_at(2 * node, nl, mid, l, r, v);
        self.add_at(2 * node + 1, mid, nr, l, r, v);
        self.mx[node] = self.mx[2 * node].max(self.mx[2 * node + 1]) + self.lz[node];
    }

    /// The highest leaf value and its (leftmost) leaf.
    fn top(&self) -> (i64, usize) {
        let mut node = 1;
        while node < self.size {
            let target = self.mx[node] - self.lz[node];
            node = if self.mx[2 * node] == target { 2 * node } else { 2 * node + 1 };
        }
        (self.mx[1], node - self.size)
    }

    /// Adds pending on the path to a leaf, excluding the leaf's own value.
    fn pending(&self, leaf: usize) -> i64 {
        let mut node = leaf + self.size;
        let mut acc = 0;
        while node > 1 {
            node /= 2;
            acc += self.lz[node];
        }
        acc
    }
}

const NEG: i64 = i64::MIN / 4;

/// A candidate in one scenario: its removal windows and recomputation transients on the
/// quarter-position axis (event `j` at `4j`, the moment before event `j` at `4j − 2`).
struct ScenarioCandidate {
    /// `[lo, hi)` in quarter positions, bytes removed.
    windows: Vec<(u64, u64, i64)>,
    /// (quarter position, value before the windows: the level before the backward plus the
    /// forward working set).
    spikes: Vec<(u64, i64)>,
    working_set_max: i64,
}

/// The greedy search's state: the replayed curve as a max tree over segments between window
/// boundaries.
struct Engine {
    cuts: Vec<u64>,
    tree: MaxTree,
    /// Position of the highest event of each leaf.
    leaf_event: Vec<Option<usize>>,
    base: i64,
    cands: Vec<ScenarioCandidate>,
    active: Vec<bool>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum PeakAt {
    Base,
    Event(usize),
    /// The recomputation of candidate `c`.
    Recompute(usize, u64),
}

impl PeakAt {
    fn quarter(self) -> Option<u64> {
        match self {
            PeakAt::Base => None,
            PeakAt::Event(p) => Some(4 * p as u64),
            PeakAt::Recompute(_, q) => Some(q),
        }
    }
}

impl Engine {
    fn new(c: &Curve, curve: &[i64], cands: Vec<ScenarioCandidate>) -> Self {
        let mut cuts: Vec<u64> = Vec::new();
        for sc in &cands {
            for &(lo, hi, _) in &sc.windows {
                cuts.push(lo);
                cuts.push(hi);
            }
            for &(q, _) in &sc.spikes {
                cuts.push(q);
                cuts.push(q + 1);
            }
        }
        cuts.sort_unstable();
        cuts.dedup();
        let n = cuts.len() + 1;
        let mut leaves = vec![NEG; n];
        let mut leaf_event = vec![None; n];
        let mut leaf = 0;
        for (j, &v) in curve.iter().enumerate() {
            let q = 4 * j as u64;
            while leaf < cuts.len() && cuts[leaf] <= q {
                leaf += 1;
            }
            if v > leaves[leaf] {
                leaves[leaf] = v;
                leaf_event[leaf] = Some(j);
            }
        }
        Self { tree: MaxTree::new(&leaves), cuts, leaf_event, base: c.base_alloc as i64, active: vec![false; cands.len()], cands }
    }

    fn leaf_of(&self, q: u64) -> usize {
        self.cuts.partition_point(|&c| c <= q)
    }

    fn set(&mut self, k: usize, on: bool) {
        if self.active[k] == on {
            return;
        }
        self.active[k] = on;
        let sign = if on { -1 } else { 1 };
        for w in 0..self.cands[k].windows.len() {
            let (lo, hi, bytes) = self.cands[k].windows[w];
            let (l, r) = (self.leaf_of(lo), self.leaf_of(hi));
            self.tree.add(l, r, sign * bytes);
        }
    }

    fn eval(&self) -> (i64, PeakAt) {
        let (mut best, leaf) = self.tree.top();
        let mut at = match self.leaf_event.get(leaf).copied().flatten() {
            Some(p) if best > NEG / 2 => PeakAt::Event(p),
            _ => {
                best = NEG;
                PeakAt::Base
            }
        };
        for (k, sc) in self.cands.iter().enumerate() {
            if !self.active[k] {
                continue;
            }
            for &(q, v) in &sc.spikes {
                let leaf = self.leaf_of(q);
                // The spike's leaf holds no event, so its value is NEG plus the windows over it.
                let windows = self.tree.mx[leaf + self.tree.size] - NEG + self.tree.pending(leaf);
                let value = v + windows;
                if value > best {
                    best = value;
                    at = PeakAt::Recompute(k, q);
                }
            }
        }
        if self.base >= best {
            (self.base, PeakAt::Base)
        } else {
            (best, at)
        }
    }

    fn bytes_at(&self, k: usize, q: u64) -> i64 {
        self.cands[k].windows.iter().filter(|w| w.0 <= q && q < w.1).map(|w| w.2).sum()
    }
}

/// The candidates of a scenario: `curve` is the replayed curve without checkpoints, `size`
/// each block's size in it.
/// `copies` are allocations the replay adds (autocast's saved casts): those a module's forward
/// makes and keeps past it are dropped with its activations.
fn scenario(c: &Curve, defs: &[CandidateDef], curve: &[i64], size: &dyn Fn(&Block) -> u64, copies: &[Range]) -> Vec<ScenarioCandidate> {
    defs.iter()
        .map(|d| {
            let mut windows = Vec::new();
            let mut spikes = Vec::new();
            let mut working_set_max = 0;
            for call in &d.calls {
                let before = if call.first == 0 { c.base_alloc as i64 } else { curve[call.first - 1] };
                let top = curve[call.first..call.end.max(call.first)].iter().copied().max().unwrap_or(before);
                let working_set = (top - before).max(0);
                working_set_max = working_set_max.max(working_set);
                if call.dropped.is_empty() || call.end == 0 {
                    continue;
                }
                let last_fwd = (call.end - 1) as u64;
                for &b in &call.dropped {
                    let bl = &c.blocks[b as usize];
                    let stop = bl.free_pos.map_or(call.backward_pos, |f| f.min(call.backward_pos)) as u64;
                    let (lo, hi) = (4 * last_fwd + 1, (4 * stop).saturating_sub(1));
                    if lo < hi {
                        windows.push((lo, hi, size(bl) as i64));
                    }
                }
                for &(_, to, bytes) in copies.iter().filter(|r| r.0 >= call.first && r.0 < call.end && r.1 > call.end) {
                    let (lo, hi) = (4 * last_fwd + 1, (4 * to.min(call.backward_pos) as u64).saturating_sub(1));
                    if lo < hi {
                        windows.push((lo, hi, bytes));
                    }
                }
                let level = if call.backward_pos == 0 { c.base_alloc as i64 } else { curve[call.backward_pos - 1] };
                spikes.push(((4 * call.backward_pos as u64).saturating_sub(2), level + working_set));
            }
            ScenarioCandidate { windows, spikes, working_set_max }
        })
        .collect()
}

/// One step of the greedy search.
#[derive(Clone, Debug)]
struct Step {
    chosen: Vec<usize>,
    peak: u64,
    at: PeakAt,
}

/// Greedy: at the current peak, the candidate saving the most bytes there per second of
/// recomputation, if the replayed peak goes down by at least `min_gain` bytes; until `budget`
/// is met or nothing helps.
fn greedy(engine: &mut Engine, times: &[f64], budget: Option<u64>, min_gain: u64) -> Vec<Step> {
    let (p0, at0) = engine.eval();
    let mut steps = vec![Step { chosen: Vec::new(), peak: p0.max(0) as u64, at: at0 }];
    while let Some(cur) = steps.last().cloned() {
        if budget.is_some_and(|b| cur.peak <= b) {
            break;
        }
        let Some(q) = cur.at.quarter() else { break };
        let mut ranked: Vec<(f64, usize)> = (0..engine.cands.len())
            .filter(|&k| !engine.active[k])
            .filter_map(|k| {
                let bytes = engine.bytes_at(k, q);
                (bytes > 0).then(|| (bytes as f64 / times[k].max(1e-9), k))
            })
            .collect();
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut accepted = None;
        for &(_, k) in &ranked {
            engine.set(k, true);
            let (p, at) = engine.eval();
            let p = p.max(0) as u64;
            if p.saturating_add(min_gain) <= cur.peak {
                accepted = Some((k, p, at));
                break;
            }
            engine.set(k, false);
        }
        let Some((k, peak, at)) = accepted else { break };
        let mut chosen = cur.chosen.clone();
        chosen.push(k);
        steps.push(Step { chosen, peak, at });
    }
    steps
}

/// The parts of memory checkpointing cannot reduce, where known.
#[derive(Clone, Copy, Debug, Default)]
struct Persistent {
    weights: Option<u64>,
    gradients: Option<u64>,
    optimizer_state: Option<u64>,
    /// The most weights + gradients + optimizer state together.
    floor: Option<u64>,
}

fn persistent_from_profile(p: &GraphProfile) -> Option<Persistent> {
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
fn weights_from_stacks(c: &Curve, pos: Option<usize>) -> Option<u64> {
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

/// Autocast's half-precision weight copies: each weight a half-precision op reads in a forward
/// is cast once and kept (saved for the backward) until the last backward op that reads it, or
/// the forward's end when none does. Ranges of positions with their bytes, and the bytes of
/// all copies. `None` without tensor ids.
fn weight_copies(c: &Curve) -> Option<(Vec<Range>, u64, crate::hash::FastSet<u64>)> {
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

/// What every part of the advice reads.
struct Ctx<'a> {
    c: Curve<'a>,
    peak: u64,
    peak_pos: Option<usize>,
    budget: Option<u64>,
    /// The budget when the measured peak is above it: what choices aim at.
    target: Option<u64>,
    persistent: Persistent,
    iteration_time_s: Option<f64>,
    activations_at_peak: u64,
    has_tensor_ids: bool,
}

impl Ctx<'_> {
    fn meets(&self, p: u64) -> Option<bool> {
        self.budget.map(|b| p <= b)
    }

    fn saving(&self, p: u64) -> i64 {
        self.peak as i64 - p as i64
    }

    /// A suggestion about allocated memory, with the measured peak among its numbers.
    fn suggestion(&self, kind: SuggestionKind, change: String, predicted: u64, reasoning: String, numbers: Vec<(&str, f64)>) -> Suggestion {
        let mut map: BTreeMap<String, f64> = numbers.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        map.insert("measured_peak_bytes".to_owned(), self.peak as f64);
        Suggestion {
            kind,
            change,
            layers: Vec::new(),
            predicted_peak_bytes: predicted,
            predicted_reserved_peak_bytes: None,
            saving_bytes: self.saving(predicted),
            extra_time_per_iteration_s: None,
            meets_budget: self.meets(predicted),
            reasoning,
            numbers: map,
        }
    }

    fn describe_at(&self, defs: &[CandidateDef], at: PeakAt) -> String {
        match at {
            PeakAt::Base => self.c.describe(None),
            PeakAt::Event(p) => self.c.describe(Some(p)),
            PeakAt::Recompute(k, _) => format!("while recomputing {} at the start of its backward", defs[k].path),
        }
    }

    /// Smallest drop of the peak a checkpoint must bring to be worth its recomputation.
    fn min_gain(&self) -> u64 {
        (self.peak / 1000).max(1)
    }
}

/// Checkpointing: the candidates' table and the suggestions (the set meeting the budget, or
/// without one the lowest set, the set reaching 90 % of its saving, the best single module).
/// Returns the lowest set's candidates, for the AMP combination.
fn checkpoint_advice(
    ctx: &Ctx,
    defs: &[CandidateDef],
    times: &[f64],
    out: &mut Vec<Suggestion>,
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
    let make = |step: &Step, label: &str| -> Suggestion {
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
        s
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

/// The replay under autocast.
struct Amp {
    curve: Vec<i64>,
    /// Bytes of the weights' half-precision copies.
    weight_copies: u64,
    /// What the replay changed, in words.
    text: String,
    /// The operator-level model, where the trace has tensor ids.
    plan: Option<autocast::Plan>,
}

impl Amp {
    /// The size of a block under autocast.
    fn size(&self, c: &Curve, b: &Block) -> u64 {
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
fn amp_curve(c: &Curve, weights: Option<u64>) -> Amp {
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
fn amp_advice(ctx: &Ctx, defs: &[CandidateDef], times: &[f64], out: &mut Vec<Suggestion>, notes: &mut Vec<String>) {
    let c = &ctx.c;
    let amp = amp_curve(c, ctx.persistent.weights);
    if amp.plan.as_ref().is_some_and(|p| p.lower_ops == 0) {
        notes.push("mixed precision would not change this run's memory: the trace records no operator autocast runs in bf16 (matmul, linear, convolution, attention)".to_owned());
        return;
    }
    let (amp_peak, amp_pos) = c.peak_of(&amp.curve);
    out.push(ctx.suggestion(
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
    ));
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
    out.push(s);
}

/// A smaller batch: the largest that meets the budget, or half the batch without one.
fn batch_advice(ctx: &Ctx, batch: Option<u64>, out: &mut Vec<Suggestion>, notes: &mut Vec<String>) {
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
    let change = if unit == "batch" {
        format!("batch {num} instead of {den} (gradient accumulation over {steps} steps keeps an effective batch of {})", num * steps)
    } else {
        format!(
            "a batch {num} % of the traced one (the trace does not record its batch size), with gradient accumulation over {steps} steps"
        )
    };
    out.push(ctx.suggestion(
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
    ));
}

/// Gradients zeroed in place rather than freed: absent from each later forward until the
/// backward first touches them (or, without tensor ids, until the backward starts).
fn set_to_none_advice(ctx: &Ctx, out: &mut Vec<Suggestion>) {
    let c = &ctx.c;
    let trace = c.trace;
    let kept: Vec<&Block> = c
        .blocks
        .iter()
        .filter(|b| c.is_gradient(b))
        .filter(|b| {
            c.iteration[b.alloc_pos]
                .is_some_and(|k| (k as usize + 1) < c.spans.len() && b.free_pos.is_none_or(|f| c.iteration[f].is_none_or(|fk| fk > k)))
        })
        .collect();
    if kept.is_empty() {
        return;
    }
    let addresses: BTreeSet<u64> = kept.iter().map(|b| b.address).collect();
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
    let mut kept_bytes = 0u64;
    for b in &kept {
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
    out.push(ctx.suggestion(
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
    ));
}

/// Optimizer state: bytes per parameter, and the peak with less of it.
fn optimizer_advice(ctx: &Ctx, out: &mut Vec<Suggestion>) {
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
    out.push(ctx.suggestion(
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
    ));
}

/// The allocator settings advice tries (`shared::whatif`), each over the run's own: the one
/// PyTorch's out-of-memory message names, the one its docs give for fragmentation, and the
/// power-of-two rounding that keeps block sizes reusable.
pub const ALLOCATOR_CANDIDATES: [&str; 3] =
    ["expandable_segments:True", "max_split_size_mb:512", "roundup_power2_divisions:[256:1,512:2,>:4]"];
/// The reserved peak a setting must save, in percent of the run's own, to be suggested
/// (unless it avoids an out-of-memory the run's own settings meet).
pub const ALLOCATOR_MIN_SAVING_PCT: f64 = 5.0;

/// Fragmentation at the peak, and the allocator setting that saves most of the reserved peak
/// in a replay of the trace through PyTorch's caching allocator (`shared::whatif`), where one
/// saves at least [`ALLOCATOR_MIN_SAVING_PCT`] or avoids the out-of-memory.
fn fragmentation_advice(
    ctx: &Ctx,
    baseline: &Baseline,
    threshold: f64,
    out: &mut Vec<Suggestion>,
    notes: &mut Vec<String>,
    not_available: &mut Vec<String>,
) {
    let trace = ctx.c.trace;
    let (peak, reserved) = (ctx.peak, baseline.reserved_at_peak_bytes);
    if !trace.meta.fragmentation_tracked {
        not_available.push("expandable_segments: the trace was recorded without fragmentation tracking".to_owned());
        return;
    }
    if reserved == 0 {
        not_available.push(format!(
            "expandable_segments: nothing is reserved on {} (the CPU allocator caches nothing); fragmentation and expandable_segments are about CUDA's caching allocator",
            baseline.device
        ));
        return;
    }
    let text = format!(
        "at the allocated peak {} is reserved and {} allocated: {} ({:.1} % of reserved) is held by the allocator but unused",
        format_bytes(reserved),
        format_bytes(peak),
        format_bytes(reserved.saturating_sub(peak)),
        100.0 * baseline.fragmentation_at_peak
    );
    if !baseline.device.starts_with("cuda") {
        notes.push(format!("{text}; allocator settings are CUDA's caching allocator's, and this device is {}", baseline.device));
        return;
    }
    let opts = crate::whatif::WhatIfOptions {
        settings: ALLOCATOR_CANDIDATES.iter().map(|s| (*s).to_owned()).collect(),
        device: Some(baseline.device.clone()),
        ..Default::default()
    };
    let report = match crate::whatif::what_if(trace, &opts) {
        Ok(r) => r,
        Err(e) => {
            not_available.push(format!("allocator settings: the trace cannot be replayed through the caching allocator ({e})"));
            return;
        }
    };
    let own = &report.settings[0];
    let better = |s: &&crate::whatif::SettingOutcome| {
        let avoids_oom = own.oom.is_some() && s.oom.is_none();
        s.oom.is_none() && (avoids_oom || -s.reserved_change_pct >= ALLOCATOR_MIN_SAVING_PCT)
    };
    let best = report.settings.iter().skip(1).filter(better).min_by_key(|s| (s.reserved_peak_bytes, s.allocated_peak_bytes));
    let tried = report
        .settings
        .iter()
        .skip(1)
        .map(|s| format!("{} {} ({:+.1} %)", s.alloc_conf, format_bytes(s.reserved_peak_bytes), s.reserved_change_pct))
        .collect::<Vec<_>>()
        .join(", ");
    let Some(best) = best else {
        let under = if baseline.fragmentation_at_peak > threshold {
            String::new()
        } else {
            format!(". That is under the {:.0} % from which it is worth a change", 100.0 * threshold)
        };
        notes.push(format!(
            "{text}{under}; no allocator setting saves {ALLOCATOR_MIN_SAVING_PCT:.0} % of the reserved peak ({}) in a replay: {tried}",
            format_bytes(own.reserved_peak_bytes)
        ));
        return;
    };
    let kind =
        if best.alloc_conf == "expandable_segments:True" { SuggestionKind::ExpandableSegments } else { SuggestionKind::AllocatorSetting };
    let why = match (&own.oom, &best.oom) {
        (Some(o), None) => format!(
            "; under the run's own settings a {} request runs out of the device's {} at {:.3} s, and with it every request fits",
            format_bytes(o.request_bytes),
            report.device_memory_bytes.map_or_else(|| "memory".to_owned(), format_bytes),
            o.at_s
        ),
        _ => String::new(),
    };
    let mut s = ctx.suggestion(
        kind,
        format!("PYTORCH_CUDA_ALLOC_CONF={}", best.alloc_conf),
        best.allocated_peak_bytes,
        format!(
            "{text}; replayed through PyTorch's caching allocator (`collector whatif`), {} gives a reserved peak of {} against {} ({:+.1} %), {} of it unused at the peak{why}. Tried: {tried}. Time is not predicted",
            best.alloc_conf,
            format_bytes(best.reserved_peak_bytes),
            format_bytes(own.reserved_peak_bytes),
            best.reserved_change_pct,
            format_bytes(best.reserved_unallocated_at_peak_bytes)
        ),
        vec![
            ("reserved_at_peak_bytes", reserved as f64),
            ("peak_reserved_bytes", baseline.peak_reserved_bytes as f64),
            ("replayed_reserved_peak_bytes", own.reserved_peak_bytes as f64),
            ("fragmentation_at_peak", baseline.fragmentation_at_peak),
        ],
    );
    s.predicted_reserved_peak_bytes = Some(best.reserved_peak_bytes);
    s.saving_bytes = own.reserved_peak_bytes as i64 - best.reserved_peak_bytes as i64;
    s.meets_budget = ctx.budget.map(|b| best.reserved_peak_bytes <= b);
    out.push(s);
}

/// The peak device's rank of a trace of several ranks, as a trace of its own: its modules'
/// scopes and operators must not be mixed with the other ranks'.
fn peak_rank_trace(trace: &Trace) -> Option<(u32, Trace)> {
    let rank = trace.devices.get(peak_device(trace) as usize)?.rank?;
    if trace.devices.iter().all(|d| d.rank == Some(rank)) {
        return None;
    }
    Some((rank, crate::ranks::rank_trace(trace, rank)?))
}

/// The peak predicted with `layers` (module paths as the trace names them) checkpointed, under
/// autocast when `amp`: the replay the suggestions come from, for any set of modules (a layer
/// nested in another one of the set is covered by it). `None` when the trace has no operators
/// or one of `layers` ran no forward in it.
pub fn predict_peak(trace: &Trace, layers: &[String], amp: bool) -> Option<u64> {
    if let Some((_, t)) = peak_rank_trace(trace) {
        return predict_peak(&t, layers, amp);
    }
    if trace.ops.is_empty() {
        return None;
    }
    let c = Curve::build(trace, peak_device(trace));
    let by_path = forward_scopes(trace);
    if layers.iter().any(|l| !by_path.contains_key(l.as_str())) {
        return None;
    }
    let outer: BTreeSet<String> = layers.iter().filter(|l| !layers.iter().any(|o| o != *l && under(l, o))).cloned().collect();
    let outer: Vec<String> = outer.into_iter().collect();
    let defs = module_calls(&c, &by_path, &outer, &mut Vec::new());
    let amp = amp.then(|| {
        let has_tensor_ids = trace.tensors.iter().any(|t| t.storage_id != 0);
        let weights = if has_tensor_ids {
            None
        } else {
            graph_profile(trace).ok().as_ref().and_then(persistent_from_profile).and_then(|p| p.weights)
        };
        amp_curve(&c, weights)
    });
    let curve: Vec<i64> = match &amp {
        Some(a) => a.curve.clone(),
        None => c.alloc.iter().map(|&a| a as i64).collect(),
    };
    let size = |b: &Block| amp.as_ref().map_or(b.size_bytes, |a| a.size(&c, b));
    let copies = amp.as_ref().and_then(|a| a.plan.as_ref()).map_or(&[][..], |p| &p.copies[..]);
    let mut engine = Engine::new(&c, &curve, scenario(&c, &defs, &curve, &size, copies));
    for k in 0..defs.len() {
        engine.set(k, true);
    }
    Some(engine.eval().0.max(0) as u64)
}

/// Computes the advice for a trace: the baseline, ranked suggestions with their predicted
/// peaks and extra time, the checkpoint candidates, and what cannot be advised and why.
pub fn advise(trace: &Trace, opts: &AdviceOptions) -> AdviceReport {
    if let Some((rank, t)) = peak_rank_trace(trace) {
        let mut r = advise(&t, opts);
        r.notes.push(format!(
            "a trace of several ranks: advice for rank {rank}, the one with the highest peak (its own operators and scopes)"
        ));
        return r;
    }
    let device = peak_device(trace);
    let c = Curve::build(trace, device);
    let Measured { baseline, peak_pos, persistent } = measure_baseline(trace, device, &c);
    let has_tensor_ids = trace.tensors.iter().any(|t| t.storage_id != 0);
    let peak = baseline.peak_allocated_bytes;
    let ctx = Ctx {
        c,
        peak,
        peak_pos,
        budget: opts.budget_bytes,
        target: opts.budget_bytes.filter(|&b| peak > b),
        persistent,
        iteration_time_s: baseline.iteration_time_s,
        activations_at_peak: baseline.activations_at_peak_bytes,
        has_tensor_ids,
    };
    let Advice { mut suggestions, mut candidates, mut notes, not_available } = suggest(trace, &ctx, &baseline, opts);
    let budget_met = budget_notes(&ctx, opts.budget_bytes, &suggestions, &mut notes);
    rank(&mut suggestions, opts.budget_bytes);
    suggestions.truncate(opts.top);
    candidates.sort_by(|a, b| {
        b.activation_bytes_at_peak
            .cmp(&a.activation_bytes_at_peak)
            .then(b.activation_bytes.cmp(&a.activation_bytes))
            .then(a.layer.cmp(&b.layer))
    });
    candidates.truncate(opts.top);
    AdviceReport {
        baseline,
        budget_bytes: opts.budget_bytes,
        budget_met,
        suggestions,
        checkpoint_candidates: candidates,
        not_available,
        notes,
    }
}

/// What the trace measured, before any replay.
struct Measured {
    baseline: Baseline,
    /// Position of the peak in the curve; `None`: the peak is the base.
    peak_pos: Option<usize>,
    persistent: Persistent,
}

/// Takes the trace and its main device's curve; gives the baseline: the peak and where it
/// is, iteration time, and what is persistent (from the graph profile where there are
/// operators, else from the blocks' stacks).
fn measure_baseline(trace: &Trace, device: u8, c: &Curve) -> Measured {
    let (peak, peak_pos) = {
        let measured: Vec<i64> = c.alloc.iter().map(|&a| a as i64).collect();
        c.peak_of(&measured)
    };
    let reserved_at_peak = peak_pos.map_or(c.base_reserved, |p| c.reserved[p]);
    let operator_data = !trace.ops.is_empty();
    let profile = if operator_data { graph_profile(trace).ok() } else { None };
    let mut durations: Vec<f64> = match &profile {
        Some(p) => p.iterations.iter().filter(|i| i.role == IterationRole::Steady).map(|i| i.duration_s).collect(),
        None => c.spans.iter().skip(usize::from(c.spans.len() >= 2)).map(|s| s.1.saturating_sub(s.0) as f64 * 1e-9).collect(),
    };
    let iteration_time_s = median_f64(&mut durations);
    let persistent = profile.as_ref().and_then(persistent_from_profile).unwrap_or_else(|| {
        let state: u64 =
            c.blocks.iter().filter(|b| c.is_optimizer_state(b) && peak_pos.is_some_and(|p| c.alive_at(b, p))).map(|b| b.size_bytes).sum();
        let weights = weights_from_stacks(c, peak_pos);
        Persistent { weights, gradients: None, optimizer_state: (state > 0).then_some(state), floor: weights.map(|w| w + state) }
    });
    let activations_at_peak: u64 =
        peak_pos.map_or(0, |p| c.blocks.iter().filter(|b| c.is_activation(b) && c.alive_at(b, p)).map(|b| b.size_bytes).sum());
    let baseline = Baseline {
        device: trace.devices.get(device as usize).map_or_else(|| "unknown".to_owned(), |d| d.to_string()),
        source_format: trace.meta.source_format.as_str().to_owned(),
        peak_allocated_bytes: peak,
        peak_time_s: peak_pos.map_or(0.0, |p| c.ts[p].saturating_sub(trace.start_ns()) as f64 * 1e-9),
        peak_phase: peak_pos.map_or(Phase::Other, |p| c.phase[p]),
        peak_layer: peak_pos.map(|p| trace.str(trace.events.layer[c.event[p]]).to_owned()).unwrap_or_default(),
        peak_reserved_bytes: c.reserved.iter().copied().max().unwrap_or(0).max(c.base_reserved),
        reserved_at_peak_bytes: reserved_at_peak,
        fragmentation_at_peak: if reserved_at_peak == 0 || !trace.meta.fragmentation_tracked {
            0.0
        } else {
            reserved_at_peak.saturating_sub(peak) as f64 / reserved_at_peak as f64
        },
        iteration_time_s,
        iterations: c.spans.len(),
        batch_size: trace.meta.batch_size,
        weights_bytes: persistent.weights,
        gradients_bytes: persistent.gradients,
        optimizer_state_bytes: persistent.optimizer_state,
        activations_at_peak_bytes: activations_at_peak,
        operator_data,
    };
    Measured { baseline, peak_pos, persistent }
}

/// The advice before ranking.
struct Advice {
    suggestions: Vec<Suggestion>,
    candidates: Vec<CheckpointCandidate>,
    notes: Vec<String>,
    not_available: Vec<String>,
}

/// Takes the measured context; gives every suggestion that applies (checkpointing, AMP and a
/// smaller batch where there are operators and activations; set-to-none, optimizer and
/// fragmentation advice always), with notes and what cannot be advised.
fn suggest(trace: &Trace, ctx: &Ctx, baseline: &Baseline, opts: &AdviceOptions) -> Advice {
    let mut notes = Vec::new();
    let mut not_available = Vec::new();
    let mut suggestions = Vec::new();
    let mut candidates = Vec::new();
    if ctx.c.len() == 0 {
        notes.push("the trace has no memory events: there is nothing to replay".to_owned());
    }
    let has_activations = ctx.c.blocks.iter().any(|b| ctx.c.is_activation(b));
    if !baseline.operator_data {
        let format = trace.meta.source_format.as_str();
        for (kind, needs) in [
            ("checkpoint", "which allocations each module's forward makes and when its backward starts (module scopes and operators)"),
            ("amp", "which memory is activations kept for the backward (operators with their phases and tensors)"),
            ("smaller_batch", "which memory scales with the batch (operators with their phases)"),
        ] {
            not_available.push(format!(
                "{kind}: needs operator data — {needs}; this trace ({format}) has none. Trace the run with `collector trace` (a built-in model, or `-- python train.py`) to get it"
            ));
        }
    } else if !has_activations {
        notes.push(
            "no memory is allocated in a forward and freed in its backward (an inference run, or a trace without phases): checkpointing, AMP and batch advice have no activations to work on"
                .to_owned(),
        );
    } else {
        let defs = checkpoint_candidates(&ctx.c, &mut notes);
        let times: Vec<f64> = defs.iter().map(forward_time_s).collect();
        if defs.is_empty() {
            not_available.push(
                "checkpoint: no module's forward keeps activations for its backward in this trace (no forward module scopes, or every activation is a module's output)"
                    .to_owned(),
            );
        } else {
            candidates = checkpoint_advice(ctx, &defs, &times, &mut suggestions, &mut notes);
        }
        amp_advice(ctx, &defs, &times, &mut suggestions, &mut notes);
        batch_advice(ctx, trace.meta.batch_size, &mut suggestions, &mut notes);
    }
    set_to_none_advice(ctx, &mut suggestions);
    optimizer_advice(ctx, &mut suggestions);
    fragmentation_advice(ctx, baseline, opts.fragmentation_threshold, &mut suggestions, &mut notes, &mut not_available);
    Advice { suggestions, candidates, notes, not_available }
}

/// Takes the suggestions and the budget; gives whether any suggestion meets the budget, and
/// puts first in `notes` that the peak already fits it or why nothing can meet it.
fn budget_notes(ctx: &Ctx, budget_bytes: Option<u64>, suggestions: &[Suggestion], notes: &mut Vec<String>) -> Option<bool> {
    let budget_met = budget_bytes.map(|_| suggestions.iter().any(|s| s.meets_budget == Some(true)));
    if let Some(b) = budget_bytes {
        if ctx.peak <= b {
            notes.insert(0, format!("the measured peak {} already fits the budget {}", format_bytes(ctx.peak), format_bytes(b)));
        } else if budget_met == Some(false) {
            let mut why = format!("no suggestion meets the budget {}", format_bytes(b));
            if let Some(f) = ctx.persistent.floor.filter(|&f| b < f) {
                why.push_str(&format!(
                    ": it is below the weights, gradients and optimizer state ({}: {}), which checkpointing, AMP and a smaller batch cannot reduce",
                    format_bytes(f),
                    parts_text(&ctx.persistent)
                ));
            }
            notes.insert(0, why);
        }
    }
    budget_met
}

fn parts_text(p: &Persistent) -> String {
    let mut parts = Vec::new();
    for (name, v) in [("weights", p.weights), ("gradients", p.gradients), ("optimizer state", p.optimizer_state)] {
        if let Some(v) = v {
            parts.push(format!("{name} {}", format_bytes(v)));
        }
    }
    parts.join(", ")
}

/// Why checkpointing cannot meet a budget.
fn budget_reason(budget: u64, lowest: u64, at: &str, p: &Persistent) -> String {
    match p.floor {
        Some(f) if budget < f => format!(
            "the budget {} cannot be met by checkpointing: it is below the weights, gradients and optimizer state ({}: {}), which checkpointing cannot reduce; its lowest predicted peak is {} {at}",
            format_bytes(budget),
            format_bytes(f),
            parts_text(p),
            format_bytes(lowest)
        ),
        _ => format!(
            "the budget {} cannot be met by checkpointing alone: its lowest predicted peak is {} {at}, where what remains is not activations of a module that checkpointing can drop (weights, gradients, optimizer state, the recomputation itself or memory outside the candidate modules)",
            format_bytes(budget),
            format_bytes(lowest)
        ),
    }
}

/// With a budget: those meeting it first (least extra time, then lowest peak), then the others
/// by lowest peak. Without: largest saving first, then least extra time.
fn rank(s: &mut [Suggestion], budget: Option<u64>) {
    let time = |x: &Suggestion| x.extra_time_per_iteration_s.unwrap_or(0.0);
    match budget {
        Some(_) => s.sort_by(|a, b| {
            let (ma, mb) = (a.meets_budget == Some(true), b.meets_budget == Some(true));
            mb.cmp(&ma)
                .then_with(|| if ma { time(a).total_cmp(&time(b)) } else { std::cmp::Ordering::Equal })
                .then(a.predicted_peak_bytes.cmp(&b.predicted_peak_bytes))
                .then(a.kind.cmp(&b.kind))
        }),
        None => s.sort_by(|a, b| b.saving_bytes.cmp(&a.saving_bytes).then_with(|| time(a).total_cmp(&time(b))).then(a.kind.cmp(&b.kind))),
    }
}
