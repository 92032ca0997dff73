//! The graph profile of a training trace: operator ranks, tensor classes, activation liveness,
//! memory by rank and its breakdown (the statistics the μ-TWO activation-checkpointing work
//! builds on), computed from a real run rather than from a compiled graph.
//!
//! Terms:
//! - a *node* is a top-level operator of an iteration: an op not nested in another op on its
//!   thread (`aten::conv2d`, not the `aten::convolution` inside it; a backward node is the
//!   autograd engine's `evaluate_function: XBackward0` wrapper, named `XBackward0`);
//! - a node's *rank* is its position in its iteration, by start time;
//! - a *block* is one allocation, from its alloc event to its free event (or a block that was
//!   alive before recording and is freed during it). Tensors an op read or wrote are matched to
//!   blocks by storage address at the op's start (inputs) or end (outputs), so views share
//!   their base's block.
//!
//! Iteration 0 warms the allocator and creates optimizer state, so with two or more iterations
//! it is reported separately ([`GraphProfile::warmup_nodes`]) and the steady iterations that
//! run the same node sequence are aligned rank by rank and reduced to medians.

use crate::analysis::{median_f64, peak_device};
use crate::model::{EventType, Phase, Trace, INPUT_LAYER};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// What a tensor is for, after μ-TWO's categories.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TensorClass {
    /// Alive before the first op, read by forward ops (and, when training, updated by the
    /// optimizer).
    #[serde(rename = "PARAM")]
    Param,
    /// Created in forward and read in backward.
    #[serde(rename = "ACT")]
    Act,
    /// Created in backward and consumed by the optimizer or accumulated into a parameter's
    /// gradient (`AccumulateGrad`).
    #[serde(rename = "GRAD")]
    Grad,
    /// Created or updated by optimizer ops and alive across iterations.
    #[serde(rename = "OPT_STATE")]
    OptState,
    /// Everything else: temporaries, the input batch, gradients between layers.
    #[serde(rename = "OTHER")]
    Other,
}

impl TensorClass {
    pub const ALL: [TensorClass; 5] = [TensorClass::Param, TensorClass::Act, TensorClass::Grad, TensorClass::OptState, TensorClass::Other];

    pub fn as_str(self) -> &'static str {
        match self {
            TensorClass::Param => "PARAM",
            TensorClass::Act => "ACT",
            TensorClass::Grad => "GRAD",
            TensorClass::OptState => "OPT_STATE",
            TensorClass::Other => "OTHER",
        }
    }
}

/// Statistics of one rank (one node), reduced over the aligned iterations.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeStats {
    pub rank: usize,
    pub node_name: String,
    /// Class of what the node produces: the largest non-`OTHER` class (by bytes) among the
    /// blocks it allocates or, when it allocates nothing (in-place updates, views), among the
    /// blocks its ops write. `None` where the trace has no tensor references to classify.
    pub node_type: Option<TensorClass>,
    pub gtype: Phase,
    /// Module path the node ran in.
    pub layer: String,
    /// Host wall time of the op (on CUDA: launch and any synchronisation, not kernel time).
    pub median_run_time_s: f64,
    /// Highest allocated bytes while the node ran (at least the bytes before it).
    pub median_peak_mem_bytes: u64,
    /// Allocated bytes just before the node started.
    pub median_active_mem_bytes: u64,
    pub device: String,
}

/// Liveness of one activation, from the reference iteration, sizes and times as medians.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ActivationStats {
    /// `layer:node#rank`, with `.k` for the k-th activation one node creates.
    pub activation_name: String,
    pub creation_rank: usize,
    pub last_fw_use_rank: usize,
    pub first_bw_use_rank: usize,
    pub last_bw_use_rank: usize,
    pub median_mem_size_bytes: u64,
    /// Wall time from the end of the last forward use to the start of the first backward use.
    pub inactive_time_s: f64,
    /// Run time of the forward nodes that rebuild the activation from the tensors still alive
    /// at its first backward use (itself and any freed intermediate it was computed from).
    pub recomp_time_s: f64,
    /// Bytes those nodes allocate.
    pub recomp_memory_bytes: u64,
}

