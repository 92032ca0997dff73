//! The simulator: PyTorch's `DeviceCachingAllocator::malloc` and `free` over a model of its
//! block pools, driven by a device's requests.

use super::conf::{allocation_size, AllocConf, ConfError};
use super::outcome::{At, OomAt, Outcome, SegmentAddresses, SimOptions};
use super::requests::{DeviceRequests, Op, Request};
use crate::allocator::{AllocatorConfig, MIN_BLOCK_BYTES, SMALL_REQUEST_BYTES, SMALL_SEGMENT_BYTES};
use crate::hash::{FastMap, FastSet};
use crate::model::{PoolId, Totals};
use std::collections::BTreeMap;

/// "No block" in links and segment references.
pub(super) const NONE: u32 = u32::MAX;
/// PyTorch refuses requests of 1 EiB and more as out of memory before trying.
const ONE_EIB: u64 = 1 << 60;
/// The device memory an expandable segment's address reserve is sized on when no capacity is
/// given (an 80 GiB card).
const DEFAULT_DEVICE_BYTES: u64 = 80 << 30;
/// Where segments that cannot sit at their hinted address go, and the floor of the ranges
/// placed without hints (above any address a recorded run has).
const SYNTHETIC_BASE: u64 = 1 << 62;
/// The ceiling of the ranges placed highest first.
const SYNTHETIC_TOP: u64 = 3 << 61;
/// The default pools' indices into `Sim::pools`.
pub(super) const LARGE: u32 = 0;
pub(super) const SMALL: u32 = 1;

/// A block's part in the allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum State {
    /// Out of the pool, about to be handed out.
    Taken,
    Allocated,
    /// Freed, waiting for its completion (not reusable, not counted as allocated).
    Pending,
    /// Cached in its pool's `blocks`.
    Free,
    /// Address space of an expandable segment with no memory behind it (`unmapped`).
    Unmapped,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Block {
    pub(super) ptr: u64,
    pub(super) size: u64,
    /// The pool's `calls` when the block was cached (`gc_count_base`).
    pub(super) gc_base: u64,
    pub(super) prev: u32,
    pub(super) next: u32,
    /// Index into `Sim::pools`.
    pub(super) pool: u32,
    /// Index into `Sim::segs` for blocks of expandable segments, else `NONE`.
    pub(super) seg: u32,
    pub(super) stream: u16,
    pub(super) state: State,
}

impl Block {
    pub(super) fn is_split(&self) -> bool {
        self.prev != NONE || self.next != NONE
    }

    /// `BlockComparatorSize`'s order: stream, size, address.
    pub(super) fn key(&self) -> (u16, u64, u64) {
        (self.stream, self.size, self.ptr)
    }
}

/// `BlockPool`: the cached blocks of one pool, by size and (expandable) by address.
#[derive(Debug, Default)]
pub(super) struct BlockPool {
    pub(super) small: bool,
    /// The private pool (index into the trace's pools) that owns it.
    pub(super) private: Option<u16>,
    pub(super) blocks: BTreeMap<(u16, u64, u64), u32>,
    pub(super) unmapped: BTreeMap<(u16, u64), u32>,
    /// `get_free_blocks_call_count`.
    pub(super) calls: u64,
}

/// `PrivatePool`: a CUDA graph's or `MemPool`'s blocks.
#[derive(Debug)]
pub(super) struct PrivatePool {
    pub(super) large: u32,
    pub(super) small: u32,
    /// `cudaMalloc_count`.
    pub(super) mallocs: i64,
    /// Its graphs or `MemPool` are gone, so `empty_cache` may release it.
    pub(super) freeable: bool,
}

/// `ExpandableSegment`: a reserve of address space mapped in pages.
#[derive(Clone, Copy, Debug)]
pub(super) struct ExpSeg {
    pub(super) base: u64,
    pub(super) page: u64,
    pub(super) mapped: u64,
}

