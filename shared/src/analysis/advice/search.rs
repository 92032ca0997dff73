//! The greedy search for the modules to checkpoint: the replayed curve as a range-add max tree,
//! each candidate's removal windows and recomputation transients, and the steps that lower the
//! peak most per second of recomputation.

use super::curve::{Block, Curve, Range};

/// A range-add, max tree over leaves (recursive, lazy: a node's max includes its own pending
/// add; a leaf's value is its max plus its ancestors' pending adds).
pub(super) struct MaxTree {
    pub(super) size: usize,
    pub(super) mx: Vec<i64>,
    pub(super) lz: Vec<i64>,
}

impl MaxTree {
    pub(super) fn new(leaves: &[i64]) -> Self {
        let size = leaves.len().max(1).next_power_of_two();
        let mut mx = vec![NEG; 2 * size];
        mx[size..size + leaves.len()].copy_from_slice(leaves);
        for i in (1..size).rev() {
            mx[i] = mx[2 * i].max(mx[2 * i + 1]);
        }
        Self { size, mx, lz: vec![0; 2 * size] }
    }

    pub(super) fn add(&mut self, l: usize, r: usize, v: i64) {
        if l < r {
            self.add_at(1, 0, self.size, l, r, v);
        }
    }

    pub(super) fn add_at(&mut self, node: usize, nl: usize, nr: usize, l: usize, r: usize, v: i64) {
        if r <= nl || nr <= l {
            return;
        }
        if l <= nl && nr <= r {
            self.mx[node] += v;
            self.lz[node] += v;
            return;
        }
        let mid = (nl + nr) / 2;
        self.add_at(2 * node, nl, mid, l, r, v);
        self.add_at(2 * node + 1, mid, nr, l, r, v);
        self.mx[node] = self.mx[2 * node].max(self.mx[2 * node + 1]) + self.lz[node];
    }

    /// The highest leaf value and its (leftmost) leaf.
    pub(super) fn top(&self) -> (i64, usize) {
        let mut node = 1;
        while node < self.size {
            let target = self.mx[node] - self.lz[node];
            node = if self.mx[2 * node] == target { 2 * node } else { 2 * node + 1 };
        }
        (self.mx[1], node - self.size)
    }

    /// Adds pending on the path to a leaf, excluding the leaf's own value.
    pub(super) fn pending(&self, leaf: usize) -> i64 {
        let mut node = leaf + self.size;
        let mut acc = 0;
        while node > 1 {
            node /= 2;
            acc += self.lz[node];
        }
        acc
    }
}

pub(super) const NEG: i64 = i64::MIN / 4;

/// A candidate in one scenario: its removal windows and recomputation transients on the
/// quarter-position axis (event `j` at `4j`, the moment before event `j` at `4j − 2`).
pub(super) struct ScenarioCandidate {
    /// `[lo, hi)` in quarter positions, bytes removed.
    pub(super) windows: Vec<(u64, u64, i64)>,
    /// (quarter position, value before the windows: the level before the backward plus the
    /// forward working set).
    pub(super) spikes: Vec<(u64, i64)>,
    pub(super) working_set_max: i64,
}

/// The greedy search's state: the replayed curve as a max tree over segments between window
/// boundaries.
pub(super) struct Engine {
    pub(super) cuts: Vec<u64>,
    pub(super) tree: MaxTree,
    /// Position of the highest event of each leaf.
    pub(super) leaf_event: Vec<Option<usize>>,
    pub(super) base: i64,
    pub(super) cands: Vec<ScenarioCandidate>,
    pub(super) active: Vec<bool>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum PeakAt {
    Base,
    Event(usize),
    /// The recomputation of candidate `c`.
    Recompute(usize, u64),
}

impl PeakAt {
    pub(super) fn quarter(self) -> Option<u64> {
        match self {
            PeakAt::Base => None,
            PeakAt::Event(p) => Some(4 * p as u64),
            PeakAt::Recompute(_, q) => Some(q),
        }
    }
}

impl Engine {
    pub(super) fn new(c: &Curve, curve: &[i64], cands: Vec<ScenarioCandidate>) -> Self {
        let mut cuts: Vec<u64> = Vec::new();
        for sc in &cands {
            for &(lo, hi, _) in &sc.windows {
                cuts.push(lo);
                cuts.push(hi);
            }
            for &(q, _) in &sc.spikes {
                cuts.push(q);
                cuts.push(q + 1);
            }
        }
        cuts.sort_unstable();
        cuts.dedup();
        let n = cuts.len() + 1;
        let mut leaves = vec![NEG; n];
        let mut leaf_event = vec![None; n];
        let mut leaf = 0;
        for (j, &v) in curve.iter().enumerate() {
            let q = 4 * j as u64;
            while leaf < cuts.len() && cuts[leaf] <= q {
                leaf += 1;
            }
            if v > leaves[leaf] {
                leaves[leaf] = v;
                leaf_event[leaf] = Some(j);
            }
        }
        Self { tree: MaxTree::new(&leaves), cuts, leaf_event, base: c.base_alloc as i64, active: vec![false; cands.len()], cands }
    }

    pub(super) fn leaf_of(&self, q: u64) -> usize {
        self.cuts.partition_point(|&c| c <= q)
    }

    pub(super) fn set(&mut self, k: usize, on: bool) {
        if self.active[k] == on {
            return;
        }
        self.active[k] = on;
        let sign = if on { -1 } else { 1 };
        for w in 0..self.cands[k].windows.len() {
            let (lo, hi, bytes) = self.cands[k].windows[w];
            let (l, r) = (self.leaf_of(lo), self.leaf_of(hi));
            self.tree.add(l, r, sign * bytes);
        }
    }

