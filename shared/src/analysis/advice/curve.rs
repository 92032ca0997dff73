//! The analysed device's allocated-memory curve that every prediction replays: its events as
//! positions, the totals after each, and each allocation as a block from its alloc to its free.

use crate::hash::FastMap;
use crate::model::{EventType, Phase, Trace};

pub(super) const NO_BLOCK: u32 = u32::MAX;
/// Bytes added over the positions `[from, to)` of a replay.
pub(super) type Range = (usize, usize, i64);

/// One allocation on the analysed device, from its alloc event to its free event.
#[derive(Clone, Debug)]
pub(super) struct Block {
    pub(super) alloc_pos: usize,
    /// `None`: alive at the trace's end.
    pub(super) free_pos: Option<usize>,
    pub(super) size_bytes: u64,
    pub(super) address: u64,
}

/// The analysed device's events as positions, with the totals after each and the blocks.
pub(super) struct Curve<'a> {
    pub(super) trace: &'a Trace,
    /// Global event index of each position.
    pub(super) event: Vec<usize>,
    pub(super) ts: Vec<u64>,
    pub(super) alloc: Vec<u64>,
    pub(super) reserved: Vec<u64>,
    pub(super) phase: Vec<Phase>,
    /// Iteration of each position.
    pub(super) iteration: Vec<Option<u32>>,
    pub(super) base_alloc: u64,
    pub(super) base_reserved: u64,
    pub(super) blocks: Vec<Block>,
    /// Block allocated at each position (`NO_BLOCK` elsewhere).
    pub(super) block_at: Vec<u32>,
    pub(super) spans: Vec<(u64, u64)>,
    /// First and last position of each phase (indexed as `Phase as usize`) in each iteration.
    pub(super) phase_bounds: Vec<[Option<(usize, usize)>; 4]>,
}

impl<'a> Curve<'a> {
    pub(super) fn build(trace: &'a Trace, device: u8) -> Self {
        let ev = &trace.events;
        let spans = crate::analysis::iterations::spans(trace).bounds();
        let mut c = Curve {
            trace,
            event: Vec::new(),
            ts: Vec::new(),
            alloc: Vec::new(),
            reserved: Vec::new(),
            phase: Vec::new(),
            iteration: Vec::new(),
            base_alloc: ev.base_totals.get(device as usize).map_or(0, |t| t.allocated_bytes),
            base_reserved: ev.base_totals.get(device as usize).map_or(0, |t| t.reserved_bytes),
            blocks: Vec::new(),
            block_at: Vec::new(),
            phase_bounds: vec![[None; 4]; spans.len()],
            spans,
        };
        let mut open: FastMap<u64, u32> = FastMap::default();
        let mut cursor = ev.cursor();
        for i in 0..ev.len() {
            let t = cursor.advance();
            if ev.device[i] != device {
                continue;
            }
            let pos = c.event.len();
            let ts = ev.ts_ns[i];
            c.event.push(i);
            c.ts.push(ts);
            c.alloc.push(t.allocated_bytes);
            c.reserved.push(t.reserved_bytes);
            c.phase.push(ev.phase(i));
            let k = span_of(&c.spans, ts);
            c.iteration.push(k);
            if let Some(slot) = k.and_then(|k| c.phase_bounds.get_mut(k as usize)) {
                let b = &mut slot[ev.phase(i) as usize];
                *b = Some(b.map_or((pos, pos), |(f, _)| (f, pos)));
            }
            let mut at = NO_BLOCK;
            match ev.event_type(i) {
                EventType::Alloc => {
                    at = c.blocks.len() as u32;
                    c.blocks.push(Block { alloc_pos: pos, free_pos: None, size_bytes: ev.size_bytes[i], address: ev.address[i] });
                    // A second alloc at an open address means its free was lost: close it here.
                    if let Some(old) = open.insert(ev.address[i], at) {
                        c.blocks[old as usize].free_pos.get_or_insert(pos);
                    }
                }
                EventType::Free => {
                    if let Some(b) = open.remove(&ev.address[i]) {
                        c.blocks[b as usize].free_pos = Some(pos);
                    }
                }
                _ => {}
            }
            c.block_at.push(at);
        }
        c
    }

    pub(super) fn len(&self) -> usize {
        self.ts.len()
    }

    pub(super) fn alloc_phase(&self, b: &Block) -> Phase {
        self.phase[b.alloc_pos]
    }

    pub(super) fn free_phase(&self, b: &Block) -> Option<Phase> {
        b.free_pos.map(|p| self.phase[p])
    }