/// Allocated bytes by class at one rank, taken at the node's own peak, so the parts add up to
/// `total_allocated` (the allocator's total at that moment).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BreakdownRow {
    pub rank: usize,
    pub weights: u64,
    pub gradients: u64,
    pub activations: u64,
    pub optimizer_state: u64,
    /// Temporaries, inputs, and memory alive before recording that no op touched.
    pub other: u64,
    pub total_allocated: u64,
}

/// How an iteration took part in the profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IterationRole {
    /// Iteration 0 of two or more: reported apart.
    Warmup,
    /// Aligned with the others and part of the medians.
    Steady,
    /// Ran a different node sequence from the other steady iterations, so it cannot be aligned.
    Excluded,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IterationInfo {
    pub index: u32,
    pub role: IterationRole,
    pub nodes: usize,
    pub duration_s: f64,
    pub peak_allocated_bytes: u64,
}

/// Ranks where the parts of an iteration begin (`None` when the part is absent).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sections {
    pub forward_start_rank: Option<usize>,
    /// First backward rank: the forward/backward boundary.
    pub backward_start_rank: Option<usize>,
    pub optimizer_start_rank: Option<usize>,
    pub optimizer_end_rank: Option<usize>,
}

/// Everything `collector analyze` writes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GraphProfile {
    pub device: String,
    pub iterations: Vec<IterationInfo>,
    /// The steady iteration the breakdown and the activation ranks come from: the one with the
    /// highest peak.
    pub reference_iteration: u32,
    pub nodes: Vec<NodeStats>,
    pub warmup_nodes: Vec<NodeStats>,
    pub sections: Sections,
    pub peak_rank: usize,
    pub peak_bytes: u64,
    /// Empty where the trace has no tensor references (see `not_derivable`).
    pub activations: Vec<ActivationStats>,
    /// Empty where the trace has no tensor references.
    pub breakdown: Vec<BreakdownRow>,
    /// Outputs this source cannot give, and why.
    pub not_derivable: Vec<String>,
    pub warnings: Vec<String>,
}

/// Why a profile cannot be computed.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    #[error(
        "the trace has no operators: ranks need operator events, which native traces and \
         torch.profiler Chrome traces carry (memory snapshots do not)"
    )]
    NoOperators,
    #[error("no iteration of the trace contains an operator")]
    NoNodes,
}

const BACKWARD_PREFIX: &str = "autograd::engine::evaluate_function: ";
const NO_BLOCK: u32 = u32::MAX;

/// One allocation's life.
#[derive(Clone, Debug)]
struct Block {
    size_bytes: u64,
    /// `None`: alive before recording.
    alloc_ts: Option<u64>,
    free_ts: Option<u64>,
    alloc_phase: Phase,
    alloc_layer_is_input: bool,
    /// Known from an event (counted in the totals) rather than only seen in an op's tensors.
    from_event: bool,
}

struct Blocks {
    blocks: Vec<Block>,
    /// Block of each event of the main device (`NO_BLOCK` for the others and non-block events).
    event_block: Vec<u32>,
    by_address: HashMap<u64, Vec<u32>>,
}

impl Blocks {
    fn build(trace: &Trace, device: u8) -> Self {
        let ev = &trace.events;
        let input = trace.strings.lookup(INPUT_LAYER);
        let mut blocks = Vec::new();
        let mut event_block = vec![NO_BLOCK; ev.len()];
        let mut by_address: HashMap<u64, Vec<u32>> = HashMap::new();
        let mut open: HashMap<u64, u32> = HashMap::new();
        for (i, slot) in event_block.iter_mut().enumerate() {
            if ev.device[i] != device {
                continue;
            }
            let (addr, ts) = (ev.address[i], ev.ts_ns[i]);
            match ev.event_type(i) {
                EventType::Alloc => {
                    let id = blocks.len() as u32;
                    blocks.push(Block {
                        size_bytes: ev.size_bytes[i],
                        alloc_ts: Some(ts),
                        free_ts: None,
                        alloc_phase: ev.phase(i),
                        alloc_layer_is_input: Some(ev.layer[i]) == input,
                        from_event: true,
                    });
                    // A second alloc at an open address means the free was lost: close it.
                    if let Some(old) = open.insert(addr, id) {
                        blocks[old as usize].free_ts.get_or_insert(ts);
                    }
                    by_address.entry(addr).or_default().push(id);
                    *slot = id;
                }
                EventType::Free => {
                    let id = match open.remove(&addr) {
                        Some(id) => id,
                        None => {
                            // Alive before recording: it starts at minus infinity.
                            let id = blocks.len() as u32;
                            blocks.push(Block {
                                size_bytes: ev.size_bytes[i],
                                alloc_ts: None,
                                free_ts: None,
                                alloc_phase: Phase::Other,
                                alloc_layer_is_input: false,
                                from_event: true,
                            });
                            by_address.entry(addr).or_default().insert(0, id);
                            id
                        }
                    };
                    blocks[id as usize].free_ts = Some(ts);
                    *slot = id;
                }
                _ => {}
            }
        }
        Self { blocks, event_block, by_address }
    }

