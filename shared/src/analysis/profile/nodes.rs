//! Node statistics: each rank reduced to medians over aligned iterations, the sections
//! (forward, backward, optimizer) by rank, and the peak rank.

use super::classify::NodeTypes;
use super::iterations::Iterations;
use super::measure::Measures;
use super::{median_u64, node_name, NodeStats, Sections};
use crate::analysis::median_f64;
use crate::model::Phase;

/// Takes aligned iterations `its` (same node sequence) and the one that names the nodes;
/// gives one row per rank with medians over `its`.
pub(super) fn node_stats(
    iters: &Iterations,
    measures: &Measures,
    node_types: &NodeTypes,
    its: &[usize],
    reference: usize,
    device_name: &str,
) -> Vec<NodeStats> {
    let trace = node_types.trace;
    iters.nodes[reference]
        .iter()
        .enumerate()
        .map(|(r, n)| {
            let mut times: Vec<f64> = its.iter().map(|&k| (iters.nodes[k][r].end_ns - iters.nodes[k][r].start_ns) as f64 * 1e-9).collect();
            let mut peaks: Vec<u64> = its.iter().map(|&k| measures.nodes[k][r].peak_bytes).collect();
            let mut actives: Vec<u64> = its.iter().map(|&k| measures.nodes[k][r].active_bytes).collect();
            NodeStats {
                rank: r,
                node_name: node_name(trace, n.op).to_owned(),
                node_type: node_types.of(reference, r),
                gtype: n.phase,
                layer: trace.opt_str(trace.ops[n.op].layer).unwrap_or("").to_owned(),
                median_run_time_s: median_f64(&mut times).unwrap_or(0.0),
                median_peak_mem_bytes: median_u64(&mut peaks),
                median_active_mem_bytes: median_u64(&mut actives),
                device: device_name.to_owned(),
            }
        })
        .collect()
}

/// Takes the node rows; gives the rank where each part of the iteration begins.
pub(super) fn sections(nodes: &[NodeStats]) -> Sections {
    let mut sections = Sections::default();
    for n in nodes {
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
    sections
}

/// The rank with the highest median peak.
pub(super) struct PeakRank {
    pub rank: usize,
    pub bytes: u64,
}

/// Takes the node rows; gives the highest median peak, the first rank among equals.
pub(super) fn peak_rank(nodes: &[NodeStats]) -> PeakRank {
    let (rank, bytes) =
        nodes.iter().map(|n| (n.rank, n.median_peak_mem_bytes)).max_by_key(|&(r, b)| (b, std::cmp::Reverse(r))).unwrap_or((0, 0));
    PeakRank { rank, bytes }
}
