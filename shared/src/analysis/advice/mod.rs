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
//! Every change is then judged by what runs out: the reserved peak, where the trace knows the
//! device's reserved memory (`reserved.rs`: changes of whole blocks replayed through the same
//! model of the caching allocator, checkpointing and AMP taken as saving of it what they save
//! of the allocated peak), else the allocated peak. Changes that save nothing of it go to
//! [`AdviceReport::no_effect`], unranked. [`advice_rows`] (`rows.rs`) is the one projection of
//! the report every surface shows: `collector advise`, its `--json`, MCP's `advise` and the
//! viewer's Advice table.
//!
//! Candidate modules for checkpointing partition the model at its repeated blocks: module
//! paths ending in an index (`layer3.1`, `transformer.h.7`) and, elsewhere, the children of the
//! root (`conv1`, `fc`). A set is chosen greedily: at the predicted peak, the module whose
//! activations there save the most bytes per second of recomputation, as long as the replayed
//! peak goes down, until the budget is met.
//!
//! One file per kind of advice: `checkpoint.rs` (candidates, with `search.rs`'s greedy choice),
//! `amp.rs` (with `autocast.rs`, which operators autocast casts), `batch.rs`, `set_to_none.rs`,
//! `optimizer.rs`, `allocator.rs`; all replay `curve.rs`'s curve. `reserved.rs` judges them,
//! `rows.rs` shows them. This file holds the report's types and [`advise`], which measures the
//! baseline and gathers every kind.

mod allocator;
mod amp;
mod autocast;
mod batch;
mod checkpoint;
mod curve;
mod optimizer;
mod reserved;
mod rows;
mod search;
mod set_to_none;

use allocator::*;
pub use allocator::{ALLOCATOR_CANDIDATES, ALLOCATOR_MIN_SAVING_PCT};
use amp::*;
use batch::*;
use checkpoint::*;
use curve::*;
use optimizer::*;
use reserved::*;
pub use rows::{advice_rows, AdviceRow, AdviceRows};
use search::*;
use set_to_none::*;

use crate::analysis::profile::{graph_profile, IterationRole};
use crate::analysis::{median_f64, peak_device};
use crate::model::{Phase, Trace};
use crate::units::format_bytes;
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

/// What a change is judged by: what runs out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Measure {
    /// The reserved peak (PyTorch's caching allocator holds it; the device runs out of it).
    Reserved,
    /// The allocated peak, where the trace does not know the reserved memory (a CPU trace, a
    /// trace without fragmentation tracking).
    #[default]
    Allocated,
}

/// How a suggestion's reserved peak was predicted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReservedPrediction {
    /// The change replayed through the model of PyTorch's caching allocator (`crate::whatif`):
    /// allocator settings, and changes of whole blocks (optimizer state, `set_to_none`, a
    /// smaller batch).
    AllocatorReplay,
    /// The allocated saving taken as the reserved one (checkpointing, AMP: not changes of
    /// whole blocks the model could replay): the allocator's unused cache assumed unchanged.
    AllocatedSaving,
}

