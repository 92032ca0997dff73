//! What each change does to what runs out: its predicted reserved peak, from a replay through
//! the model of PyTorch's caching allocator (`crate::whatif`) where the change is one of whole
//! blocks, else from its allocated saving; then the ranked changes and those with no effect.

use super::curve::Curve;
use super::{AdviceOptions, Baseline, Ctx, Effect, Measure, ReservedPrediction, Suggestion};
use crate::hash::{FastMap, FastSet};
use crate::units::format_bytes;
use crate::whatif::{limits, requests, simulate, DeviceRequests, Op, Request, Requests, SimOptions};

/// A change as the caching allocator sees it: blocks of the analysed device (indices into the
/// curve's blocks) resized, or absent over spans of positions.
#[derive(Clone, Debug, Default)]
pub(super) struct BlockEdit {
    /// New sizes; 0: the block is never allocated.
    pub(super) sizes: FastMap<u32, u64>,
    /// `(block, from, to)`: freed before position `from`, allocated again before `to` (not
    /// again where `to` is at or after its own free).
    pub(super) absent: Vec<(u32, usize, usize)>,
}

/// How a suggestion's reserved peak is predicted.
#[derive(Clone, Debug)]
pub(super) enum ReservedBy {
    /// Its kind replayed it already (allocator settings): the predicted reserved peak, and the
    /// replay of the run's own settings it is held against.
    Replayed { predicted: u64, own: u64 },
    /// Replay these block changes.
    Blocks(BlockEdit),
    /// Its allocated saving (checkpointing and AMP move parts of blocks over quarter
    /// positions, which is not a request stream the model can replay).
    AllocatedSaving,
}

/// A suggestion before it is judged.
pub(super) struct Proposal {
    pub(super) suggestion: Suggestion,
    pub(super) reserved: ReservedBy,
}

impl Proposal {
    pub(super) fn new(suggestion: Suggestion, reserved: ReservedBy) -> Self {
        Self { suggestion, reserved }
    }
}

/// The analysed device's requests and the replay of the run as it was.
struct Replay {
    reqs: Requests,
    dev: usize,
    sim: SimOptions,
    own_peak: u64,
}

impl Replay {
    /// `None` where the device has no requests to replay or the model refuses the run's
    /// configuration (`cudaMallocAsync`).
    fn new(c: &Curve, device: u8) -> Option<Self> {
        let reqs = requests(c.trace);
        let dev = reqs.devices.iter().position(|d| d.device == device)?;
        let sim = limits(c.trace, &reqs, &reqs.devices[dev], None).sim;
        let own_peak = simulate(&reqs.devices[dev], &reqs.own_conf, &sim).ok()?.reserved_peak_bytes;
        Some(Self { reqs, dev, sim, own_peak })
    }

    /// The reserved and allocated peaks with `edit`.
    fn with(&self, c: &Curve, edit: &BlockEdit) -> Option<(u64, u64)> {
        let dev = edited(&self.reqs.devices[self.dev], c, edit);
        simulate(&dev, &self.reqs.own_conf, &self.sim).ok().map(|o| (o.reserved_peak_bytes, o.allocated_peak_bytes))
    }
}