/// Effective settings.
pub(super) struct Params {
    pub(super) round: AllocatorConfig,
    pub(super) max_split: u64,
    pub(super) max_non_split: u64,
    pub(super) large_segment: u64,
    pub(super) gc: f64,
    pub(super) expandable: bool,
    /// `allowed_memory_maximum`: fraction × capacity, when a fraction under 1 is set.
    pub(super) allowed: Option<u64>,
    pub(super) capacity: Option<u64>,
    /// `throw_on_cudamalloc_oom`'s limit.
    pub(super) reject_above: Option<u64>,
    pub(super) reserve: u64,
}

/// `AllocParams`.
pub(super) struct Ask {
    pub(super) size: u64,
    pub(super) stream: u16,
    pub(super) pool: u32,
    pub(super) alloc_size: u64,
    pub(super) expandable: bool,
    pub(super) hint: Option<u64>,
    pub(super) block: u32,
    pub(super) rejected: bool,
}

/// The allocator of one device.
pub(super) struct Sim {
    pub(super) p: Params,
    pub(super) blocks: Vec<Block>,
    /// Indices of `blocks` free for reuse (dropped blocks).
    pub(super) spare: Vec<u32>,
    pub(super) pools: Vec<BlockPool>,
    pub(super) private: BTreeMap<u16, PrivatePool>,
    pub(super) pool_ids: Vec<PoolId>,
    pub(super) live: FastMap<u64, u32>,
    pub(super) pending: FastMap<u64, u32>,
    refused: FastSet<u64>,
    pub(super) segs: Vec<ExpSeg>,
    /// Address ranges of segments and expandable reserves, start → end.
    va: BTreeMap<u64, u64>,
    synthetic: u64,
    addresses: SegmentAddresses,
    pub(super) reserved: u64,
    allocated: u64,
    loose: u64,
    opaque: u64,
    pub(super) segments: u64,
    /// The request being served, for peaks.
    now: At,
    pub(super) out: Outcome,
}

/// Replays `dev`'s requests through PyTorch's caching allocator configured by `conf`.
///
/// Fails only for a configuration the model cannot replay (`backend:cudaMallocAsync`).
pub fn simulate(dev: &DeviceRequests, conf: &AllocConf, opts: &SimOptions) -> Result<Outcome, ConfError> {
    let mut sim = Sim::start(dev, conf, opts)?;
    let mut totals = opts.record_totals.then(|| Vec::with_capacity(dev.requests.len()));
    for (k, r) in dev.requests.iter().enumerate() {
        sim.step(k, r, dev);
        if let Some(t) = totals.as_mut() {
            t.push(sim.totals());
        }
    }
    sim.out.requests = dev.requests.len();
    sim.out.final_totals = sim.totals();
    sim.out.totals = totals;
    Ok(sim.out)
}

impl Sim {
    /// The allocator before `dev`'s first request: its initial segments loaded. Fails for a
    /// configuration the model cannot replay.
    pub(super) fn start(dev: &DeviceRequests, conf: &AllocConf, opts: &SimOptions) -> Result<Sim, ConfError> {
        conf.check_modelled()?;
        let mut sim = Sim::new(dev, conf, opts);
        sim.load_initial(dev);
        Ok(sim)
    }

    /// Serves request `k` of `dev`.
    pub(super) fn step(&mut self, k: usize, r: &Request, dev: &DeviceRequests) {
        self.now = At { request: k, event: r.event, ts_ns: r.ts_ns };
        self.process(r, dev);
        self.settle_peak();
    }