    /// The block at `addr` alive at `ts`, among those already known.
    fn find(&self, addr: u64, ts: u64) -> Option<u32> {
        let list = self.by_address.get(&addr)?;
        let k = list.partition_point(|&b| self.blocks[b as usize].alloc_ts.is_none_or(|a| a <= ts));
        let b = *list.get(k.checked_sub(1)?)?;
        self.blocks[b as usize].free_ts.is_none_or(|f| f >= ts).then_some(b)
    }

    /// The block at `addr` alive at `ts`; a storage never seen in the events becomes a block
    /// alive before recording (not counted in the totals: its size is only what the op saw).
    fn lookup(&mut self, addr: u64, size_bytes: u64, ts: u64) -> Option<u32> {
        if addr == 0 {
            return None;
        }
        if let Some(list) = self.by_address.get(&addr) {
            let first_alloc = self.blocks[list[0] as usize].alloc_ts;
            if first_alloc.is_none_or(|a| a <= ts) {
                // Known address: the block alive then, or none (a stale pointer).
                return self.find(addr, ts);
            }
        }
        let id = self.blocks.len() as u32;
        self.blocks.push(Block {
            size_bytes,
            alloc_ts: None,
            free_ts: None,
            alloc_phase: Phase::Other,
            alloc_layer_is_input: false,
            from_event: false,
        });
        self.by_address.entry(addr).or_default().insert(0, id);
        Some(id)
    }
}

/// One node of one iteration.
#[derive(Clone, Debug)]
struct Node {
    op: usize,
    start_ns: u64,
    end_ns: u64,
    phase: Phase,
}

/// Top-level ops and, for every op, the index of its top-level ancestor.
fn top_level(trace: &Trace) -> (Vec<usize>, Vec<usize>) {
    let mut by_thread: HashMap<u64, Vec<usize>> = HashMap::new();
    for (i, o) in trace.ops.iter().enumerate() {
        by_thread.entry(o.thread).or_default().push(i);
    }
    let mut root = vec![usize::MAX; trace.ops.len()];
    let mut tops = Vec::new();
    for list in by_thread.values_mut() {
        list.sort_by_key(|&i| (trace.ops[i].start_ns, std::cmp::Reverse(trace.ops[i].end_ns), i));
        // End times of the ops open at the current start.
        let mut stack: Vec<u64> = Vec::new();
        let mut current_root = usize::MAX;
        for &i in list.iter() {
            let o = &trace.ops[i];
            // An op that starts at or after the top's end, and does not also end there, is
            // not nested in it.
            while stack.last().is_some_and(|&end| end <= o.start_ns && o.end_ns > end) {
                stack.pop();
            }
            if stack.is_empty() {
                current_root = i;
                tops.push(i);
            }
            root[i] = current_root;
            stack.push(o.end_ns.max(o.start_ns));
        }
    }
    tops.sort_by_key(|&i| (trace.ops[i].start_ns, i));
    (tops, root)
}

/// Iteration spans: the recorded ones, else `ProfilerStep#N` scopes, else the whole trace.
fn iteration_spans(trace: &Trace) -> Vec<(u32, u64, u64)> {
    if !trace.iterations.is_empty() {
        return trace.iterations.iter().map(|i| (i.index, i.start_ns, i.end_ns)).collect();
    }
    let mut steps: Vec<(u32, u64, u64)> = trace
        .scopes
        .iter()
        .filter_map(|s| {
            let n = trace.opt_str(s.name)?.strip_prefix("ProfilerStep#")?;
            Some((n.parse().ok()?, s.start_ns, s.end_ns))
        })
        .collect();
    if !steps.is_empty() {
        steps.sort_by_key(|s| s.1);
        return steps;
    }
    let start = trace.ops.iter().map(|o| o.start_ns).min().unwrap_or(0);
    let end = trace.ops.iter().map(|o| o.end_ns).max().unwrap_or(0);
    vec![(0, start, end)]
}

