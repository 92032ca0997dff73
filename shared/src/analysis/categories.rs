//! What every allocation is for, after PyTorch's `MemTracker` and the torch.profiler memory
//! timeline: parameter, buffer, gradient, activation, optimizer state, temporary or other, with
//! the [`Rule`] that decided it.
//!
//! Where operators were recorded with their tensors' storage addresses, what the ops did with
//! an allocation decides, as in the graph profile ([`crate::analysis::profile`]). Elsewhere (a
//! memory snapshot, a trace without tensor references) the category is inferred from the phase
//! the allocation was made in and how long it lived, over the *training window*:
//!
//! - it starts at the first iteration (`Trace::iterations`), else at the first forward operator,
//!   else at the first event whose stack calls a module (`Module._call_impl`: building a model
//!   runs `torch/nn/modules` code too, so a snapshot's phase alone cannot tell construction from
//!   the first forward), else at the first event with a phase;
//! - it ends with the last iteration, else with the last event that has a phase (what follows is
//!   teardown: `del model` frees the parameters after the last step);
//! - inside it, events form *runs*: a run is a stretch of one phase (forward, backward,
//!   optimizer) of one iteration. Phase-less events after a forward join it (a loss computed
//!   outside `torch.nn`); after a backward or an optimizer step they join it if the same phase
//!   follows them, else they form a phase-less run (gradient clipping, the next batch). Events
//!   between two iterations belong to no run.
//!
//! Pairing follows [`crate::analysis::leaks`]: an `Alloc` is freed by the next `Free` at its
//! address on its device (a second `Alloc` at the address ends it, its free being lost).

use crate::hash::FastMap;
use crate::model::{Device, EventType, Phase, Trace, INPUT_LAYER};
use serde::{Deserialize, Serialize};

/// What an allocation is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// Trained weights.
    Parameter,
    /// Module state that is not trained (batch norm's running statistics, frozen weights):
    /// only told from parameters where operators were recorded.
    Buffer,
    Gradient,
    /// Forward results kept for backward.
    Activation,
    /// What the optimizer keeps between steps (momentum, Adam's `exp_avg` and `exp_avg_sq`).
    OptimizerState,
    /// Freed in the phase that allocated it.
    Temporary,
    /// Everything else: input batches, library workspaces, outputs kept by the program, memory
    /// outside the training window, pinned host memory.
    Other,
}

impl Category {
    pub const ALL: [Category; 7] = [
        Category::Parameter,
        Category::Buffer,
        Category::Gradient,
        Category::Activation,
        Category::OptimizerState,
        Category::Temporary,
        Category::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Category::Parameter => "parameter",
            Category::Buffer => "buffer",
            Category::Gradient => "gradient",
            Category::Activation => "activation",
            Category::OptimizerState => "optimizer_state",
            Category::Temporary => "temporary",
            Category::Other => "other",
        }
    }
}

/// Why an allocation got its [`Category`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// Operators were recorded with their tensors' storage addresses, and what they did with
    /// the allocation decides (the graph profile's tensor classes, plus buffers):
    /// - allocated before the training window and read in forward: a parameter if the
    ///   optimizer touched it (or no optimizer ran and it lives past the window), a buffer if
    ///   the optimizer never did and it lives past the window (an input batch does not);
    /// - allocated in backward and read by the optimizer or by `AccumulateGrad`: a gradient;
    /// - allocated by the optimizer and kept past its run, or allocated before the window and
    ///   used by the optimizer but not in forward: optimizer state;
    /// - allocated in forward and read in backward: an activation.
    ///
    /// Anything else falls to the rules below, except that an allocation made before the
    /// window, or one no operator's tensor lives in that outlives its run (a library's
    /// workspace), gets `NoRule`.
    GraphProfile,
    /// Allocated before the training window and alive past its end (never freed, or freed in
    /// teardown): a parameter. Without operators a buffer cannot be told from a parameter.
    AliveThroughout,
    /// Allocated in a forward run, freed in a backward run: an activation.
    ForwardFreedInBackward,
    /// Allocated in a backward run and alive past it (kept for the optimizer or the next step):
    /// a gradient.
    BackwardKeptToNextStep,
    /// Allocated in an optimizer run and alive past it: optimizer state.
    OptimizerKept,
    /// Freed in the run (the same phase of the same iteration) that allocated it: a temporary.
    FreedInItsPhase,
    /// No rule applies: outside the training window, allocated in forward and kept past
    /// backward, a library's workspace (a cuBLAS handle's or cuBLASLt's, known from the stack,
    /// which lives as long as the process), pinned host memory, or a trace without phases.
    NoRule,
}