    fn new(dev: &DeviceRequests, conf: &AllocConf, opts: &SimOptions) -> Sim {
        let fraction = opts.memory_fraction.or(conf.per_process_memory_fraction).filter(|f| f.is_finite());
        let capacity = opts.capacity_bytes;
        // PyTorch 2.10+: a fraction of 1 (or more) sets no maximum.
        let allowed = match (capacity, fraction) {
            (Some(c), Some(f)) if f < 1.0 => Some((f.max(0.0) * c as f64).round() as u64),
            _ => None,
        };
        let reject_above = match (conf.throw_on_cudamalloc_oom, capacity) {
            (Some(true), Some(c)) => Some((conf.per_process_memory_fraction.unwrap_or(1.0).clamp(0.0, 1.0) * c as f64) as u64),
            _ => None,
        };
        let device = capacity.unwrap_or(DEFAULT_DEVICE_BYTES);
        let reserve = match conf.expandable_segments_reserve {
            Some(spec) => spec.bytes(device),
            None => device.saturating_add(device / 8),
        };
        let p = Params {
            round: conf.allocator_config(),
            max_split: conf.max_split_bytes(),
            max_non_split: conf.max_non_split_rounding(),
            large_segment: conf.large_segment_bytes(),
            gc: conf.gc_threshold(),
            expandable: conf.expandable(),
            allowed,
            capacity,
            reject_above,
            reserve,
        };
        Sim {
            p,
            blocks: Vec::new(),
            spare: Vec::new(),
            pools: vec![BlockPool::default(), BlockPool { small: true, ..BlockPool::default() }],
            private: BTreeMap::new(),
            pool_ids: dev.pools.clone(),
            live: FastMap::default(),
            pending: FastMap::default(),
            refused: FastSet::default(),
            segs: Vec::new(),
            va: BTreeMap::new(),
            synthetic: SYNTHETIC_BASE,
            addresses: opts.addresses,
            reserved: 0,
            allocated: 0,
            loose: dev.loose_allocated_bytes,
            opaque: dev.opaque_reserved_bytes,
            segments: 0,
            now: At::default(),
            out: Outcome::default(),
        }
    }

    fn totals(&self) -> Totals {
        Totals { allocated_bytes: self.allocated.saturating_add(self.loose), reserved_bytes: self.reserved.saturating_add(self.opaque) }
    }

    fn process(&mut self, r: &Request, dev: &DeviceRequests) {
        match r.op {
            Op::Alloc { key, size_bytes, stream, pool } => self.alloc(key, size_bytes, stream, pool),
            Op::Free { key, size_bytes, completed } => self.free(key, size_bytes, completed),
            Op::FreeCompleted { key } => match self.pending.remove(&key) {
                Some(id) => self.free_block(id),
                None => self.out.anomalies.unknown_frees += 1,
            },
            Op::EmptyCache { released_pools, in_malloc, .. } => {
                for &p in dev.pool_sets.get(released_pools as usize).map(Vec::as_slice).unwrap_or(&[]) {
                    if let Some(pp) = self.private.get_mut(&p) {
                        pp.freeable = true;
                    }
                }
                // Under a capacity the allocation that released makes its own decision.
                if !(in_malloc && self.p.capacity.is_some()) {
                    self.release_cached_blocks();
                }
            }
            Op::FailedAlloc { size_bytes, stream, pool } => {
                if size_bytes == 0 {
                    return;
                }
                match self.malloc(size_bytes, stream, pool, None, false) {
                    Some(id) => {
                        self.out.recorded_ooms_that_fit += 1;
                        self.free_block(id);
                    }
                    None => self.oom(size_bytes, stream, true),
                }
            }
        }
    }

    fn alloc(&mut self, key: u64, size: u64, stream: u16, pool: Option<u16>) {
        if size == 0 {
            self.out.anomalies.zero_sizes += 1;
            return;
        }
        match self.malloc(size, stream, pool, Some(key), true) {
            Some(id) => {
                if self.blocks[id as usize].ptr == key {
                    self.out.placement.matched += 1;
                } else {
                    self.out.placement.differed += 1;
                    self.out.placement.first_difference.get_or_insert(self.now.request);
                }
                if self.live.insert(key, id).is_some() {
                    self.out.anomalies.repeated_keys += 1;
                }
                self.refused.remove(&key);
            }
            None => {
                self.oom(size, stream, false);
                self.refused.insert(key);
            }
        }
    }