/// Whether a change saves anything of what runs out on this trace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// It lowers the peak it is judged by (ranked in [`AdviceReport::suggestions`]).
    #[default]
    Saves,
    /// It saves nothing of it, or raises it ([`AdviceReport::no_effect`]).
    None,
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
    /// Predicted reserved peak, where the trace knows the device's reserved memory
    /// (`reserved_predicted_by` says how).
    pub predicted_reserved_peak_bytes: Option<u64>,
    /// What the change saves of what runs out ([`AdviceReport::judged_by`]): the reserved
    /// saving where the trace knows reserved memory, else the allocated one. What the ranking
    /// uses.
    pub saving_bytes: i64,
    /// Measured allocated peak minus predicted allocated peak.
    #[serde(default)]
    pub allocated_saving_bytes: i64,
    /// Reserved peak minus predicted reserved peak (a replay's against the replay of the run as
    /// it was, where replayed), where the trace knows reserved memory.
    #[serde(default)]
    pub reserved_saving_bytes: Option<i64>,
    /// How `predicted_reserved_peak_bytes` was predicted.
    #[serde(default)]
    pub reserved_predicted_by: Option<ReservedPrediction>,
    /// Predicted reserved peak plus what the run held outside PyTorch's allocator
    /// ([`Baseline::outside_pytorch_bytes`]), for a trace with the device ledger.
    #[serde(default)]
    pub predicted_device_total_bytes: Option<u64>,
    /// Whether it saves anything of what runs out here.
    #[serde(default)]
    pub effect: Effect,
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
    /// The change in a few words, as tables name it: `checkpoint layer1, layer2`,
    /// `expandable_segments`, `batch 32`.
    pub fn label(&self) -> String {
        use SuggestionKind as K;
        match self.kind {
            K::Checkpoint => format!("checkpoint {}", self.layers.join(", ")),
            K::CheckpointAmp => format!("amp + checkpoint {}", self.layers.join(", ")),
            K::Amp => "amp (autocast)".to_owned(),
            K::SmallerBatch => match self.smaller_batch() {
                Some(BatchSize::Samples(n)) => format!("batch {n}"),
                Some(BatchSize::Percent(p)) => format!("batch at {p} %"),
                None => "smaller batch".to_owned(),
            },
            K::SetToNone => "zero_grad(set_to_none=True)".to_owned(),
            K::Optimizer => "optimizer with less state".to_owned(),
            K::ExpandableSegments => "expandable_segments".to_owned(),
            K::AllocatorSetting => self.change.trim_start_matches("PYTORCH_CUDA_ALLOC_CONF=").to_owned(),
        }
    }

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
    /// The most the run held outside PyTorch's allocator on the device (CUDA context,
    /// libraries, kernels), for a trace with the device ledger.
    #[serde(default)]
    pub outside_pytorch_bytes: Option<u64>,
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
    /// What every change is judged by: the reserved peak where the trace knows it.
    #[serde(default)]
    pub judged_by: Measure,
    /// Ranked: with a budget, those meeting it first (least extra time first), then the others
    /// by predicted peak (of [`AdviceReport::judged_by`]); without one, by saving. Only changes
    /// that save something of it.
    pub suggestions: Vec<Suggestion>,
    /// Changes that save nothing of what runs out on this trace (or raise it), not ranked: by
    /// kind.
    #[serde(default)]
    pub no_effect: Vec<Suggestion>,
    /// By activation bytes at the peak, largest first.
    pub checkpoint_candidates: Vec<CheckpointCandidate>,
    /// Advice not given, and what it would need.
    pub not_available: Vec<String>,
    pub notes: Vec<String>,
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
            allocated_saving_bytes: self.saving(predicted),
            reserved_saving_bytes: None,
            reserved_predicted_by: None,
            predicted_device_total_bytes: None,
            effect: Effect::Saves,
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
    // With the device ledger, a budget is the whole device's: what the run held outside
    // PyTorch's allocator comes off it.
    let outside = opts.budget_bytes.and_then(|_| crate::model::outside_pytorch_peak(trace, device));
    if let (Some(o), Some(b)) = (outside, opts.budget_bytes) {
        let within = AdviceOptions { budget_bytes: Some(b.saturating_sub(o)), ..opts.clone() };
        let mut r = advise_device(trace, device, &within);
        r.budget_bytes = Some(b);
        r.notes.push(format!(
            "the budget is the whole device's: {} of it held outside PyTorch's allocator in this run (the ledger: CUDA context, libraries, kernels), so PyTorch's peak must fit in {}",
            format_bytes(o),
            format_bytes(b.saturating_sub(o))
        ));
        return r;
    }
    advise_device(trace, device, opts)
}

/// [`advise`] on one device of a one-rank trace, within `opts.budget_bytes` of PyTorch's own.
fn advise_device(trace: &Trace, device: u8, opts: &AdviceOptions) -> AdviceReport {
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
    let Advice { proposals, mut candidates, mut notes, not_available } = suggest(trace, &ctx, &baseline, opts);
    let budget_met = budget_notes(&ctx, opts.budget_bytes, &proposals, &mut notes);
    let (judged_by, suggestions, no_effect) = judge(&ctx, device, &baseline, proposals, opts);
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
        judged_by,
        suggestions,
        no_effect,
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
        outside_pytorch_bytes: crate::model::outside_pytorch_peak(trace, device),
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

/// The advice before it is judged.
struct Advice {
    proposals: Vec<Proposal>,
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
    let mut proposals = Vec::new();
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
            candidates = checkpoint_advice(ctx, &defs, &times, &mut proposals, &mut notes);
        }
        amp_advice(ctx, &defs, &times, &mut proposals, &mut notes);
        batch_advice(ctx, trace.meta.batch_size, &mut proposals, &mut notes);
    }
    set_to_none_advice(ctx, &mut proposals);
    optimizer_advice(ctx, &mut proposals);
    fragmentation_advice(ctx, baseline, opts.fragmentation_threshold, &mut proposals, &mut notes, &mut not_available);
    Advice { proposals, candidates, notes, not_available }
}

/// Takes the suggestions and the budget; gives whether any suggestion meets the budget, and
/// puts first in `notes` that the peak already fits it or why nothing can meet it.
fn budget_notes(ctx: &Ctx, budget_bytes: Option<u64>, proposals: &[Proposal], notes: &mut Vec<String>) -> Option<bool> {
    let budget_met = budget_bytes.map(|_| proposals.iter().any(|p| p.suggestion.meets_budget == Some(true)));
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
/// by lowest peak (of `measure`). Without: largest saving first, then least extra time.
fn rank(s: &mut [Suggestion], budget: Option<u64>, measure: Measure) {
    let time = |x: &Suggestion| x.extra_time_per_iteration_s.unwrap_or(0.0);
    let peak = |x: &Suggestion| match measure {
        Measure::Reserved => x.predicted_reserved_peak_bytes.unwrap_or(x.predicted_peak_bytes),
        Measure::Allocated => x.predicted_peak_bytes,
    };
    match budget {
        Some(_) => s.sort_by(|a, b| {
            let (ma, mb) = (a.meets_budget == Some(true), b.meets_budget == Some(true));
            mb.cmp(&ma)
                .then_with(|| if ma { time(a).total_cmp(&time(b)) } else { std::cmp::Ordering::Equal })
                .then(peak(a).cmp(&peak(b)))
                .then(a.kind.cmp(&b.kind))
        }),
        None => s.sort_by(|a, b| b.saving_bytes.cmp(&a.saving_bytes).then_with(|| time(a).total_cmp(&time(b))).then(a.kind.cmp(&b.kind))),
    }
}