/// The category of one `Alloc` event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Categorized {
    /// Index of the `Alloc` event.
    pub event: u32,
    pub category: Category,
    pub rule: Rule,
}

/// No run: outside the training window.
const NO_RUN: u32 = u32::MAX;

/// One allocation's life, as the rules read it.
#[derive(Clone, Copy, Debug)]
struct Life {
    event: u32,
    /// The freeing event (`Free`, or the `Alloc` that reused the address), if any.
    free: Option<u32>,
    run_alloc: u32,
    run_free: u32,
    pinned: bool,
}

/// The training window, as event indices (both inclusive); `None` where the trace has no
/// phases, iterations or operators to find one.
fn training_window(trace: &Trace) -> Option<(usize, usize)> {
    let ev = &trace.events;
    let n = ev.len();
    if n == 0 {
        return None;
    }
    let first_at = |t: u64| ev.ts_ns.partition_point(|&x| x < t);
    if !trace.iterations.is_empty() {
        let start = trace.iterations.iter().map(|i| i.start_ns).min()?;
        let end = trace.iterations.iter().map(|i| i.end_ns).max()?;
        let (s, e) = (first_at(start), ev.ts_ns.partition_point(|&x| x <= end));
        return (s < e).then(|| (s, e - 1));
    }
    let has_phase = |i: usize| ev.phase(i) != Phase::Other;
    let last = (0..n).rev().find(|&i| has_phase(i))?;
    let forward_ops = trace.ops.iter().filter(|o| o.phase == Phase::Forward).map(|o| o.start_ns).min();
    let start = match forward_ops {
        Some(t) => first_at(t),
        None => match first_module_call(trace) {
            Some(i) => i,
            None => (0..n).find(|&i| has_phase(i))?,
        },
    };
    (start <= last).then_some((start, last))
}

/// What an allocation's stack says.
#[derive(Clone, Copy, Debug, Default)]
struct StackMarks {
    /// A frame of `torch.nn.Module.__call__`.
    module_call: bool,
    /// A frame that sets up a BLAS library's workspace.
    workspace: bool,
}

fn stack_marks(trace: &Trace, stack: u32) -> StackMarks {
    let mut m = StackMarks::default();
    for f in trace.stacks.stack(stack) {
        let name = trace.str(f.name);
        m.module_call |= (name == "_call_impl" || name == "_wrapped_call_impl") && trace.str(f.filename).ends_with("module.py");
        m.workspace |= name.starts_with("at::cuda::") && (name.contains("WorkspaceForHandle") || name.contains("BlasLtWorkspace"));
    }
    m
}

/// Marks of every distinct stack, computed once.
struct Stacks<'a> {
    trace: &'a Trace,
    cache: FastMap<u32, StackMarks>,
}

impl Stacks<'_> {
    fn marks(&mut self, stack: u32) -> StackMarks {
        let trace = self.trace;
        *self.cache.entry(stack).or_insert_with(|| stack_marks(trace, stack))
    }
}

/// The first event whose stack calls a module.
fn first_module_call(trace: &Trace) -> Option<usize> {
    let mut stacks = Stacks { trace, cache: FastMap::default() };
    trace.stacks.event_stacks.iter().find(|&&(_, s)| stacks.marks(s).module_call).map(|&(e, _)| e as usize)
}

/// Allocations whose stack shows a BLAS library setting up its workspace.
pub(crate) fn workspace_allocations(trace: &Trace) -> crate::hash::FastSet<u32> {
    let ev = &trace.events;
    let mut stacks = Stacks { trace, cache: FastMap::default() };
    trace
        .stacks
        .event_stacks
        .iter()
        .filter(|&&(e, s)| (e as usize) < ev.len() && ev.event_type(e as usize) == EventType::Alloc && stacks.marks(s).workspace)
        .map(|&(e, _)| e)
        .collect()
}

