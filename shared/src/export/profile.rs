//! The graph profile ([`crate::analysis::profile`]) as CSV: node statistics per rank,
//! activation liveness and the memory breakdown per rank. Headers are fixed (other tools read
//! these files by column name); every cell is filled and every number is finite.

use super::csv::{field, write_rows};
use super::ExportError;
use crate::analysis::profile::{ActivationStats, BreakdownRow, NodeStats};
use std::io::Write;

pub const NODE_STATS_HEADER: &str = "rank,node_name,node_type,gtype,median_run_time_s,median_peak_mem_bytes,median_active_mem_bytes,device";
pub const ACTIVATION_STATS_HEADER: &str = "activation_name,creation_rank,last_fw_use_rank,first_bw_use_rank,last_bw_use_rank,median_mem_size_bytes,inactive_time_s,recomp_time_s,recomp_memory_bytes";
pub const MEMORY_BREAKDOWN_HEADER: &str = "rank,weights,gradients,activations,optimizer_state,other,total_allocated";

/// Written as `node_type` where the source cannot classify tensors.
pub const UNKNOWN_NODE_TYPE: &str = "UNKNOWN";

/// Seconds with nanosecond resolution; never NaN (the profile only holds finite times).
fn secs(s: f64) -> String {
    if s.is_finite() {
        format!("{s:.9}")
    } else {
        "0.000000000".to_owned()
    }
}

pub fn write_node_stats(nodes: &[NodeStats], out: impl Write) -> Result<(), ExportError> {
    write_rows(out, NODE_STATS_HEADER, nodes, |w, n| {
        write!(
            w,
            "{},{},{},{},{},{},{},{}",
            n.rank,
            field(&n.node_name),
            n.node_type.map_or(UNKNOWN_NODE_TYPE, |t| t.as_str()),
            n.gtype.as_str(),
            secs(n.median_run_time_s),
            n.median_peak_mem_bytes,
            n.median_active_mem_bytes,
            field(&n.device)
        )
    })
}

pub fn write_activation_stats(acts: &[ActivationStats], out: impl Write) -> Result<(), ExportError> {
    write_rows(out, ACTIVATION_STATS_HEADER, acts, |w, a| {
        write!(
            w,
            "{},{},{},{},{},{},{},{},{}",
            field(&a.activation_name),
            a.creation_rank,
            a.last_fw_use_rank,
            a.first_bw_use_rank,
            a.last_bw_use_rank,
            a.median_mem_size_bytes,
            secs(a.inactive_time_s),
            secs(a.recomp_time_s),
            a.recomp_memory_bytes
        )
    })
}

pub fn write_memory_breakdown(rows: &[BreakdownRow], out: impl Write) -> Result<(), ExportError> {
    write_rows(out, MEMORY_BREAKDOWN_HEADER, rows, |w, r| {
        write!(w, "{},{},{},{},{},{},{}", r.rank, r.weights, r.gradients, r.activations, r.optimizer_state, r.other, r.total_allocated)
    })
}