    /// Allocated in a forward and freed in the backward of the same iteration.
    pub(super) fn is_activation(&self, b: &Block) -> bool {
        self.alloc_phase(b) == Phase::Forward
            && self.free_phase(b) == Some(Phase::Backward)
            && b.free_pos.is_some_and(|f| self.iteration[f] == self.iteration[b.alloc_pos])
    }

    /// Allocated and freed within the forward and backward of one iteration: what scales with
    /// the batch.
    pub(super) fn is_batch_dependent(&self, b: &Block) -> bool {
        let fb = |p: Phase| matches!(p, Phase::Forward | Phase::Backward);
        fb(self.alloc_phase(b))
            && self.free_phase(b).is_some_and(fb)
            && b.free_pos.is_some_and(|f| self.iteration[f] == self.iteration[b.alloc_pos])
    }

    /// Allocated by the optimizer and alive past its iteration (never freed, where the trace
    /// has no iterations).
    pub(super) fn is_optimizer_state(&self, b: &Block) -> bool {
        if self.alloc_phase(b) != Phase::Optimizer {
            return false;
        }
        match (b.free_pos, self.iteration[b.alloc_pos]) {
            (None, _) => true,
            (Some(f), Some(k)) => self.iteration[f] != Some(k),
            (Some(_), None) => false,
        }
    }

    /// First and last position of `phase` in iteration `k`.
    pub(super) fn bounds(&self, k: usize, phase: Phase) -> Option<(usize, usize)> {
        self.phase_bounds.get(k).and_then(|b| b[phase as usize])
    }

    /// Allocated in a backward and outliving it (parameter gradients).
    pub(super) fn is_gradient(&self, b: &Block) -> bool {
        self.alloc_phase(b) == Phase::Backward && self.free_phase(b) != Some(Phase::Backward)
    }

    pub(super) fn alive_at(&self, b: &Block, pos: usize) -> bool {
        b.alloc_pos <= pos && b.free_pos.is_none_or(|f| f > pos)
    }

    /// The measured allocated curve with blocks resized (`new_size`: `None` keeps a block) and
    /// `extra` bytes added over position ranges `[from, to)`.
    pub(super) fn replay(&self, new_size: &dyn Fn(&Block) -> Option<u64>, extra: &[Range]) -> Vec<i64> {
        let n = self.len();
        let mut diff = vec![0i64; n + 1];
        for b in &self.blocks {
            if let Some(s) = new_size(b) {
                let d = clamp_i64(s as i128 - b.size_bytes as i128);
                diff[b.alloc_pos] = diff[b.alloc_pos].saturating_add(d);
                let end = b.free_pos.unwrap_or(n);
                diff[end] = diff[end].saturating_sub(d);
            }
        }
        for &(from, to, v) in extra {
            if from < to && to <= n {
                diff[from] = diff[from].saturating_add(v);
                diff[to] = diff[to].saturating_sub(v);
            }
        }
        let mut run = 0i64;
        (0..n)
            .map(|j| {
                run = run.saturating_add(diff[j]);
                clamp_i64(self.alloc[j] as i128 + run as i128)
            })
            .collect()
    }

    /// Highest value of a replayed curve (or the base) and its position.
    pub(super) fn peak_of(&self, curve: &[i64]) -> (u64, Option<usize>) {
        let mut best = (self.base_alloc as i64, None);
        for (j, &v) in curve.iter().enumerate() {
            if v > best.0 {
                best = (v, Some(j));
            }
        }
        (best.0.max(0) as u64, best.1)
    }

    /// First position at or after `ts`.
    pub(super) fn pos_at_or_after(&self, ts: u64) -> usize {
        self.ts.partition_point(|&t| t < ts)
    }

    /// First position after `ts`.
    pub(super) fn pos_after(&self, ts: u64) -> usize {
        self.ts.partition_point(|&t| t <= ts)
    }

    pub(super) fn describe(&self, pos: Option<usize>) -> String {
        match pos {
            None => "before the first event".to_owned(),
            Some(p) => {
                let layer = self.trace.str(self.trace.events.layer[self.event[p]]);
                let phase = self.phase[p].as_str();
                if layer.is_empty() {
                    format!("in the {phase} phase")
                } else {
                    format!("in {layer} ({phase})")
                }
            }
        }
    }
}

pub(super) fn clamp_i64(v: i128) -> i64 {
    v.clamp(i64::MIN as i128 / 4, i64::MAX as i128 / 4) as i64
}

pub(super) fn span_of(spans: &[(u64, u64)], ts: u64) -> Option<u32> {
    let k = spans.partition_point(|s| s.1 < ts);
    spans.get(k).filter(|s| s.0 <= ts).map(|_| k as u32)
}
