//! Activation liveness: when each activation is last used in forward and first and last used
//! in backward, how long it idles in between, and what recomputing it would cost.

use super::blocks::Blocks;
use super::classify::{NodeId, TensorUse};
use super::iterations::Iterations;
use super::{median_u64, ActivationStats, NodeStats, TensorClass};
use crate::analysis::median_f64;
use crate::model::Phase;
use std::collections::{BTreeSet, HashMap};

/// An activation, the same in every aligned iteration: the rank that creates it and its
/// ordinal among that node's activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct ActivationKey {
    creation_rank: usize,
    ordinal: usize,
}

/// An activation as one iteration saw it.
struct SeenActivation {
    size_bytes: u64,
    inactive_s: f64,
    last_fw_rank: usize,
    first_bw_rank: usize,
    last_bw_rank: usize,
    block: u32,
}

/// What rebuilding an activation costs.
struct Recomputation {
    time_s: f64,
    memory_bytes: u64,
}

/// The classified blocks and node rows the liveness stage reads.
pub(super) struct Liveness<'a> {
    pub iters: &'a Iterations,
    pub blocks: &'a Blocks,
    pub class: &'a [TensorClass],
    pub node_allocs: &'a HashMap<NodeId, Vec<u32>>,
    /// Rows of the reference iteration.
    pub nodes: &'a [NodeStats],
    pub reference: usize,
}

impl Liveness<'_> {
    /// Takes the tensor uses and the steady iterations; gives one row per activation of the
    /// reference iteration, with sizes and idle times as medians over the steady iterations.
    pub fn activations(&self, mut uses: Vec<TensorUse>, steady: &[usize]) -> Vec<ActivationStats> {
        uses.sort_unstable_by_key(|u| (u.block, u.iteration, u.rank));
        let per_iter: Vec<HashMap<ActivationKey, SeenActivation>> = steady.iter().map(|&k| self.observe(k, &uses)).collect();
        let ref_pos = steady.iter().position(|&k| k == self.reference).unwrap_or(0);
        let mut keys: Vec<ActivationKey> = per_iter[ref_pos].keys().copied().collect();
        keys.sort_unstable();
        // Forward nodes' input blocks, for recomputation.
        let mut node_inputs: HashMap<usize, Vec<u32>> = HashMap::new();
        for u in &uses {
            if u.iteration as usize == self.reference && u.is_input && u.phase == Phase::Forward {
                node_inputs.entry(u.rank as usize).or_default().push(u.block);
            }
        }
        let mut activations = Vec::new();
        for key in keys {
            let s = &per_iter[ref_pos][&key];
            let mut sizes: Vec<u64> = per_iter.iter().filter_map(|m| m.get(&key)).map(|x| x.size_bytes).collect();
            let mut inactive: Vec<f64> = per_iter.iter().filter_map(|m| m.get(&key)).map(|x| x.inactive_s).collect();
            let recomp = self.recompute(key, s, &node_inputs);
            let n = &self.nodes[key.creation_rank];
            let base = if n.layer.is_empty() { n.node_name.clone() } else { format!("{}:{}", n.layer, n.node_name) };
            activations.push(ActivationStats {
                activation_name: if key.ordinal == 0 {
                    format!("{base}#{}", key.creation_rank)
                } else {
                    format!("{base}#{}.{}", key.creation_rank, key.ordinal)
                },
                creation_rank: key.creation_rank,
                last_fw_use_rank: s.last_fw_rank,
                first_bw_use_rank: s.first_bw_rank,
                last_bw_use_rank: s.last_bw_rank,
                median_mem_size_bytes: median_u64(&mut sizes),
                inactive_time_s: median_f64(&mut inactive).unwrap_or(0.0),
                recomp_time_s: recomp.time_s,
                recomp_memory_bytes: recomp.memory_bytes,
            });
        }
        activations
    }

    /// Takes iteration `k` and the uses sorted by block; gives the activations its nodes
    /// create that backward reads.
    fn observe(&self, k: usize, uses: &[TensorUse]) -> HashMap<ActivationKey, SeenActivation> {
        let nodes = &self.iters.nodes[k];
        let mut map = HashMap::new();
        for r in 0..nodes.len() {
            let Some(allocs) = self.node_allocs.get(&NodeId { iteration: k, rank: r }) else { continue };
            let mut ordinal = 0;
            for &b in allocs {
                if self.class[b as usize] != TensorClass::Act {
                    continue;
                }
                let in_iter = uses_of(uses, b).iter().filter(|u| u.iteration as usize == k);
                let last_fw = in_iter.clone().filter(|u| u.phase == Phase::Forward).map(|u| u.rank as usize).max().unwrap_or(r).max(r);
                let bw: Vec<usize> = in_iter.filter(|u| u.phase == Phase::Backward && u.is_input).map(|u| u.rank as usize).collect();
                let (Some(&first_bw), Some(&last_bw)) = (bw.iter().min(), bw.iter().max()) else {
                    continue;
                };
                let inactive_ns = nodes[first_bw].start_ns.saturating_sub(nodes[last_fw].end_ns);
                map.insert(
                    ActivationKey { creation_rank: r, ordinal },
                    SeenActivation {
                        size_bytes: self.blocks.blocks[b as usize].size_bytes,
                        inactive_s: inactive_ns as f64 * 1e-9,
                        last_fw_rank: last_fw,
                        first_bw_rank: first_bw,
                        last_bw_rank: last_bw,
                        block: b,
                    },
                );
                ordinal += 1;
            }
        }
        map
    }

    /// Takes an activation of the reference iteration; gives the cost of the forward nodes
    /// that rebuild it from what is alive at its first backward use.
    fn recompute(&self, key: ActivationKey, s: &SeenActivation, node_inputs: &HashMap<usize, Vec<u32>>) -> Recomputation {
        let blocks = &self.blocks.blocks;
        let when = self.iters.nodes[self.reference][s.first_bw_rank].start_ns;
        let alive = |b: u32| {
            let bl = &blocks[b as usize];
            bl.alloc_ts.is_none_or(|a| a <= when) && bl.free_ts.is_none_or(|f| f >= when)
        };
        let creator = |b: u32| -> Option<usize> {
            let t = blocks[b as usize].alloc_ts?;
            if blocks[b as usize].alloc_phase != Phase::Forward {
                return None;
            }
            self.iters.node_at(self.reference, t)
        };
        let mut todo = vec![key.creation_rank];
        let mut set = BTreeSet::new();
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
        let time_s = set.iter().map(|&r| self.nodes[r].median_run_time_s).sum();
        let memory_bytes = set
            .iter()
            .flat_map(|&r| self.node_allocs.get(&NodeId { iteration: self.reference, rank: r }).map(Vec::as_slice).unwrap_or(&[]))
            .map(|&b| blocks[b as usize].size_bytes)
            .sum();
        Recomputation { time_s, memory_bytes }
    }
}

/// The uses of block `b`, from uses sorted by block.
fn uses_of(uses: &[TensorUse], b: u32) -> &[TensorUse] {
    let s = uses.partition_point(|u| u.block < b);
    let e = uses.partition_point(|u| u.block <= b);
    &uses[s..e]
}