    fn free(&mut self, key: u64, size: u64, completed: bool) {
        let Some(id) = self.live.remove(&key) else {
            if self.refused.remove(&key) {
                self.out.anomalies.frees_of_refused += 1;
            } else if size > 0 && size <= self.loose {
                self.loose -= size;
            } else {
                self.out.anomalies.unknown_frees += 1;
            }
            return;
        };
        self.allocated = self.allocated.saturating_sub(self.blocks[id as usize].size);
        if completed {
            self.free_block(id);
        } else {
            self.blocks[id as usize].state = State::Pending;
            if let Some(old) = self.pending.insert(key, id) {
                // A second held-back free of one key: the first block is released now.
                self.free_block(old);
            }
        }
    }

    fn oom(&mut self, size: u64, stream: u16, recorded: bool) {
        self.out.ooms += 1;
        if self.out.oom.is_none() {
            let requested_bytes = if size >= ONE_EIB { size } else { self.p.round.round_size(size) };
            let t = self.totals();
            self.out.oom = Some(OomAt {
                at: self.now,
                requested_bytes,
                allocated_bytes: t.allocated_bytes,
                reserved_bytes: t.reserved_bytes,
                stream,
                recorded_in_trace: recorded,
            });
        }
    }

    pub(super) fn new_block(&mut self, b: Block) -> u32 {
        match self.spare.pop() {
            Some(id) => {
                self.blocks[id as usize] = b;
                id
            }
            None => {
                self.blocks.push(b);
                (self.blocks.len() - 1) as u32
            }
        }
    }

    pub(super) fn drop_block(&mut self, id: u32) {
        self.spare.push(id);
    }

    /// `insert_into_blocks`: caches a block in its pool.
    pub(super) fn insert_free(&mut self, id: u32) {
        let b = &mut self.blocks[id as usize];
        let pool = &mut self.pools[b.pool as usize];
        b.state = State::Free;
        b.gc_base = pool.calls;
        pool.blocks.insert(b.key(), id);
    }

    pub(super) fn remove_free(&mut self, id: u32) {
        let b = &self.blocks[id as usize];
        self.pools[b.pool as usize].blocks.remove(&b.key());
    }

    pub(super) fn private_of(&mut self, pool: u32) -> Option<&mut PrivatePool> {
        let p = self.pools.get(pool as usize)?.private?;
        self.private.get_mut(&p)
    }

    pub(super) fn grow_reserved(&mut self, bytes: u64) {
        self.reserved = self.reserved.saturating_add(bytes);
        let t = self.totals();
        if t.reserved_bytes > self.out.reserved_peak_bytes || self.out.reserved_peak_at.is_none() {
            self.out.reserved_peak_bytes = t.reserved_bytes;
            self.out.reserved_peak_at = Some(self.now);
        }
        self.out.max_segments = self.out.max_segments.max(self.segments);
    }

    /// After a request that reached the reserved peak: what was unallocated and how many
    /// segments there were once it was served.
    fn settle_peak(&mut self) {
        if self.out.reserved_peak_at.is_some_and(|at| at.request == self.now.request) {
            let t = self.totals();
            self.out.reserved_unallocated_at_peak_bytes = self.out.reserved_peak_bytes.saturating_sub(t.allocated_bytes);
            self.out.segments_at_peak = self.segments;
        }
    }

    pub(super) fn shrink_reserved(&mut self, bytes: u64) {
        self.reserved = self.reserved.saturating_sub(bytes);
    }

    /// Claims `size` bytes of address space for a segment, as [`SimOptions::addresses`] says:
    /// at `hint` (where the recorded run's allocator had it) when that is free, else above every
    /// recorded address; or the lowest or highest free range. `None` when the address space is
    /// used up.
    pub(super) fn place(&mut self, hint: Option<u64>, size: u64) -> Option<u64> {
        match self.addresses {
            SegmentAddresses::AsRecorded => {}
            SegmentAddresses::Lowest => return self.place_lowest(size),
            SegmentAddresses::Highest => return self.place_highest(size),
        }
        if let Some(h) = hint {
            if self.claim(h, size) {
                return Some(h);
            }
        }
        loop {
            let start = self.synthetic.checked_next_multiple_of(SMALL_SEGMENT_BYTES)?;
            let end = start.checked_add(size)?;
            match self.conflict(start, end) {
                None => {
                    self.synthetic = end;
                    self.va.insert(start, end);
                    return Some(start);
                }
                Some(taken_end) => self.synthetic = taken_end,
            }
        }
    }

