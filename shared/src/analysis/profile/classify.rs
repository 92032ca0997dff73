//! Tensor classes: ops' tensors matched to blocks, each block given a [`TensorClass`] from what
//! ops did with it, and each node the class of what it produces.

use super::blocks::{Blocks, NO_BLOCK};
use super::iterations::Iterations;
use super::measure::AllocationCurve;
use super::TensorClass;
use crate::model::{EventType, Phase, Trace};
use std::collections::{HashMap, HashSet};

/// A node: its iteration and its rank in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct NodeId {
    pub iteration: usize,
    pub rank: usize,
}

/// What the ops use of one block, for classification.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct BlockUse {
    forward: bool,
    backward_input: bool,
    optimizer: bool,
    optimizer_output: bool,
    accumulate_grad: bool,
}

/// One tensor of an op inside a node, matched to its block.
#[derive(Clone, Copy, Debug)]
pub(super) struct TensorUse {
    pub block: u32,
    pub iteration: u32,
    pub rank: u32,
    pub is_input: bool,
    /// Phase of the op (not of the node).
    pub phase: Phase,
}

/// What ops did with the blocks.
pub(super) struct OpTensors {
    /// Uses by ops inside nodes.
    pub uses: Vec<TensorUse>,
    /// By block index (every block, once `match_tensors` returns).
    pub block_use: Vec<BlockUse>,
    /// Blocks each node writes (outputs of its ops).
    pub node_outputs: HashMap<NodeId, Vec<u32>>,
}

/// Takes the iterations and the blocks; gives what every op did with the blocks its tensors
/// live in (nothing when `classify` is off), adding a block for each storage not seen in the
/// events.
pub(super) fn match_tensors(trace: &Trace, iters: &Iterations, blocks: &mut Blocks, classify: bool) -> OpTensors {
    let mut node_of_op: Vec<Option<NodeId>> = vec![None; trace.ops.len()];
    for (k, ns) in iters.nodes.iter().enumerate() {
        for (r, n) in ns.iter().enumerate() {
            node_of_op[n.op] = Some(NodeId { iteration: k, rank: r });
        }
    }
    let mut uses: Vec<TensorUse> = Vec::new();
    let mut block_use: Vec<BlockUse> = Vec::new();
    let mut node_outputs: HashMap<NodeId, Vec<u32>> = HashMap::new();
    if classify {
        for (i, o) in trace.ops.iter().enumerate() {
            let is_acc = trace.str(o.name).contains("AccumulateGrad");
            let node = iters.root.get(i).and_then(|&r| node_of_op.get(r).copied().flatten());
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
                    if let Some(id) = node {
                        uses.push(TensorUse {
                            block: b,
                            iteration: id.iteration as u32,
                            rank: id.rank as u32,
                            is_input: input,
                            phase: o.phase,
                        });
                        if !input {
                            node_outputs.entry(id).or_default().push(b);
                        }
                    }
                }
            }
        }
    }
    block_use.resize(blocks.blocks.len(), BlockUse::default());
    OpTensors { uses, block_use, node_outputs }
}

/// Takes the blocks and what ops did with them; gives the class of every block.
pub(super) fn classify_blocks(trace: &Trace, iters: &Iterations, blocks: &Blocks, block_use: &[BlockUse]) -> Vec<TensorClass> {
    let has_optimizer = trace.ops.iter().any(|o| o.phase == Phase::Optimizer);
    let first_start = iters.nodes.iter().flatten().map(|n| n.start_ns).min().unwrap_or(0);
    blocks
        .blocks
        .iter()
        .zip(block_use)
        .map(|(b, u)| {
            let pre_existing = b.alloc_ts.is_none_or(|t| t < first_start);
            if pre_existing && u.forward && !b.alloc_layer_is_input && (u.optimizer_output || !has_optimizer) {
                TensorClass::Param
            } else if b.alloc_phase == Phase::Backward && (u.optimizer || u.accumulate_grad) {
                TensorClass::Grad
            } else if (b.alloc_phase == Phase::Optimizer
                && b.alloc_ts.is_some_and(|a| {
                    let k = iters.containing(a);
                    b.free_ts.is_none_or(|f| k.is_none() || iters.containing(f) != k)
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
        .collect()
}

/// Takes the curve and the blocks; gives the blocks each node allocates, in order.
pub(super) fn node_allocs(trace: &Trace, iters: &Iterations, curve: &AllocationCurve, blocks: &Blocks) -> HashMap<NodeId, Vec<u32>> {
    let ev = &trace.events;
    let mut node_allocs: HashMap<NodeId, Vec<u32>> = HashMap::new();
    for &i in &curve.ev_index {
        let b = blocks.event_block[i];
        if b == NO_BLOCK || ev.event_type(i) != EventType::Alloc {
            continue;
        }
        let t = ev.ts_ns[i];
        if let Some(k) = iters.containing(t) {
            if let Some(r) = iters.node_at(k, t) {
                node_allocs.entry(NodeId { iteration: k, rank: r }).or_default().push(b);
            }
        }
    }
    node_allocs
}

/// Everything needed to name the class of what a node produces.
pub(super) struct NodeTypes<'a> {
    pub trace: &'a Trace,
    pub iters: &'a Iterations,
    pub blocks: &'a Blocks,
    pub class: &'a [TensorClass],
    pub node_allocs: &'a HashMap<NodeId, Vec<u32>>,
    pub node_outputs: &'a HashMap<NodeId, Vec<u32>>,
    /// Off where the trace has no tensor references: every node type is `None`.
    pub classify: bool,
}

impl NodeTypes<'_> {
    /// What the node produces: the largest non-OTHER class among the blocks it allocates,
    /// else among the top-level op's own outputs (in-place updates: `add_` on a weight),
    /// else, for a node that allocates nothing, among what its nested ops write (views,
    /// accumulation).
    pub fn of(&self, k: usize, r: usize) -> Option<TensorClass> {
        if !self.classify {
            return None;
        }
        let id = NodeId { iteration: k, rank: r };
        let allocs = self.node_allocs.get(&id).map(Vec::as_slice).unwrap_or(&[]);
        let op = &self.trace.ops[self.iters.nodes[k][r].op];
        let own = self.trace.tensors.get(op.outputs.0 as usize..op.outputs.1 as usize).unwrap_or(&[]);
        let own_blocks: Vec<u32> = own.iter().filter_map(|t| self.blocks.find(t.storage_id, op.end_ns)).collect();
        let nested = self.node_outputs.get(&id).map(Vec::as_slice).unwrap_or(&[]);
        Some(
            self.dominant(&mut allocs.iter().copied())
                .or_else(|| self.dominant(&mut own_blocks.iter().copied()))
                .or_else(|| if allocs.is_empty() { self.dominant(&mut nested.iter().copied()) } else { None })
                .unwrap_or(TensorClass::Other),
        )
    }

    /// The non-OTHER class with the most bytes among distinct blocks, if any.
    fn dominant(&self, list: &mut dyn Iterator<Item = u32>) -> Option<TensorClass> {
        let mut bytes = [0u64; 5];
        let mut seen = HashSet::new();
        let mut any = false;
        for b in list {
            let c = self.class[b as usize];
            if seen.insert(b) && c != TensorClass::Other {
                bytes[c as usize] += self.blocks.blocks[b as usize].size_bytes.max(1);
                any = true;
            }
        }
        any.then(|| TensorClass::ALL.into_iter().max_by_key(|&c| (bytes[c as usize], std::cmp::Reverse(c)))).flatten()
    }
}
