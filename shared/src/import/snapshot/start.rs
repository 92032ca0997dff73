//! The memory that existed before the first trace entry: the final segments less every range
//! a segment entry names, plus the segments and blocks the entries free before allocating;
//! and the allocator models that start from it.

use super::entries::{Action, EntryBlocks, LocalStreams, Streams};
use super::finals::{pool_for_segment, FinalSeg};
use crate::allocator::{AllocatorConfig, AllocatorState, SMALL_REQUEST_BYTES};
use crate::hash::{FastMap as HashMap, FastSet as HashSet};
use crate::import::ImportError;
use crate::model::{BlockInfo, BlockState, Pool, SegmentInfo, Totals, Trace};
use crate::units::format_bytes;

/// A segment the trace frees (or unmaps) before it allocates it.
struct PreSegment {
    device: usize,
    address: u64,
    size_bytes: u64,
    /// The snapshot's stream id.
    stream: i64,
}

/// A block the trace frees before it allocates it.
struct PreBlock {
    device: usize,
    address: u64,
    requested_bytes: u64,
    /// Its free was requested before recording began and completes during it (the first entry
    /// is `free_completed` in a trace that records requests): it takes its space, but
    /// `memory_allocated()` no longer counted it.
    pending: bool,
}

/// What the entries show existed before the first of them.
pub(super) struct PreExisting {
    /// Every (device, address) a segment entry names.
    seg_seen: HashSet<(usize, u64)>,
    /// Every range a segment entry names, by device: sorted by start, overlaps merged.
    pub(super) seg_ranges: HashMap<usize, Vec<(u64, u64)>>,
    pre_segments: Vec<PreSegment>,
    /// The first action on each block (device, address).
    block_first: HashMap<(usize, u64), Action>,
    pre_blocks: Vec<PreBlock>,
}

impl PreExisting {
    /// Takes the entries in time order; gives the segments and blocks they free before
    /// allocating.
    pub(super) fn scan(entries: &EntryBlocks, local_streams: &LocalStreams) -> Self {
        let mut seg_seen: HashSet<(usize, u64)> = HashSet::default();
        let mut seg_ranges: HashMap<usize, Vec<(u64, u64)>> = HashMap::default();
        let mut pre_segments = Vec::new();
        let mut block_first: HashMap<(usize, u64), Action> = HashMap::default();
        let mut pre_blocks = Vec::new();
        for e in entries.iter() {
            let device = e.device as usize;
            if matches!(e.action, Action::SegmentAlloc | Action::SegmentMap | Action::SegmentFree | Action::SegmentUnmap) {
                seg_ranges.entry(device).or_default().push((e.addr, e.addr.saturating_add(e.size)));
            }
            match e.action {
                Action::SegmentAlloc | Action::SegmentMap => {
                    seg_seen.insert((device, e.addr));
                }
                Action::SegmentFree | Action::SegmentUnmap if seg_seen.insert((device, e.addr)) => {
                    pre_segments.push(PreSegment { device, address: e.addr, size_bytes: e.size, stream: local_streams.raw(e.stream) });
                }
                Action::Alloc => {
                    block_first.entry((device, e.addr)).or_insert(Action::Alloc);
                }
                Action::FreeRequested | Action::FreeCompleted | Action::Free => {
                    if let std::collections::hash_map::Entry::Vacant(slot) = block_first.entry((device, e.addr)) {
                        slot.insert(e.action);
                        let pending = e.action == Action::FreeCompleted;
                        pre_blocks.push(PreBlock { device, address: e.addr, requested_bytes: e.size, pending });
                    }
                }
                _ => {}
            }
        }
        // A trace without `free_requested` entries (as some tools write them) frees with
        // `free_completed` alone: there a first `free_completed` is an allocated block's free.
        let requests: HashSet<usize> = entries.iter().filter(|e| e.action == Action::FreeRequested).map(|e| e.device as usize).collect();
        for b in &mut pre_blocks {
            b.pending &= requests.contains(&b.device);
        }
        for ranges in seg_ranges.values_mut() {
            ranges.sort_unstable();
            let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
            for &(a, b) in ranges.iter() {
                match merged.last_mut() {
                    Some(last) if a <= last.1 => last.1 = last.1.max(b),
                    _ => merged.push((a, b)),
                }
            }
            *ranges = merged;
        }
        Self { seg_seen, seg_ranges, pre_segments, block_first, pre_blocks }
    }

