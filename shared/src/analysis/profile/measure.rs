//! The main device's allocated-bytes curve, and what every node does to it: the bytes alive
//! when it starts and its peak while it runs.

use super::iterations::{Iterations, Node};
use super::ProfileError;
use crate::model::Trace;

/// Allocated bytes of the main device after each of its events.
pub(super) struct AllocationCurve {
    /// Time of each point.
    pub ts: Vec<u64>,
    /// Allocated bytes after the event.
    pub alloc: Vec<u64>,
    /// Index in the trace's events of each point.
    pub ev_index: Vec<usize>,
    /// Allocated bytes before the first event.
    pub base_alloc: u64,
}

impl AllocationCurve {
    /// Takes a trace and its main device; gives the device's curve.
    pub fn build(trace: &Trace, device: u8) -> Self {
        let ev = &trace.events;
        let mut ts: Vec<u64> = Vec::new();
        let mut alloc: Vec<u64> = Vec::new();
        let mut ev_index: Vec<usize> = Vec::new();
        let mut cursor = ev.cursor();
        for i in 0..ev.len() {
            let t = cursor.advance();
            if ev.device[i] == device {
                ts.push(ev.ts_ns[i]);
                alloc.push(t.allocated_bytes);
                ev_index.push(i);
            }
        }
        let base_alloc = ev.base_totals.get(device as usize).map_or(0, |t| t.allocated_bytes);
        Self { ts, alloc, ev_index, base_alloc }
    }

    /// Takes a node; gives the bytes before it and its peak.
    fn measure(&self, n: &Node) -> NodeMeasure {
        let a = self.ts.partition_point(|&t| t < n.start_ns);
        let b = self.ts.partition_point(|&t| t <= n.end_ns);
        let active = if a == 0 { self.base_alloc } else { self.alloc[a - 1] };
        let mut peak = (active, a.checked_sub(1));
        for (k, &v) in self.alloc.iter().enumerate().take(b).skip(a) {
            if v > peak.0 {
                peak = (v, Some(k));
            }
        }
        NodeMeasure { active_bytes: active, peak_bytes: peak.0, peak_pos: peak.1 }
    }
}

/// What one node does to the allocated bytes.
#[derive(Clone, Copy, Debug)]
pub(super) struct NodeMeasure {
    /// Allocated bytes just before the node started.
    pub active_bytes: u64,
    /// Highest allocated bytes while it ran (at least `active_bytes`).
    pub peak_bytes: u64,
    /// Position of the peak in the curve; `None`: before every event.
    pub peak_pos: Option<usize>,
}

/// The measures of every node of every iteration.
pub(super) struct Measures {
    /// Same indices as `Iterations::nodes`.
    pub nodes: Vec<Vec<NodeMeasure>>,
}

impl Measures {
    /// Takes the curve and the iterations; gives every node's measure.
    pub fn build(curve: &AllocationCurve, iters: &Iterations) -> Self {
        Self { nodes: iters.nodes.iter().map(|ns| ns.iter().map(|n| curve.measure(n)).collect()).collect() }
    }

    /// Highest node peak of iteration `k`.
    pub fn iteration_peak(&self, k: usize) -> u64 {
        self.nodes[k].iter().map(|m| m.peak_bytes).max().unwrap_or(0)
    }

    /// Takes the steady iterations; gives the reference: the one with the highest peak, the
    /// first among equals.
    pub fn reference(&self, steady: &[usize]) -> Result<usize, ProfileError> {
        steady.iter().max_by_key(|&&k| (self.iteration_peak(k), std::cmp::Reverse(k))).copied().ok_or(ProfileError::NoNodes)
    }
}
