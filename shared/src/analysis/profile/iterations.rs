//! The nodes of a profile: top-level ops grouped into iterations, and the choice of the steady
//! iterations (those running the most common node sequence) that are aligned rank by rank.

use super::{node_name, IterationRole, ProfileError};
use crate::model::{IterationSpan, Phase, Trace};
use std::collections::HashMap;

/// One node of one iteration.
#[derive(Clone, Debug)]
pub(super) struct Node {
    pub op: usize,
    pub start_ns: u64,
    pub end_ns: u64,
    pub phase: Phase,
}

/// Which ops are top-level.
struct TopLevel {
    /// Top-level ops, by start time.
    tops: Vec<usize>,
    /// For every op, the index of its top-level ancestor (itself for a top-level op).
    root: Vec<usize>,
}

/// The nodes of every iteration.
pub(super) struct Iterations {
    pub spans: Vec<IterationSpan>,
    /// Nodes of each iteration (same index as `spans`), in start order.
    pub nodes: Vec<Vec<Node>>,
    /// For every op, the index of its top-level ancestor.
    pub root: Vec<usize>,
}

impl Iterations {
    /// Takes a trace with operators; gives its iterations with their nodes, or `NoNodes` when
    /// no iteration holds a top-level op.
    pub fn build(trace: &Trace) -> Result<Self, ProfileError> {
        let TopLevel { tops, root } = top_level(trace);
        let spans = iteration_spans(trace);
        let nodes: Vec<Vec<Node>> = spans
            .iter()
            .map(|span| {
                tops.iter()
                    .filter(|&&i| trace.ops[i].start_ns >= span.start_ns && trace.ops[i].start_ns <= span.end_ns)
                    .map(|&i| Node {
                        op: i,
                        start_ns: trace.ops[i].start_ns,
                        end_ns: trace.ops[i].end_ns.max(trace.ops[i].start_ns),
                        phase: trace.ops[i].phase,
                    })
                    .collect()
            })
            .collect();
        if nodes.iter().all(Vec::is_empty) {
            return Err(ProfileError::NoNodes);
        }
        Ok(Self { spans, nodes, root })
    }

    /// The first iteration whose span holds `t`.
    pub fn containing(&self, t: u64) -> Option<usize> {
        self.spans.iter().position(|s| t >= s.start_ns && t <= s.end_ns)
    }

    /// The rank of the node of iteration `k` running at `t`.
    pub fn node_at(&self, k: usize, t: u64) -> Option<usize> {
        let ns = &self.nodes[k];
        let p = ns.partition_point(|n| n.start_ns <= t);
        (p > 0 && t <= ns[p - 1].end_ns).then(|| p - 1)
    }
}

/// Top-level ops and, for every op, the index of its top-level ancestor.
fn top_level(trace: &Trace) -> TopLevel {
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
    TopLevel { tops, root }
}

/// The iterations a profile aligns: those the trace recorded (marks, profiler steps), else the
/// whole trace as one. Spans inferred from optimizer scopes or allocations are not taken: a
/// profile's iterations group operators, which such spans may cut in the middle.
fn iteration_spans(trace: &Trace) -> Vec<IterationSpan> {
    let found = crate::analysis::iterations::spans(trace);
    if found.from.is_recorded() {
        return found.spans;
    }
    let start_ns = trace.ops.iter().map(|o| o.start_ns).min().unwrap_or(0);
    let end_ns = trace.ops.iter().map(|o| o.end_ns).max().unwrap_or(0);
    vec![IterationSpan { index: 0, start_ns, end_ns }]
}

/// The role of every iteration.
pub(super) struct Alignment {
    /// Role of each iteration (same index as `Iterations::spans`).
    pub roles: Vec<IterationRole>,
    /// The steady iterations, in order.
    pub steady: Vec<usize>,
    /// One line per iteration left out of the medians.
    pub warnings: Vec<String>,
}

/// Takes the iterations; gives their roles: iteration 0 warms up when there are several, and
/// the steady ones are those running the most common node sequence (`NoNodes` when every
/// candidate is empty).
pub(super) fn align(trace: &Trace, iters: &Iterations) -> Result<Alignment, ProfileError> {
    let n_iter = iters.nodes.len();
    let names: Vec<Vec<&str>> = iters.nodes.iter().map(|ns| ns.iter().map(|n| node_name(trace, n.op)).collect()).collect();
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
                iters.spans[k].index,
                names[k].len(),
                seq_count.get(common.as_slice()).copied().unwrap_or(0),
                common.len()
            ));
        }
    }
    Ok(Alignment { roles, steady, warnings })
}