    /// The parts of `[start, end)` on `device` that no segment entry names: what of a final
    /// segment existed before the entries. A segment the trace allocates (or frees and
    /// allocates again) leaves nothing; an expandable segment (`expandable_segments:True`),
    /// which grows by `segment_map` entries inside its range, leaves the part mapped before
    /// recording began.
    fn unnamed_parts(&self, device: usize, start: u64, end: u64) -> Vec<(u64, u64)> {
        let ranges = self.seg_ranges.get(&device).map_or(&[][..], Vec::as_slice);
        // The first range that ends after `start` (ranges are merged: their ends ascend too).
        let first = ranges.partition_point(|&(_, b)| b <= start);
        let mut parts = Vec::new();
        let mut at = start;
        for &(a, b) in &ranges[first..] {
            if a >= end {
                break;
            }
            if a > at {
                parts.push((at, a));
            }
            at = at.max(b);
        }
        if at < end {
            parts.push((at, end));
        }
        parts
    }
}

/// The memory that existed before the first entry.
pub(super) struct StartState {
    /// Sorted by (device, address).
    pub(super) initial: Vec<SegmentInfo>,
    /// Bytes of blocks alive at the start that no known segment holds, by (device, address).
    pub(super) loose_allocated: HashMap<(usize, u64), u64>,
    /// Bytes of blocks pending their free at the start that no known segment holds.
    pub(super) loose_pending: HashMap<(usize, u64), u64>,
}

impl StartState {
    /// Takes the final segments and what existed before the entries; gives the segments and
    /// blocks alive at the start: segments the trace never allocates and blocks it frees
    /// before allocating (or never touches, if they are alive at the end).
    pub(super) fn build(
        finals: &[FinalSeg],
        pre: &PreExisting,
        config: &AllocatorConfig,
        streams: &mut Streams,
        trace: &mut Trace,
    ) -> Result<Self, ImportError> {
        let mut initial: Vec<SegmentInfo> = Vec::new();
        for f in finals {
            if pre.seg_seen.contains(&(f.device, f.address)) {
                continue;
            }
            // Each part of the segment that existed before the entries, with its blocks then.
            for (start, end) in pre.unnamed_parts(f.device, f.address, f.address.saturating_add(f.size)) {
                let blocks = f
                    .blocks
                    .iter()
                    .filter(|b| b.active && b.address >= start && b.address < end && !pre.block_first.contains_key(&(f.device, b.address)))
                    .map(|b| BlockInfo {
                        address: b.address,
                        size_bytes: b.size_bytes,
                        state: if b.pending { BlockState::PendingFree } else { BlockState::Allocated },
                    })
                    .collect();
                let stream = streams.index(trace, f.stream)?;
                let (device, size_bytes, private_pool) = (f.device as u8, end - start, f.private_pool);
                initial.push(SegmentInfo { address: start, size_bytes, device, stream, pool: f.pool, blocks, private_pool });
            }
        }
        for s in &pre.pre_segments {
            let stream = streams.index(trace, s.stream)?;
            initial.push(SegmentInfo {
                address: s.address,
                size_bytes: s.size_bytes,
                device: s.device as u8,
                stream,
                pool: pool_for_segment(s.size_bytes),
                blocks: Vec::new(),
                private_pool: None,
            });
        }
        let (loose_allocated, loose_pending) = place_pre_blocks(&mut initial, &pre.pre_blocks, config);
        let estimated: HashSet<(u8, u64)> = pre.pre_blocks.iter().map(|b| (b.device as u8, b.address)).collect();
        for s in &mut initial {
            s.blocks.sort_by_key(|b| b.address);
            s.blocks.dedup_by_key(|b| b.address);
            widen_estimated_blocks(s, &estimated, config);
        }
        initial.sort_by_key(|s| (s.device, s.address));
        Ok(Self { initial, loose_allocated, loose_pending })
    }
}