/// Runs as they are found, event by event.
struct Runs {
    /// Phase of every run.
    phase: Vec<Phase>,
    current: Option<u32>,
    /// Phase-less events after a backward or optimizer run wait for the next phase: the run
    /// goes on if it is the same, else they form a run of their own.
    waiting: bool,
    /// Lives whose alloc (`false`) or free (`true`) is waiting.
    pending: Vec<(u32, bool)>,
}

impl Runs {
    /// Ends the waiting stretch: in the current run, or in a new phase-less one.
    fn settle(&mut self, lives: &mut [Life], same_run: bool) {
        if !self.waiting {
            return;
        }
        self.waiting = false;
        let run = match self.current {
            Some(r) if same_run => r,
            _ => self.start(Phase::Other),
        };
        for (k, is_free) in self.pending.drain(..) {
            let l = &mut lives[k as usize];
            if is_free {
                l.run_free = run;
            } else {
                l.run_alloc = run;
            }
        }
    }

    fn start(&mut self, phase: Phase) -> u32 {
        self.phase.push(phase);
        self.current = Some((self.phase.len() - 1) as u32);
        (self.phase.len() - 1) as u32
    }

    /// The run of an event of `phase` (`None`: waiting).
    fn of(&mut self, lives: &mut [Life], phase: Phase) -> Option<u32> {
        let current = self.current.map(|r| self.phase[r as usize]);
        if phase == Phase::Other {
            return match current {
                None => Some(self.start(Phase::Other)),
                Some(Phase::Backward | Phase::Optimizer) => {
                    self.waiting = true;
                    None
                }
                Some(_) => self.current,
            };
        }
        self.settle(lives, current == Some(phase));
        if self.current.map(|r| self.phase[r as usize]) != Some(phase) {
            self.start(phase);
        }
        self.current
    }
}

/// Every allocation paired with its free, and the run of both, plus the phase of every run.
fn lives(trace: &Trace, window: Option<(usize, usize)>) -> (Vec<Life>, Vec<Phase>) {
    let ev = &trace.events;
    let pinned: Vec<bool> = trace.devices.iter().map(Device::is_pinned_host).collect();
    let mut iterations: Vec<(u64, u64)> = trace.iterations.iter().map(|i| (i.start_ns, i.end_ns)).collect();
    iterations.sort_unstable();
    // Iterations started so far, and the one the last event fell in.
    let mut started = 0;
    let mut last_iteration: Option<usize> = None;
    let mut runs = Runs { phase: Vec::new(), current: None, waiting: false, pending: Vec::new() };
    let mut lives: Vec<Life> = Vec::new();
    let mut open: FastMap<(u8, u64), u32> = FastMap::default();
    for i in 0..ev.len() {
        let ts = ev.ts_ns[i];
        while started < iterations.len() && iterations[started].0 <= ts {
            started += 1;
        }
        // Without iterations, the window is one; between two, no iteration.
        let iteration = if iterations.is_empty() { Some(0) } else { started.checked_sub(1).filter(|&k| ts <= iterations[k].1) };
        let in_window = window.is_some_and(|(s, e)| i >= s && i <= e);
        let run = if !in_window || iteration.is_none() {
            runs.settle(&mut lives, false);
            runs.current = None;
            Some(NO_RUN)
        } else {
            if iteration != last_iteration {
                runs.settle(&mut lives, false);
                runs.current = None;
            }
            runs.of(&mut lives, ev.phase(i))
        };
        last_iteration = iteration;
        let dev = ev.device[i];
        let key = (dev, ev.address[i]);
        let set_free = |lives: &mut Vec<Life>, runs: &mut Runs, k: u32| {
            let l = &mut lives[k as usize];
            l.free = Some(i as u32);
            match run {
                Some(r) => l.run_free = r,
                None => runs.pending.push((k, true)),
            }
        };
        match ev.event_type(i) {
            EventType::Alloc => {
                let k = lives.len() as u32;
                if let Some(old) = open.insert(key, k) {
                    set_free(&mut lives, &mut runs, old);
                }
                lives.push(Life {
                    event: i as u32,
                    free: None,
                    run_alloc: run.unwrap_or(NO_RUN),
                    run_free: NO_RUN,
                    pinned: pinned.get(dev as usize).copied().unwrap_or(false),
                });
                if run.is_none() {
                    runs.pending.push((k, false));
                }
            }
            EventType::Free => {
                if let Some(k) = open.remove(&key) {
                    set_free(&mut lives, &mut runs, k);
                }
            }
            _ => {}
        }
    }
    runs.settle(&mut lives, false);
    (lives, runs.phase)
}