    /// The lowest free range of `size` bytes at or above [`SYNTHETIC_BASE`] (freed ranges
    /// are used again, as the driver does).
    fn place_lowest(&mut self, size: u64) -> Option<u64> {
        let mut start = SYNTHETIC_BASE;
        for (&s, &e) in self.va.range(SYNTHETIC_BASE..) {
            if start.checked_add(size)? <= s {
                break;
            }
            start = start.max(e).checked_next_multiple_of(SMALL_SEGMENT_BYTES)?;
        }
        let end = start.checked_add(size)?;
        self.va.insert(start, end);
        Some(start)
    }

    /// The highest free range of `size` bytes below [`SYNTHETIC_TOP`], aligned to 2 MiB.
    fn place_highest(&mut self, size: u64) -> Option<u64> {
        let mut end = SYNTHETIC_TOP;
        let mut found = None;
        for (&s, &e) in self.va.range(..SYNTHETIC_TOP).rev() {
            let start = end.checked_sub(size)? / SMALL_SEGMENT_BYTES * SMALL_SEGMENT_BYTES;
            if start >= e {
                found = Some(start);
                break;
            }
            end = end.min(s);
        }
        let start = match found {
            Some(s) => s,
            None => end.checked_sub(size)? / SMALL_SEGMENT_BYTES * SMALL_SEGMENT_BYTES,
        };
        if start < SYNTHETIC_BASE {
            return None;
        }
        self.va.insert(start, start + size);
        Some(start)
    }

    /// Claims `[start, start + size)` if no segment holds any of it.
    pub(super) fn claim(&mut self, start: u64, size: u64) -> bool {
        match start.checked_add(size) {
            Some(end) if start != 0 && self.conflict(start, end).is_none() => {
                self.va.insert(start, end);
                true
            }
            _ => false,
        }
    }

    /// A block that existed before the first request: allocated (or held back) under `key`.
    pub(super) fn track_initial(&mut self, key: u64, id: u32) {
        let b = self.blocks[id as usize];
        let map = if b.state == State::Pending { &mut self.pending } else { &mut self.live };
        if map.insert(key, id).is_some() {
            self.out.anomalies.repeated_keys += 1;
        }
        if b.state == State::Allocated {
            self.allocated = self.allocated.saturating_add(b.size);
        }
    }

    /// The end of a claimed range that overlaps `[start, end)`.
    fn conflict(&self, start: u64, end: u64) -> Option<u64> {
        if let Some((_, &e)) = self.va.range(..=start).next_back() {
            if e > start {
                return Some(e);
            }
        }
        self.va.range(start..end).next().map(|(_, &e)| e)
    }

    pub(super) fn unplace(&mut self, start: u64) {
        self.va.remove(&start);
    }

    /// `get_pool`: a pool of the right size class, private when the request names one.
    pub(super) fn get_pool(&mut self, size: u64, private: Option<u16>) -> u32 {
        let small = size <= SMALL_REQUEST_BYTES;
        let Some(p) = private else { return if small { SMALL } else { LARGE } };
        if !self.private.contains_key(&p) {
            let large = self.pools.len() as u32;
            self.pools.push(BlockPool { private: Some(p), ..BlockPool::default() });
            self.pools.push(BlockPool { small: true, private: Some(p), ..BlockPool::default() });
            self.private.insert(p, PrivatePool { large, small: large + 1, mallocs: 0, freeable: false });
        }
        let pp = self.private.get_mut(&p).map(|pp| {
            // Allocated into again: its owner is alive.
            pp.freeable = false;
            if small {
                pp.small
            } else {
                pp.large
            }
        });
        pp.unwrap_or(if small { SMALL } else { LARGE })
    }

