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

mod blocks;
mod breakdown;
mod classify;
mod iterations;
mod liveness;
mod measure;
mod nodes;

use crate::analysis::peak_device;
use crate::model::{Phase, Trace};
use blocks::Blocks;
use classify::{NodeTypes, OpTensors};
use iterations::{Alignment, Iterations};
use liveness::Liveness;
use measure::{AllocationCurve, Measures};
use serde::{Deserialize, Serialize};

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

/// Display name of a node.
fn node_name(trace: &Trace, op: usize) -> &str {
    let n = trace.str(trace.ops[op].name);
    n.strip_prefix(BACKWARD_PREFIX).unwrap_or(n)
}

/// Median of integers, rounded down, without overflow.
fn median_u64(v: &mut [u64]) -> u64 {
    v.sort_unstable();
    match v.len() {
        0 => 0,
        n if n % 2 == 1 => v[n / 2],
        n => v[n / 2 - 1] / 2 + v[n / 2] / 2 + (v[n / 2 - 1] % 2 + v[n / 2] % 2) / 2,
    }
}

/// Computes the [`GraphProfile`] of a trace with operators.
///
/// The stages: nodes by iteration ([`iterations`]), the allocated-bytes curve and each node's
/// measure on it ([`measure`]), blocks ([`blocks`]) and their classes ([`classify`]), node
/// rows ([`nodes`]), the breakdown ([`breakdown`]) and activation liveness ([`liveness`]).
pub fn graph_profile(trace: &Trace) -> Result<GraphProfile, ProfileError> {
    if trace.ops.is_empty() {
        return Err(ProfileError::NoOperators);
    }
    let device = peak_device(trace);
    let device_name = trace.devices.get(device as usize).map_or_else(|| "unknown".to_owned(), |d| d.to_string());
    let iters = Iterations::build(trace)?;
    let curve = AllocationCurve::build(trace, device);
    let Alignment { roles, steady, mut warnings } = iterations::align(trace, &iters)?;
    let measures = Measures::build(&curve, &iters);
    let reference = measures.reference(&steady)?;

    // Blocks and what ops do with them.
    let classify = trace.tensors.iter().any(|t| t.storage_id != 0);
    let mut blocks = Blocks::build(trace, device);
    let OpTensors { uses, block_use, node_outputs } = classify::match_tensors(trace, &iters, &mut blocks, classify);
    let class = classify::classify_blocks(trace, &iters, &blocks, &block_use);
    let node_allocs = classify::node_allocs(trace, &iters, &curve, &blocks);
    let node_types = NodeTypes {
        trace,
        iters: &iters,
        blocks: &blocks,
        class: &class,
        node_allocs: &node_allocs,
        node_outputs: &node_outputs,
        classify,
    };

    let nodes = nodes::node_stats(&iters, &measures, &node_types, &steady, reference, &device_name);
    let n_iter = iters.nodes.len();
    let warmup_nodes = if n_iter >= 2 && !iters.nodes[0].is_empty() {
        nodes::node_stats(&iters, &measures, &node_types, &[0], 0, &device_name)
    } else {
        Vec::new()
    };
    let sections = nodes::sections(&nodes);
    let peak = nodes::peak_rank(&nodes);

    let mut breakdown = Vec::new();
    let mut activations = Vec::new();
    let mut not_derivable = Vec::new();
    if classify {
        breakdown = breakdown::breakdown(trace, &curve, &blocks, &class, &measures.nodes[reference]);
        warnings.extend(breakdown::mismatch_warning(&breakdown));
        let liveness = Liveness { iters: &iters, blocks: &blocks, class: &class, node_allocs: &node_allocs, nodes: &nodes, reference };
        activations = liveness.activations(uses, &steady);
    } else {
        not_derivable.push(
            "node_type, the activation table and the memory breakdown: the source records no tensor storage addresses for operators, so tensors cannot be classified"
                .to_owned(),
        );
    }
    let iterations = iters
        .spans
        .iter()
        .enumerate()
        .map(|(k, span)| IterationInfo {
            index: span.index,
            role: roles[k],
            nodes: iters.nodes[k].len(),
            duration_s: span.end_ns.saturating_sub(span.start_ns) as f64 * 1e-9,
            peak_allocated_bytes: measures.iteration_peak(k),
        })
        .collect();
    Ok(GraphProfile {
        device: device_name,
        iterations,
        reference_iteration: iters.spans[reference].index,
        nodes,
        warmup_nodes,
        sections,
        peak_rank: peak.rank,
        peak_bytes: peak.bytes,
        activations,
        breakdown,
        not_derivable,
        warnings,
    })
}