/// What operators did with one allocation.
#[derive(Clone, Copy, Debug, Default)]
struct Uses {
    /// Some operator's tensor lives in it.
    touched: bool,
    forward: bool,
    backward_input: bool,
    optimizer: bool,
    accumulate_grad: bool,
}

/// What the recorded operators did with every allocation (indexed like `lives`); `None` when
/// the trace has no tensor storage addresses.
fn op_uses(trace: &Trace, lives: &[Life]) -> Option<Vec<Uses>> {
    if !trace.tensors.iter().any(|t| t.storage_id != 0) {
        return None;
    }
    let ev = &trace.events;
    let mut by_address: FastMap<u64, Vec<u32>> = FastMap::default();
    for (k, l) in lives.iter().enumerate() {
        if !l.pinned {
            by_address.entry(ev.address[l.event as usize]).or_default().push(k as u32);
        }
    }
    // The allocation at `addr` alive at `ts`.
    let find = |addr: u64, ts: u64| -> Option<usize> {
        let list = by_address.get(&addr)?;
        let p = list.partition_point(|&k| ev.ts_ns[lives[k as usize].event as usize] <= ts);
        let k = *list.get(p.checked_sub(1)?)? as usize;
        lives[k].free.is_none_or(|f| ev.ts_ns[f as usize] >= ts).then_some(k)
    };
    let mut uses = vec![Uses::default(); lives.len()];
    for o in &trace.ops {
        let is_acc = trace.str(o.name).contains("AccumulateGrad");
        for (range, input) in [(o.inputs, true), (o.outputs, false)] {
            let at = if input { o.start_ns } else { o.end_ns };
            for t in trace.tensors.get(range.0 as usize..range.1 as usize).unwrap_or(&[]) {
                if t.storage_id == 0 {
                    continue;
                }
                let Some(k) = find(t.storage_id, at) else { continue };
                let u = &mut uses[k];
                u.touched = true;
                match o.phase {
                    Phase::Forward => u.forward = true,
                    Phase::Backward if input => u.backward_input = true,
                    Phase::Optimizer => u.optimizer = true,
                    _ => {}
                }
                u.accumulate_grad |= is_acc && input;
            }
        }
    }
    Some(uses)
}