    /// A CUDA graph's pool (`(n, 0)` ids): allocations there happen during a capture, where
    /// PyTorch does not release cached blocks to retry.
    fn is_capture_pool(&self, private: Option<u16>) -> bool {
        private.and_then(|p| self.pool_ids.get(p as usize)).is_some_and(|id| id.0 != 0)
    }

    /// `DeviceCachingAllocator::malloc`: a block for `orig` bytes, or `None` (out of memory).
    fn malloc(&mut self, orig: u64, stream: u16, private: Option<u16>, hint: Option<u64>, count: bool) -> Option<u32> {
        if orig >= ONE_EIB {
            return None;
        }
        let size = self.p.round.round_size(orig);
        let pool = self.get_pool(size, private);
        let alloc_size = allocation_size(size, self.p.large_segment);
        let mut a = Ask { size, stream, pool, alloc_size, expandable: self.p.expandable, hint, block: NONE, rejected: false };
        let mut found = self.get_free_block(&mut a);
        if !found {
            if self.p.allowed.is_some() && self.p.gc > 0.0 {
                self.garbage_collect();
            }
            found = self.alloc_block(&mut a, false);
            if !found && !a.rejected {
                found = (self.release_available_cached_blocks(&a) && self.alloc_block(&mut a, false))
                    || (!self.is_capture_pool(private) && self.release_cached_blocks() && self.alloc_block(&mut a, true));
            }
        }
        if !found {
            return None;
        }
        let split = self.should_split(a.block, size, a.expandable);
        Some(self.alloc_found_block(&a, split, count))
    }

    /// `get_free_block`: the best-fitting cached block of the pool (by stream, size, address).
    fn get_free_block(&mut self, a: &mut Ask) -> bool {
        let gc_on = self.p.allowed.is_some() && self.p.gc > 0.0;
        let blocks = &self.blocks;
        let pool = &mut self.pools[a.pool as usize];
        if gc_on {
            pool.calls += 1;
        }
        let mut it = pool.blocks.range((a.stream, a.size, 0)..).map(|(k, &id)| (k.0, id));
        let Some((s, mut id)) = it.next() else { return false };
        if s != a.stream {
            return false;
        }
        if blocks[id as usize].seg != NONE {
            if a.expandable {
                // Best fit counts an expandable block as the size it can grow to.
                let grown = |b: u32| {
                    let b = &blocks[b as usize];
                    let next = (b.next != NONE).then(|| &blocks[b.next as usize]).filter(|n| n.state == State::Unmapped);
                    b.size.saturating_add(next.map_or(0, |n| n.size))
                };
                while blocks[id as usize].seg != NONE {
                    match it.next() {
                        Some((s, next)) if s == a.stream && grown(next) < grown(id) => id = next,
                        _ => break,
                    }
                }
            } else {
                // Expandable segments turned off: only blocks of ordinary segments serve.
                loop {
                    match it.next() {
                        Some((s, next)) if s == a.stream => {
                            id = next;
                            if blocks[id as usize].seg == NONE {
                                break;
                            }
                        }
                        _ => return false,
                    }
                }
            }
        }
        let found = blocks[id as usize].size;
        if a.size < self.p.max_split && found >= self.p.max_split {
            return false;
        }
        if a.size >= self.p.max_split && found >= a.size.saturating_add(self.p.max_non_split) {
            return false;
        }
        self.remove_free(id);
        self.blocks[id as usize].state = State::Taken;
        a.block = id;
        true
    }