/// `dev`'s requests with `edit` made: resized blocks ask for their request scaled as the block,
/// absent blocks are freed before their span's first event and allocated again before its end.
fn edited(dev: &DeviceRequests, c: &Curve, edit: &BlockEdit) -> DeviceRequests {
    let blocks: FastSet<u32> = edit.sizes.keys().copied().chain(edit.absent.iter().map(|a| a.0)).collect();
    let mut by_alloc: FastMap<(u32, u64), u32> = FastMap::default();
    let mut by_free: FastMap<(u32, u64), u32> = FastMap::default();
    for &b in &blocks {
        let bl = &c.blocks[b as usize];
        by_alloc.insert((c.event[bl.alloc_pos] as u32, bl.address), b);
        if let Some(f) = bl.free_pos {
            by_free.insert((c.event[f] as u32, bl.address), b);
        }
    }
    // Each edited block's request as the run made it, resized.
    let mut asked: FastMap<u32, Op> = FastMap::default();
    for r in &dev.requests {
        if let Op::Alloc { key, size_bytes, stream, pool } = r.op {
            if let Some(&b) = by_alloc.get(&(r.event, key)) {
                let size = c.blocks[b as usize].size_bytes.max(1);
                let new = edit.sizes.get(&b).map_or(size_bytes, |&s| (u128::from(size_bytes) * u128::from(s) / u128::from(size)) as u64);
                let new = if edit.sizes.get(&b) == Some(&0) { 0 } else { new.max(1) };
                asked.insert(b, Op::Alloc { key, size_bytes: new, stream, pool });
            }
        }
    }
    // Frees and allocations the edit adds, by the event they go before (frees first), and the
    // blocks whose own free goes (freed early, or never allocated).
    let mut added: Vec<(u32, u8, Op)> = Vec::new();
    let mut early: FastSet<u32> = FastSet::default();
    for &(b, from, to) in &edit.absent {
        let bl = &c.blocks[b as usize];
        let Some(&Op::Alloc { key, size_bytes, .. }) = asked.get(&b) else { continue };
        if from >= c.len() || from <= bl.alloc_pos || size_bytes == 0 {
            continue;
        }
        let block_bytes = edit.sizes.get(&b).copied().unwrap_or(bl.size_bytes);
        added.push((c.event[from] as u32, 0, Op::Free { key, size_bytes: block_bytes, completed: true }));
        match bl.free_pos {
            Some(f) if to >= f => {
                early.insert(b);
            }
            None if to >= c.len() => {}
            _ => added.push((c.event[to] as u32, 1, asked[&b])),
        }
    }
    added.sort_by_key(|a| (a.0, a.1));
    let ts = |event: u32| c.trace.events.ts_ns.get(event as usize).copied().unwrap_or(0);
    let mut out = Vec::with_capacity(dev.requests.len() + added.len());
    let mut next = added.into_iter().peekable();
    // Keys whose held-back free's completion goes with the free.
    let mut no_completion: FastSet<u64> = FastSet::default();
    for r in &dev.requests {
        while let Some((event, _, op)) = next.next_if(|a| a.0 <= r.event) {
            out.push(Request { event, ts_ns: ts(event), op });
        }
        let op = match r.op {
            Op::Alloc { key, .. } => match by_alloc.get(&(r.event, key)).and_then(|b| asked.get(b)) {
                Some(&Op::Alloc { size_bytes: 0, .. }) => continue,
                Some(&op) => op,
                None => r.op,
            },
            Op::Free { key, completed, .. } => match by_free.get(&(r.event, key)) {
                Some(b) if early.contains(b) || matches!(asked.get(b), Some(Op::Alloc { size_bytes: 0, .. })) => {
                    if !completed {
                        no_completion.insert(key);
                    }
                    continue;
                }
                _ => r.op,
            },
            Op::FreeCompleted { key } if no_completion.remove(&key) => continue,
            op => op,
        };
        out.push(Request { op, ..*r });
    }
    out.extend(next.map(|(event, _, op)| Request { event, ts_ns: ts(event), op }));
    DeviceRequests {
        device: dev.device,
        name: dev.name.clone(),
        requests: out,
        initial_segments: dev.initial_segments.clone(),
        initial_expandable: dev.initial_expandable,
        initial_large_page_bytes: dev.initial_large_page_bytes,
        loose_allocated_bytes: dev.loose_allocated_bytes,
        opaque_reserved_bytes: dev.opaque_reserved_bytes,
        pools: dev.pools.clone(),
        pool_sets: dev.pool_sets.clone(),
        inferred_empty_caches: dev.inferred_empty_caches,
    }
}

/// Whether the trace knows the analysed device's reserved memory: what runs out there.
fn reserved_known(c: &Curve, device: u8, baseline: &Baseline) -> bool {
    c.trace.meta.fragmentation_tracked && baseline.peak_reserved_bytes > 0 && !c.trace.meta.reserved_unknown.contains(&device)
}