/// A block whose size was estimated from its request (freed before it was allocated) holds
/// the space up to the next block when that space could not be a free block of its own: in
/// a large segment the allocator splits off only remainders above 1 MiB and frees only blocks
/// above 1 MiB, so a gap of at most 1 MiB after a block is part of it.
fn widen_estimated_blocks(seg: &mut SegmentInfo, estimated: &HashSet<(u8, u64)>, config: &AllocatorConfig) {
    if seg.pool != Pool::Large || config.expandable_segments || config.max_split_bytes.is_some() {
        return;
    }
    let end = seg.address.saturating_add(seg.size_bytes);
    for k in 0..seg.blocks.len() {
        let b = &seg.blocks[k];
        if !estimated.contains(&(seg.device, b.address)) {
            continue;
        }
        let next = seg.blocks.get(k + 1).map_or(end, |n| n.address);
        let gap = next.saturating_sub(b.address.saturating_add(b.size_bytes));
        if gap > 0 && gap <= SMALL_REQUEST_BYTES {
            seg.blocks[k].size_bytes += gap;
        }
    }
}

/// Takes the start segments and the blocks freed before being allocated, which were alive at
/// the start; adds each block to its segment and gives the sizes of those that have none
/// (allocated, and pending their free).
type Loose = HashMap<(usize, u64), u64>;
fn place_pre_blocks(initial: &mut [SegmentInfo], pre_blocks: &[PreBlock], config: &AllocatorConfig) -> (Loose, Loose) {
    // Segments sorted by (device, address) so that each block finds its segment in O(log n):
    // the one starting nearest below it (segments do not overlap; of equal starts the first
    // wins, as a linear search would).
    let mut by_start: Vec<usize> = (0..initial.len()).collect();
    by_start.sort_by_key(|&k| (initial[k].device, initial[k].address));
    by_start.dedup_by_key(|k| (initial[*k].device, initial[*k].address));
    let mut loose_allocated: Loose = HashMap::default();
    let mut loose_pending: Loose = HashMap::default();
    for b in pre_blocks {
        let size = config.round_size(b.requested_bytes);
        let key = (b.device as u8, b.address);
        let after = by_start.partition_point(|&k| (initial[k].device, initial[k].address) <= key);
        let seg = after
            .checked_sub(1)
            .map(|i| by_start[i])
            .filter(|&k| initial[k].device == key.0 && b.address < initial[k].address.saturating_add(initial[k].size_bytes));
        match seg.map(|k| &mut initial[k]) {
            Some(seg) => {
                let state = if b.pending { BlockState::PendingFree } else { BlockState::Allocated };
                seg.blocks.push(BlockInfo { address: b.address, size_bytes: size, state });
            }
            None if b.pending => {
                loose_pending.insert((b.device, b.address), size);
            }
            None => {
                loose_allocated.insert((b.device, b.address), size);
            }
        }
    }
    (loose_allocated, loose_pending)
}

/// Takes the start state; gives one allocator model per device holding it, sets the trace's
/// base totals and initial segments, and warns of memory allocated before recording (or, when
/// nothing was `recorded`, that the snapshot is only that state).
pub(super) fn allocator_states(
    trace: &mut Trace,
    initial: Vec<SegmentInfo>,
    loose_allocated: &HashMap<(usize, u64), u64>,
    config: &AllocatorConfig,
    host: Option<usize>,
    recorded: bool,
) -> Vec<AllocatorState> {
    let n_dev = trace.devices.len();
    let config_of = |d| if Some(d) == host { AllocatorConfig::pinned_host() } else { config.clone() };
    let mut states: Vec<AllocatorState> = (0..n_dev).map(config_of).map(AllocatorState::new).collect();
    for s in &initial {
        states[s.device as usize].add_segment_info(s);
    }
    for (d, state) in states.iter().enumerate() {
        let loose: u64 = loose_allocated.iter().filter(|((dev, _), _)| *dev == d).map(|(_, &s)| s).sum();
        trace
            .events
            .set_base_totals(d, Totals { allocated_bytes: state.allocated_bytes() + loose, reserved_bytes: state.reserved_bytes() });
    }
    let pre_allocated: u64 = trace.events.base_totals.iter().map(|t| t.allocated_bytes).sum();
    if !recorded {
        trace.meta.warnings.push(
            "this snapshot has no trace entries (PyTorch records them only while torch.cuda.memory._record_memory_history() is on): \
             its totals and segments are the allocator's state when it was taken"
                .to_owned(),
        );
    } else if pre_allocated > 0 {
        trace.meta.warnings.push(format!(
            "{} were allocated before recording began (recovered from the final segment state)",
            format_bytes(pre_allocated)
        ));
    }
    trace.initial_segments = initial;
    states
}