    /// `alloc_block`: a new segment (or expandable pages) for the request.
    fn alloc_block(&mut self, a: &mut Ask, is_retry: bool) -> bool {
        if is_retry {
            self.out.alloc_retries += 1;
        }
        let after = self.reserved.saturating_add(a.alloc_size);
        if self.p.allowed.is_some_and(|m| after > m) {
            return false;
        }
        if self.p.reject_above.is_some_and(|m| after > m) {
            a.rejected = true;
            return false;
        }
        if a.expandable {
            let Some(id) = self.try_allocate_expandable(a) else { return false };
            a.block = id;
            if let Some(pp) = self.private_of(a.pool) {
                pp.mallocs += 1;
            }
            return true;
        }
        if self.p.capacity.is_some_and(|c| after > c) {
            return false;
        }
        let Some(ptr) = self.place(a.hint, a.alloc_size) else { return false };
        if let Some(pp) = self.private_of(a.pool) {
            pp.mallocs += 1;
        }
        let b = Block {
            ptr,
            size: a.alloc_size,
            gc_base: 0,
            prev: NONE,
            next: NONE,
            pool: a.pool,
            seg: NONE,
            stream: a.stream,
            state: State::Taken,
        };
        a.block = self.new_block(b);
        self.segments += 1;
        self.out.device_allocs += 1;
        self.grow_reserved(a.alloc_size);
        true
    }

    fn should_split(&self, id: u32, size: u64, expandable: bool) -> bool {
        let b = &self.blocks[id as usize];
        let remaining = b.size.saturating_sub(size);
        if self.pools[b.pool as usize].small || expandable {
            remaining >= MIN_BLOCK_BYTES
        } else {
            size < self.p.max_split && remaining > SMALL_REQUEST_BYTES
        }
    }

    /// `alloc_found_block`: hands out the front of the block, caching the rest when split.
    fn alloc_found_block(&mut self, a: &Ask, split: bool, count: bool) -> u32 {
        let mut id = a.block;
        if split {
            let rest = self.blocks[id as usize];
            let front = Block { ptr: rest.ptr, size: a.size, next: id, pool: a.pool, stream: a.stream, state: State::Taken, ..rest };
            let new = self.new_block(front);
            if rest.prev != NONE {
                self.blocks[rest.prev as usize].next = new;
            }
            let r = &mut self.blocks[id as usize];
            r.prev = new;
            r.ptr += a.size;
            r.size -= a.size;
            self.insert_free(id);
            id = new;
        }
        self.blocks[id as usize].state = State::Allocated;
        if count {
            self.allocated = self.allocated.saturating_add(self.blocks[id as usize].size);
            let t = self.totals();
            if t.allocated_bytes > self.out.allocated_peak_bytes || self.out.allocated_peak_at.is_none() {
                self.out.allocated_peak_bytes = t.allocated_bytes;
                self.out.allocated_peak_at = Some(self.now);
            }
        }
        id
    }

    /// `free_block`: merges the block with its free neighbours and caches it.
    pub(super) fn free_block(&mut self, id: u32) {
        let b = self.blocks[id as usize];
        for other in [b.prev, b.next] {
            self.try_merge(id, other);
        }
        self.insert_free(id);
    }

    /// `try_merge_blocks`: `dst` takes in `src` when it is free and mapped alike; `dst` is out
    /// of its sets. Returns the bytes taken in.
    pub(super) fn try_merge(&mut self, dst: u32, src: u32) -> u64 {
        if src == NONE {
            return 0;
        }
        let s = self.blocks[src as usize];
        let d = self.blocks[dst as usize];
        let mergeable = match s.state {
            State::Free => d.state != State::Unmapped,
            State::Unmapped => d.state == State::Unmapped,
            _ => false,
        };
        if !mergeable {
            return 0;
        }
        if s.state == State::Free {
            self.remove_free(src);
        } else {
            self.pools[s.pool as usize].unmapped.remove(&(s.stream, s.ptr));
        }
        if d.prev == src {
            self.blocks[dst as usize].ptr = s.ptr;
            self.blocks[dst as usize].prev = s.prev;
            if s.prev != NONE {
                self.blocks[s.prev as usize].next = dst;
            }
        } else {
            self.blocks[dst as usize].next = s.next;
            if s.next != NONE {
                self.blocks[s.next as usize].prev = dst;
            }
        }
        self.blocks[dst as usize].size += s.size;
        self.drop_block(src);
        s.size
    }
}