/// Gives every `Alloc` event of the trace its category and the rule that decided it, in event
/// order. Linear in events (plus a binary search per recorded tensor).
pub fn categorize(trace: &Trace) -> Vec<Categorized> {
    let ev = &trace.events;
    let window = training_window(trace);
    let (lives, run_phase) = lives(trace, window);
    let uses = op_uses(trace, &lives);
    let workspaces = workspace_allocations(trace);
    let has_optimizer = trace.ops.iter().any(|o| o.phase == Phase::Optimizer);
    let input_layer = trace.strings.lookup(INPUT_LAYER);
    let (start, end): (u32, u32) = window.map_or((u32::MAX, 0), |(s, e)| (s as u32, e as u32));
    let phase_of = |run: u32| run_phase.get(run as usize).copied();
    lives
        .iter()
        .enumerate()
        .map(|(k, l)| {
            let i = l.event as usize;
            let done = |category, rule| Categorized { event: l.event, category, rule };
            if l.pinned {
                return done(Category::Other, Rule::NoRule);
            }
            // Kept past its run: freed in another run, after the window, or never.
            let kept = l.run_free != l.run_alloc || l.free.is_none();
            let before = window.is_some() && l.event < start;
            let past_end = l.free.is_none_or(|f| f > end);
            if let Some(u) = uses.as_ref().map(|u| u[k]) {
                let phase = ev.phase(i);
                let module_state = before && u.forward && Some(ev.layer[i]) != input_layer;
                // In-place optimizer updates (`_foreach_add_`) record their inputs only; what the
                // optimizer never touches is a buffer if it lives on (an input batch does not).
                let class = if module_state && u.optimizer {
                    Some(Category::Parameter)
                } else if module_state && past_end {
                    Some(if has_optimizer { Category::Buffer } else { Category::Parameter })
                } else if phase == Phase::Backward && (u.optimizer || u.accumulate_grad) {
                    Some(Category::Gradient)
                } else if (phase == Phase::Optimizer && kept) || (before && u.optimizer && !u.forward) {
                    Some(Category::OptimizerState)
                } else if phase == Phase::Forward && u.backward_input {
                    Some(Category::Activation)
                } else {
                    None
                };
                if let Some(c) = class {
                    return done(c, Rule::GraphProfile);
                }
                // Before the window, what forward never read is no parameter. No operator's
                // tensor lives in it: a library's own memory (a workspace), not a tensor of the
                // model, unless freed in its phase.
                if before || (!u.touched && kept) {
                    return done(Category::Other, Rule::NoRule);
                }
            }
            if window.is_none() || workspaces.contains(&l.event) {
                return done(Category::Other, Rule::NoRule);
            }
            if before {
                return if past_end { done(Category::Parameter, Rule::AliveThroughout) } else { done(Category::Other, Rule::NoRule) };
            }
            let Some(alloc_phase) = phase_of(l.run_alloc) else {
                return done(Category::Other, Rule::NoRule);
            };
            if !kept {
                return done(Category::Temporary, Rule::FreedInItsPhase);
            }
            match alloc_phase {
                Phase::Forward if phase_of(l.run_free) == Some(Phase::Backward) => done(Category::Activation, Rule::ForwardFreedInBackward),
                Phase::Backward => done(Category::Gradient, Rule::BackwardKeptToNextStep),
                Phase::Optimizer => done(Category::OptimizerState, Rule::OptimizerKept),
                _ => done(Category::Other, Rule::NoRule),
            }
        })
        .collect()
}

/// Bytes per category alive right after event `event_index` on that event's device (`None`:
/// before the first event, on the device holding the most then), every category listed in
/// [`Category::ALL`] order, zeros included. Memory alive before the first event, and any
/// difference between the allocator's total and the categorized allocations, counts as
/// `Other`, so the bytes add up to the device's allocated total at that moment (for the peak,
/// `summary(trace).peak_event_index`, to its `peak_allocated_bytes`). Pinned host memory is
/// never counted.
pub fn bytes_at(trace: &Trace, categorized: &[Categorized], event_index: Option<usize>) -> Vec<(Category, u64)> {
    let ev = &trace.events;
    let mut bytes = [0u64; Category::ALL.len()];
    let pinned = |d: usize| trace.devices.get(d).is_some_and(Device::is_pinned_host);
    let event_index = event_index.filter(|&i| i < ev.len());
    let (device, total) = match event_index {
        Some(i) => (ev.device[i] as usize, ev.totals_at(i).allocated_bytes),
        None => ev
            .base_totals
            .iter()
            .enumerate()
            .filter(|&(d, _)| !pinned(d))
            .map(|(d, t)| (d, t.allocated_bytes))
            .max_by_key(|&(d, b)| (b, std::cmp::Reverse(d)))
            .unwrap_or((0, 0)),
    };
    if pinned(device) {
        return Category::ALL.iter().map(|&c| (c, 0)).collect();
    }
    let mut categorized_bytes = 0u64;
    if let Some(i) = event_index {
        // Allocations of the device still open after event `i`.
        let mut open: FastMap<u64, usize> = FastMap::default();
        for k in 0..=i {
            if ev.device[k] as usize != device {
                continue;
            }
            match ev.event_type(k) {
                EventType::Alloc => {
                    open.insert(ev.address[k], k);
                }
                EventType::Free => {
                    open.remove(&ev.address[k]);
                }
                _ => {}
            }
        }
        for &k in open.values() {
            let Ok(p) = categorized.binary_search_by_key(&(k as u32), |c| c.event) else { continue };
            let size = ev.size_bytes[k];
            bytes[categorized[p].category as usize] += size;
            categorized_bytes += size;
        }
    }
    bytes[Category::Other as usize] += total.saturating_sub(categorized_bytes);
    Category::ALL.iter().map(|&c| (c, bytes[c as usize])).collect()
}