    pub(super) fn eval(&self) -> (i64, PeakAt) {
        let (mut best, leaf) = self.tree.top();
        let mut at = match self.leaf_event.get(leaf).copied().flatten() {
            Some(p) if best > NEG / 2 => PeakAt::Event(p),
            _ => {
                best = NEG;
                PeakAt::Base
            }
        };
        for (k, sc) in self.cands.iter().enumerate() {
            if !self.active[k] {
                continue;
            }
            for &(q, v) in &sc.spikes {
                let leaf = self.leaf_of(q);
                // The spike's leaf holds no event, so its value is NEG plus the windows over it.
                let windows = self.tree.mx[leaf + self.tree.size] - NEG + self.tree.pending(leaf);
                let value = v + windows;
                if value > best {
                    best = value;
                    at = PeakAt::Recompute(k, q);
                }
            }
        }
        if self.base >= best {
            (self.base, PeakAt::Base)
        } else {
            (best, at)
        }
    }

    pub(super) fn bytes_at(&self, k: usize, q: u64) -> i64 {
        self.cands[k].windows.iter().filter(|w| w.0 <= q && q < w.1).map(|w| w.2).sum()
    }
}

/// The candidates of a scenario: `curve` is the replayed curve without checkpoints, `size`
/// each block's size in it.
/// `copies` are allocations the replay adds (autocast's saved casts): those a module's forward
/// makes and keeps past it are dropped with its activations.
pub(super) fn scenario(
    c: &Curve,
    defs: &[CandidateDef],
    curve: &[i64],
    size: &dyn Fn(&Block) -> u64,
    copies: &[Range],
) -> Vec<ScenarioCandidate> {
    defs.iter()
        .map(|d| {
            let mut windows = Vec::new();
            let mut spikes = Vec::new();
            let mut working_set_max = 0;
            for call in &d.calls {
                let before = if call.first == 0 { c.base_alloc as i64 } else { curve[call.first - 1] };
                let top = curve[call.first..call.end.max(call.first)].iter().copied().max().unwrap_or(before);
                let working_set = (top - before).max(0);
                working_set_max = working_set_max.max(working_set);
                if call.dropped.is_empty() || call.end == 0 {
                    continue;
                }
                let last_fwd = (call.end - 1) as u64;
                for &b in &call.dropped {
                    let bl = &c.blocks[b as usize];
                    let stop = bl.free_pos.map_or(call.backward_pos, |f| f.min(call.backward_pos)) as u64;
                    let (lo, hi) = (4 * last_fwd + 1, (4 * stop).saturating_sub(1));
                    if lo < hi {
                        windows.push((lo, hi, size(bl) as i64));
                    }
                }
                for &(_, to, bytes) in copies.iter().filter(|r| r.0 >= call.first && r.0 < call.end && r.1 > call.end) {
                    let (lo, hi) = (4 * last_fwd + 1, (4 * to.min(call.backward_pos) as u64).saturating_sub(1));
                    if lo < hi {
                        windows.push((lo, hi, bytes));
                    }
                }
                let level = if call.backward_pos == 0 { c.base_alloc as i64 } else { curve[call.backward_pos - 1] };
                spikes.push(((4 * call.backward_pos as u64).saturating_sub(2), level + working_set));
            }
            ScenarioCandidate { windows, spikes, working_set_max }
        })
        .collect()
}

/// One step of the greedy search.
#[derive(Clone, Debug)]
pub(super) struct Step {
    pub(super) chosen: Vec<usize>,
    pub(super) peak: u64,
    pub(super) at: PeakAt,
}

/// Greedy: at the current peak, the candidate saving the most bytes there per second of
/// recomputation, if the replayed peak goes down by at least `min_gain` bytes; until `budget`
/// is met or nothing helps.
pub(super) fn greedy(engine: &mut Engine, times: &[f64], budget: Option<u64>, min_gain: u64) -> Vec<Step> {
    let (p0, at0) = engine.eval();
    let mut steps = vec![Step { chosen: Vec::new(), peak: p0.max(0) as u64, at: at0 }];
    while let Some(cur) = steps.last().cloned() {
        if budget.is_some_and(|b| cur.peak <= b) {
            break;
        }
        let Some(q) = cur.at.quarter() else { break };
        let mut ranked: Vec<(f64, usize)> = (0..engine.cands.len())
            .filter(|&k| !engine.active[k])
            .filter_map(|k| {
                let bytes = engine.bytes_at(k, q);
                (bytes > 0).then(|| (bytes as f64 / times[k].max(1e-9), k))
            })
            .collect();
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut accepted = None;
        for &(_, k) in &ranked {
            engine.set(k, true);
            let (p, at) = engine.eval();
            let p = p.max(0) as u64;
            if p.saturating_add(min_gain) <= cur.peak {
                accepted = Some((k, p, at));
                break;
            }
            engine.set(k, false);
        }
        let Some((k, peak, at)) = accepted else { break };
        let mut chosen = cur.chosen.clone();
        chosen.push(k);
        steps.push(Step { chosen, peak, at });
    }
    steps
}

/// One forward call of a candidate module and what its checkpoint changes.
#[derive(Clone, Debug)]
pub(super) struct Call {
    /// Positions of the forward: `[first, end)`.
    pub(super) first: usize,
    pub(super) end: usize,
    /// Position of the first event of the module's backward.
    pub(super) backward_pos: usize,
    /// Blocks dropped from the forward's end to the backward's start.
    pub(super) dropped: Vec<u32>,
    pub(super) iteration: Option<u32>,
    pub(super) forward_ns: u64,
}

#[derive(Clone, Debug)]
pub(super) struct CandidateDef {
    pub(super) path: String,
    pub(super) calls: Vec<Call>,
    pub(super) first_start_ns: u64,
}