/// Display name of a node.
fn node_name(trace: &Trace, op: usize) -> &str {
    let n = trace.str(trace.ops[op].name);
    n.strip_prefix(BACKWARD_PREFIX).unwrap_or(n)
}

fn median_u64(v: &mut [u64]) -> u64 {
    v.sort_unstable();
    match v.len() {
        0 => 0,
        n if n % 2 == 1 => v[n / 2],
        n => v[n / 2 - 1] / 2 + v[n / 2] / 2 + (v[n / 2 - 1] % 2 + v[n / 2] % 2) / 2,
    }
}

/// What the op uses of each block, for classification.
#[derive(Clone, Copy, Debug, Default)]
struct BlockUse {
    forward: bool,
    backward_input: bool,
    optimizer: bool,
    optimizer_output: bool,
    accumulate_grad: bool,
}

/// Computes the [`GraphProfile`] of a trace with operators.
pub fn graph_profile(trace: &Trace) -> Result<GraphProfile, ProfileError> {
    if trace.ops.is_empty() {
        return Err(ProfileError::NoOperators);
    }
    let device = peak_device(trace);
    let device_name = trace.devices.get(device as usize).map_or_else(|| "unknown".to_owned(), |d| d.to_string());
    let ev = &trace.events;
    let (tops, root) = top_level(trace);
    let spans = iteration_spans(trace);

    // Nodes of each iteration, in start order.
    let iters: Vec<Vec<Node>> = spans
        .iter()
        .map(|&(_, s, e)| {
            tops.iter()
                .filter(|&&i| trace.ops[i].start_ns >= s && trace.ops[i].start_ns <= e)
                .map(|&i| Node {
                    op: i,
                    start_ns: trace.ops[i].start_ns,
                    end_ns: trace.ops[i].end_ns.max(trace.ops[i].start_ns),
                    phase: trace.ops[i].phase,
                })
                .collect()
        })
        .collect();
    if iters.iter().all(Vec::is_empty) {
        return Err(ProfileError::NoNodes);
    }

    // Allocated bytes of the main device after each of its events.
    let mut ts: Vec<u64> = Vec::new();
    let mut alloc: Vec<u64> = Vec::new();
    let mut ev_index: Vec<usize> = Vec::new();
    {
        let mut cursor = ev.cursor();
        for i in 0..ev.len() {
            let t = cursor.advance();
            if ev.device[i] == device {
                ts.push(ev.ts_ns[i]);
                alloc.push(t.allocated_bytes);
                ev_index.push(i);
            }
        }
    }
    let base_alloc = ev.base_totals.get(device as usize).map_or(0, |t| t.allocated_bytes);
    // (active before, peak during, position of the peak in `ts`: None = before every event).
    let measure = |n: &Node| -> (u64, u64, Option<usize>) {
        let a = ts.partition_point(|&t| t < n.start_ns);
        let b = ts.partition_point(|&t| t <= n.end_ns);
        let active = if a == 0 { base_alloc } else { alloc[a - 1] };
        let mut peak = (active, a.checked_sub(1));
        for (k, &v) in alloc.iter().enumerate().take(b).skip(a) {
            if v > peak.0 {
                peak = (v, Some(k));
            }
        }
        (active, peak.0, peak.1)
    };

    // Roles: iteration 0 warms up when there are several; the steady ones are aligned on the
    // most common node sequence.
    let n_iter = iters.len();
    let names: Vec<Vec<&str>> = iters.iter().map(|ns| ns.iter().map(|n| node_name(trace, n.op)).collect()).collect();
    let steady_candidates: Vec<usize> = if n_iter >= 2 { (1..n_iter).collect() } else { vec![0] };
    let mut seq_count: HashMap<&[&str], usize> = HashMap::new();
    for &k in &steady_candidates {
        if !names[k].is_empty() {
            *seq_count.entry(names[k].as_slice()).or_default() += 1;
        }
    }
    let common = steady_candidates
        .iter()
        .filter(|&&k| !names[k].is_empty())
        .max_by_key(|&&k| (seq_count[names[k].as_slice()], std::cmp::Reverse(k)))
        .map(|&k| names[k].clone())
        .ok_or(ProfileError::NoNodes)?;
    let mut warnings = Vec::new();
    let mut roles = vec![IterationRole::Excluded; n_iter];
    if n_iter >= 2 {
        roles[0] = IterationRole::Warmup;
    }
    let mut steady = Vec::new();
    for &k in &steady_candidates {
        if names[k] == common {
            roles[k] = IterationRole::Steady;
            steady.push(k);
        } else {
            warnings.push(format!(
                "iteration {} ran {} nodes in a different order from the other {} steady iterations ({} nodes); it is left out of the medians",
                spans[k].0,
                names[k].len(),
                seq_count.get(common.as_slice()).copied().unwrap_or(0),
                common.len()
            ));
        }
    }
    let measures: Vec<Vec<(u64, u64, Option<usize>)>> = iters.iter().map(|ns| ns.iter().map(measure).collect()).collect();
    let iter_peak = |k: usize| measures[k].iter().map(|m| m.1).max().unwrap_or(0);
    let reference = *steady.iter().max_by_key(|&&k| (iter_peak(k), std::cmp::Reverse(k))).ok_or(ProfileError::NoNodes)?;

    // Blocks and what ops do with them.
    let classify = trace.tensors.iter().any(|t| t.storage_id != 0);
    let mut blocks = Blocks::build(trace, device);
    let mut node_of_op: Vec<Option<(usize, usize)>> = vec![None; trace.ops.len()];
    for (k, ns) in iters.iter().enumerate() {
        for (r, n) in ns.iter().enumerate() {
            node_of_op[n.op] = Some((k, r));
        }
    }
    // (block, iteration, rank, is input, phase)
    let mut uses: Vec<(u32, u32, u32, bool, Phase)> = Vec::new();
    let mut block_use: Vec<BlockUse> = Vec::new();
    // Blocks each node writes (outputs of its ops).
    let mut node_outputs: HashMap<(usize, usize), Vec<u32>> = HashMap::new();
    if classify {
        for (i, o) in trace.ops.iter().enumerate() {
            let is_acc = trace.str(o.name).contains("AccumulateGrad");
            let node = root.get(i).and_then(|&r| node_of_op.get(r).copied().flatten());
            for (range, input) in [(o.inputs, true), (o.outputs, false)] {
                for t in trace.tensors.get(range.0 as usize..range.1 as usize).unwrap_or(&[]) {
                    let at = if input { o.start_ns } else { o.end_ns };
                    let Some(b) = blocks.lookup(t.storage_id, t.size_bytes, at) else {
                        continue;
                    };
                    if block_use.len() <= b as usize {
                        block_use.resize(b as usize + 1, BlockUse::default());
                    }
                    let u = &mut block_use[b as usize];
                    match o.phase {
                        Phase::Forward => u.forward = true,
                        Phase::Backward if input => u.backward_input = true,
                        Phase::Optimizer => {
                            u.optimizer = true;
                            u.optimizer_output |= !input;
                        }
                        _ => {}
                    }
                    u.accumulate_grad |= is_acc && input;
                    if let Some((k, r)) = node {
                        uses.push((b, k as u32, r as u32, input, o.phase));
                        if !input {
                            node_outputs.entry((k, r)).or_default().push(b);
                        }
                    }
                }
            }
        }
    }
    block_use.resize(blocks.blocks.len(), BlockUse::default());
    let has_optimizer = trace.ops.iter().any(|o| o.phase == Phase::Optimizer);
    let first_start = iters.iter().flatten().map(|n| n.start_ns).min().unwrap_or(0);
    let iter_of = |t: u64| spans.iter().position(|&(_, s, e)| t >= s && t <= e);
    let class: Vec<TensorClass> = blocks
        .blocks
        .iter()
        .zip(&block_use)
        .map(|(b, u)| {
            let pre_existing = b.alloc_ts.is_none_or(|t| t < first_start);
            if pre_existing && u.forward && !b.alloc_layer_is_input && (u.optimizer_output || !has_optimizer) {
                TensorClass::Param
            } else if b.alloc_phase == Phase::Backward && (u.optimizer || u.accumulate_grad) {
                TensorClass::Grad
            } else if (b.alloc_phase == Phase::Optimizer
                && b.alloc_ts.is_some_and(|a| {
                    let k = iter_of(a);
                    b.free_ts.is_none_or(|f| k.is_none() || iter_of(f) != k)
                }))
                || (pre_existing && u.optimizer_output && !u.forward)
            {
                TensorClass::OptState
            } else if b.alloc_phase == Phase::Forward && u.backward_input {
                TensorClass::Act
            } else {
                TensorClass::Other
            }
        })
        .collect();

    // Blocks each node allocates, in order.
    let mut node_allocs: HashMap<(usize, usize), Vec<u32>> = HashMap::new();
    let node_at = |k: usize, t: u64| -> Option<usize> {
        let ns = &iters[k];
        let p = ns.partition_point(|n| n.start_ns <= t);
        (p > 0 && t <= ns[p - 1].end_ns).then(|| p - 1)
    };
    for &i in &ev_index {
        let b = blocks.event_block[i];
        if b == NO_BLOCK || ev.event_type(i) != EventType::Alloc {
            continue;
        }
        let t = ev.ts_ns[i];
        if let Some(k) = iter_of(t) {
            if let Some(r) = node_at(k, t) {
                node_allocs.entry((k, r)).or_default().push(b);
            }
        }
    }

    // What the node produces: the largest non-OTHER class among the blocks it allocates, else
    // among the top-level op's own outputs (in-place updates: `add_` on a weight), else, for
    // a node that allocates nothing, among what its nested ops write (views, accumulation).
    let node_type = |k: usize, r: usize| -> Option<TensorClass> {
        if !classify {
            return None;
        }
        let dominant = |list: &mut dyn Iterator<Item = u32>| -> Option<TensorClass> {
            let mut bytes = [0u64; 5];
            let mut seen = std::collections::HashSet::new();
            let mut any = false;
            for b in list {
                let c = class[b as usize];
                if seen.insert(b) && c != TensorClass::Other {
                    bytes[c as usize] += blocks.blocks[b as usize].size_bytes.max(1);
                    any = true;
                }
            }
            any.then(|| TensorClass::ALL.into_iter().max_by_key(|&c| (bytes[c as usize], std::cmp::Reverse(c)))).flatten()
        };
        let allocs = node_allocs.get(&(k, r)).map(Vec::as_slice).unwrap_or(&[]);
        let op = &trace.ops[iters[k][r].op];
        let own = trace.tensors.get(op.outputs.0 as usize..op.outputs.1 as usize).unwrap_or(&[]);
        let own_blocks: Vec<u32> = own.iter().filter_map(|t| blocks.find(t.storage_id, op.end_ns)).collect();
        let nested = node_outputs.get(&(k, r)).map(Vec::as_slice).unwrap_or(&[]);
        Some(
            dominant(&mut allocs.iter().copied())
                .or_else(|| dominant(&mut own_blocks.iter().copied()))
                .or_else(|| if allocs.is_empty() { dominant(&mut nested.iter().copied()) } else { None })
                .unwrap_or(TensorClass::Other),
        )
    };

    let stats_over = |its: &[usize], reference: usize| -> Vec<NodeStats> {
        iters[reference]
            .iter()
            .enumerate()
            .map(|(r, n)| {
                let mut times: Vec<f64> = its.iter().map(|&k| (iters[k][r].end_ns - iters[k][r].start_ns) as f64 * 1e-9).collect();
                let mut peaks: Vec<u64> = its.iter().map(|&k| measures[k][r].1).collect();
                let mut actives: Vec<u64> = its.iter().map(|&k| measures[k][r].0).collect();
                NodeStats {
                    rank: r,
                    node_name: node_name(trace, n.op).to_owned(),
                    node_type: node_type(reference, r),
                    gtype: n.phase,
                    layer: trace.opt_str(trace.ops[n.op].layer).unwrap_or("").to_owned(),
                    median_run_time_s: median_f64(&mut times).unwrap_or(0.0),
                    median_peak_mem_bytes: median_u64(&mut peaks),
                    median_active_mem_bytes: median_u64(&mut actives),
                    device: device_name.clone(),
                }
            })
            .collect()
    };
    let nodes = stats_over(&steady, reference);
    let warmup_nodes = if n_iter >= 2 && !iters[0].is_empty() { stats_over(&[0], 0) } else { Vec::new() };

    let mut sections = Sections::default();
    for n in &nodes {
        let slot = match n.gtype {
            Phase::Forward => &mut sections.forward_start_rank,
            Phase::Backward => &mut sections.backward_start_rank,
            Phase::Optimizer => &mut sections.optimizer_start_rank,
            Phase::Other => continue,
        };
        slot.get_or_insert(n.rank);
        if n.gtype == Phase::Optimizer {
            sections.optimizer_end_rank = Some(n.rank);
        }
    }
    let (peak_rank, peak_bytes) =
        nodes.iter().map(|n| (n.rank, n.median_peak_mem_bytes)).max_by_key(|&(r, b)| (b, std::cmp::Reverse(r))).unwrap_or((0, 0));

    // Breakdown of the reference iteration at each node's peak.
    let mut breakdown = Vec::new();
    if classify {
        let known_base: u64 = blocks.blocks.iter().filter(|b| b.from_event && b.alloc_ts.is_none()).map(|b| b.size_bytes).sum();
        let mut parts = [0u64; 5];
        parts[4] = base_alloc.saturating_sub(known_base);
        for (b, c) in blocks.blocks.iter().zip(&class) {
            if b.from_event && b.alloc_ts.is_none() {
                parts[*c as usize] += b.size_bytes;
            }
        }
        // Positions (in `ts`) at which to take the parts, with the rank they belong to.
        let mut wanted: Vec<(Option<usize>, usize)> = measures[reference].iter().enumerate().map(|(r, m)| (m.2, r)).collect();
        wanted.sort_unstable();
        let mut rows = vec![BreakdownRow::default(); wanted.len()];
        let mut w = 0;
        while w < wanted.len() && wanted[w].0.is_none() {
            rows[wanted[w].1] = row(wanted[w].1, &parts, base_alloc);
            w += 1;
        }
        for (pos, &i) in ev_index.iter().enumerate() {
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
            while w < wanted.len() && wanted[w].0 == Some(pos) {
                rows[wanted[w].1] = row(wanted[w].1, &parts, alloc[pos]);
                w += 1;
            }
        }
        breakdown = rows;
        let mismatched =
            breakdown.iter().filter(|r| r.weights + r.gradients + r.activations + r.optimizer_state + r.other != r.total_allocated).count();
        if mismatched > 0 {
            warnings.push(format!(
                "at {mismatched} ranks the allocator's total differs from the sum of the blocks it reported (the source corrected its running totals)"
            ));
        }
    }

    // Activation liveness.
    let mut activations = Vec::new();
    if classify {
        // Uses of each block, grouped.
        uses.sort_unstable_by_key(|u| (u.0, u.1, u.2));
        let use_ranges = |b: u32| -> &[(u32, u32, u32, bool, Phase)] {
            let s = uses.partition_point(|u| u.0 < b);
            let e = uses.partition_point(|u| u.0 <= b);
            &uses[s..e]
        };
        // Per steady iteration: key (creation rank, ordinal) → (size, inactive s, ranks, block).
        type Key = (usize, usize);
        struct Seen {
            size: u64,
            inactive_s: f64,
            ranks: (usize, usize, usize),
            block: u32,
        }
        let mut per_iter: Vec<HashMap<Key, Seen>> = Vec::new();
        for &k in &steady {
            let mut map = HashMap::new();
            for r in 0..iters[k].len() {
                let Some(allocs) = node_allocs.get(&(k, r)) else { continue };
                let mut ordinal = 0;
                for &b in allocs {
                    if class[b as usize] != TensorClass::Act {
                        continue;
                    }
                    let us = use_ranges(b);
                    let in_iter = us.iter().filter(|u| u.1 as usize == k);
                    let last_fw = in_iter.clone().filter(|u| u.4 == Phase::Forward).map(|u| u.2 as usize).max().unwrap_or(r).max(r);
                    let bw: Vec<usize> = in_iter.filter(|u| u.4 == Phase::Backward && u.3).map(|u| u.2 as usize).collect();
                    let (Some(&first_bw), Some(&last_bw)) = (bw.iter().min(), bw.iter().max()) else {
                        continue;
                    };
                    let inactive_ns = iters[k][first_bw].start_ns.saturating_sub(iters[k][last_fw].end_ns);
                    map.insert(
                        (r, ordinal),
                        Seen {
                            size: blocks.blocks[b as usize].size_bytes,
                            inactive_s: inactive_ns as f64 * 1e-9,
                            ranks: (last_fw, first_bw, last_bw),
                            block: b,
                        },
                    );
                    ordinal += 1;
                }
            }
            per_iter.push(map);
        }
        let ref_pos = steady.iter().position(|&k| k == reference).unwrap_or(0);
        let mut keys: Vec<Key> = per_iter[ref_pos].keys().copied().collect();
        keys.sort_unstable();
        // Forward nodes' input blocks, for recomputation.
        let mut node_inputs: HashMap<usize, Vec<u32>> = HashMap::new();
        for u in &uses {
            if u.1 as usize == reference && u.3 && u.4 == Phase::Forward {
                node_inputs.entry(u.2 as usize).or_default().push(u.0);
            }
        }
        let creator = |b: u32| -> Option<usize> {
            let t = blocks.blocks[b as usize].alloc_ts?;
            if blocks.blocks[b as usize].alloc_phase != Phase::Forward {
                return None;
            }
            node_at(reference, t)
        };
        for key in keys {
            let s = &per_iter[ref_pos][&key];
            let mut sizes: Vec<u64> = per_iter.iter().filter_map(|m| m.get(&key)).map(|x| x.size).collect();
            let mut inactive: Vec<f64> = per_iter.iter().filter_map(|m| m.get(&key)).map(|x| x.inactive_s).collect();
            // Recompute from what is alive at the first backward use.
            let when = iters[reference][s.ranks.1].start_ns;
            let alive = |b: u32| {
                let bl = &blocks.blocks[b as usize];
                bl.alloc_ts.is_none_or(|a| a <= when) && bl.free_ts.is_none_or(|f| f >= when)
            };
            let mut todo = vec![key.0];
            let mut set = std::collections::BTreeSet::new();
            while let Some(r) = todo.pop() {
                if !set.insert(r) {
                    continue;
                }
                for &b in node_inputs.get(&r).map(Vec::as_slice).unwrap_or(&[]) {
                    if b != s.block && !alive(b) {
                        if let Some(m) = creator(b).filter(|&m| m < r) {
                            todo.push(m);
                        }
                    }
                }
            }
            let recomp_time_s = set.iter().map(|&r| nodes[r].median_run_time_s).sum();
            let recomp_memory_bytes = set
                .iter()
                .flat_map(|r| node_allocs.get(&(reference, *r)).map(Vec::as_slice).unwrap_or(&[]))
                .map(|&b| blocks.blocks[b as usize].size_bytes)
                .sum();
            let n = &nodes[key.0];
            let base = if n.layer.is_empty() { n.node_name.clone() } else { format!("{}:{}", n.layer, n.node_name) };
            activations.push(ActivationStats {
                activation_name: if key.1 == 0 { format!("{base}#{}", key.0) } else { format!("{base}#{}.{}", key.0, key.1) },
                creation_rank: key.0,
                last_fw_use_rank: s.ranks.0,
                first_bw_use_rank: s.ranks.1,
                last_bw_use_rank: s.ranks.2,
                median_mem_size_bytes: median_u64(&mut sizes),
                inactive_time_s: median_f64(&mut inactive).unwrap_or(0.0),
                recomp_time_s,
                recomp_memory_bytes,
            });
        }
    }

    let mut not_derivable = Vec::new();
    if !classify {
        not_derivable.push(
            "node_type, the activation table and the memory breakdown: the source records no tensor storage addresses for operators, so tensors cannot be classified"
                .to_owned(),
        );
    }
    let iterations = spans
        .iter()
        .enumerate()
        .map(|(k, &(index, s, e))| IterationInfo {
            index,
            role: roles[k],
            nodes: iters[k].len(),
            duration_s: e.saturating_sub(s) as f64 * 1e-9,
            peak_allocated_bytes: iter_peak(k),
        })
        .collect();
    Ok(GraphProfile {
        device: device_name,
        iterations,
        reference_iteration: spans[reference].0,
        nodes,
        warmup_nodes,
        sections,
        peak_rank,
        peak_bytes,
        activations,
        breakdown,
        not_derivable,
        warnings,
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