/// The suggestions judged: each one's reserved peak and savings, then those saving something
/// of what runs out ranked (and cut to `opts.top`), the others apart. Returns (what they are
/// judged by, ranked, no effect).
pub(super) fn judge(
    ctx: &Ctx,
    device: u8,
    baseline: &Baseline,
    proposals: Vec<Proposal>,
    opts: &AdviceOptions,
) -> (Measure, Vec<Suggestion>, Vec<Suggestion>) {
    let c = &ctx.c;
    let measure = if reserved_known(c, device, baseline) { Measure::Reserved } else { Measure::Allocated };
    let replay = (measure == Measure::Reserved && baseline.device.starts_with("cuda"))
        .then(|| proposals.iter().any(|p| matches!(p.reserved, ReservedBy::Blocks(_))))
        .filter(|&any| any)
        .and_then(|_| Replay::new(c, device));
    let mut ranked = Vec::new();
    let mut none = Vec::new();
    for Proposal { mut suggestion, reserved } in proposals {
        let s = &mut suggestion;
        s.allocated_saving_bytes = baseline.peak_allocated_bytes as i64 - s.predicted_peak_bytes as i64;
        s.saving_bytes = s.allocated_saving_bytes;
        if measure == Measure::Reserved {
            let replayed = match &reserved {
                ReservedBy::Replayed { predicted, own } => Some((*predicted, *own)),
                ReservedBy::Blocks(edit) => replay.as_ref().and_then(|r| {
                    let (reserved, allocated) = r.with(c, edit)?;
                    // The replay's own allocated peak, beside the curve's: where blocks are
                    // dropped or resized in place the two agree.
                    s.numbers.insert("replayed_allocated_peak_bytes".to_owned(), allocated as f64);
                    s.numbers.insert("replayed_reserved_peak_bytes".to_owned(), r.own_peak as f64);
                    Some((reserved, r.own_peak))
                }),
                ReservedBy::AllocatedSaving => None,
            };
            let (predicted, saving, by) = match replayed {
                Some((p, own)) => {
                    if matches!(reserved, ReservedBy::Blocks(_)) {
                        s.reasoning.push_str(&format!(
                            ". Replayed through PyTorch's caching allocator (`collector whatif`'s model), the reserved peak is {} against {} for the run as it was",
                            format_bytes(p),
                            format_bytes(own)
                        ));
                    }
                    (p, own as i64 - p as i64, ReservedPrediction::AllocatorReplay)
                }
                None => {
                    let p =
                        (baseline.peak_reserved_bytes as i64 - s.allocated_saving_bytes).max(s.predicted_peak_bytes as i64).max(0) as u64;
                    s.reasoning.push_str(&format!(
                        ". The reserved peak is taken to move as the allocated one, to {} (this change is not replayed through the caching allocator: its unused cache is assumed unchanged)",
                        format_bytes(p)
                    ));
                    (p, baseline.peak_reserved_bytes as i64 - p as i64, ReservedPrediction::AllocatedSaving)
                }
            };
            s.predicted_reserved_peak_bytes = Some(predicted);
            s.reserved_saving_bytes = Some(saving);
            s.reserved_predicted_by = Some(by);
            s.predicted_device_total_bytes = baseline.outside_pytorch_bytes.map(|o| predicted + o);
            s.saving_bytes = saving;
        }
        s.effect = if s.saving_bytes > 0 { Effect::Saves } else { Effect::None };
        match s.effect {
            Effect::Saves => ranked.push(suggestion),
            Effect::None => none.push(suggestion),
        }
    }
    super::rank(&mut ranked, opts.budget_bytes, measure);
    ranked.truncate(opts.top);
    none.sort_by(|a, b| a.kind.cmp(&b.kind).then_with(|| a.change.cmp(&b.change)));
    (measure, ranked, none)
}
