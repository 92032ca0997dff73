//! The allocator state a replay starts from: the segments a snapshot taken mid-run already
//! had, ordinary or ranges of expandable segments.

use super::requests::DeviceRequests;
use super::sim::{Block, ExpSeg, Sim, State, NONE};
use crate::allocator::{SMALL_REQUEST_BYTES, SMALL_SEGMENT_BYTES};
use crate::model::{BlockState, Pool, SegmentInfo};
use std::collections::BTreeMap;

/// A block of an initial segment, before it becomes a `Block`.
struct Part {
    ptr: u64,
    size: u64,
    state: State,
}

impl Sim {
    /// Loads the initial segments. Expandable ones stay expandable only if the configuration
    /// replayed has expandable segments: a what-if without them asks what a run that never
    /// had them would do, and the closest such start is ordinary segments of the same extent.
    pub(super) fn load_initial(&mut self, dev: &DeviceRequests) {
        if !dev.initial_expandable || !self.p.expandable {
            for seg in &dev.initial_segments {
                self.load_segment(seg);
            }
            return;
        }
        // Each stream's and pool's mapped ranges are one expandable segment's.
        let mut groups: BTreeMap<(u16, bool, Option<u16>), Vec<&SegmentInfo>> = BTreeMap::new();
        for seg in &dev.initial_segments {
            groups.entry((seg.stream, seg.pool == Pool::Small, seg.private_pool)).or_default().push(seg);
        }
        for ((_, small, _), mut ranges) in groups {
            ranges.sort_by_key(|s| s.address);
            let page = if small { SMALL_SEGMENT_BYTES } else { dev.initial_large_page_bytes.max(SMALL_SEGMENT_BYTES) };
            if !self.load_expandable(&ranges, page) {
                for seg in ranges {
                    self.load_segment(seg);
                }
            }
        }
    }

    /// The pool an initial segment belongs to.
    fn pool_of(&mut self, seg: &SegmentInfo) -> u32 {
        let size = if seg.pool == Pool::Small { SMALL_REQUEST_BYTES } else { SMALL_REQUEST_BYTES + 1 };
        let pool = self.get_pool(size, seg.private_pool);
        if let Some(pp) = self.private_of(pool) {
            pp.mallocs += 1;
        }
        pool
    }

    /// An ordinary segment with its blocks; the space no block covers is free.
    fn load_segment(&mut self, seg: &SegmentInfo) {
        let Some(end) = seg.address.checked_add(seg.size_bytes).filter(|_| seg.size_bytes > 0) else { return };
        if !self.claim(seg.address, seg.size_bytes) {
            self.out.anomalies.overlapping_segments += 1;
            return;
        }
        let pool = self.pool_of(seg);
        let parts = parts_of(seg, seg.address, end);
        self.chain(&parts, pool, seg.stream, NONE);
        self.segments += 1;
        self.grow_reserved(seg.size_bytes);
    }

    /// Mapped ranges of one expandable segment whose reserve starts at the first; `false` when
    /// they cannot be one (not in whole pages, overlapping).
    fn load_expandable(&mut self, ranges: &[&SegmentInfo], page: u64) -> bool {
        let base = ranges[0].address;
        let mut cursor = base;
        for r in ranges {
            let aligned = (r.address - base).is_multiple_of(page) && r.size_bytes.is_multiple_of(page) && r.size_bytes > 0;
            if r.address < cursor || !aligned {
                return false;
            }
            cursor = r.address + r.size_bytes;
        }
        let reserve = self.p.reserve.div_ceil(page).saturating_mul(page).max(cursor - base);
        if !self.claim(base, reserve) {
            return false;
        }
        let pool = self.pool_of(ranges[0]);
        let seg = self.segs.len() as u32;
        let mut parts = Vec::new();
        let mut at = base;
        let mut mapped = 0u64;
        for r in ranges {
            if r.address > at {
                parts.push(Part { ptr: at, size: r.address - at, state: State::Unmapped });
            }
            parts.extend(parts_of(r, r.address, r.address + r.size_bytes));
            at = r.address + r.size_bytes;
            mapped += r.size_bytes;
        }
        if base + reserve > at {
            parts.push(Part { ptr: at, size: base + reserve - at, state: State::Unmapped });
        }
        self.segs.push(ExpSeg { base, page, mapped });
        self.chain(&parts, pool, ranges[0].stream, seg);
        self.segments += 1;
        self.grow_reserved(mapped);
        true
    }

    /// Links `parts` into one segment's blocks and files each where it belongs.
    fn chain(&mut self, parts: &[Part], pool: u32, stream: u16, seg: u32) {
        let mut prev = NONE;
        for p in parts {
            let id = self.new_block(Block { ptr: p.ptr, size: p.size, gc_base: 0, prev, next: NONE, pool, seg, stream, state: p.state });
            if prev != NONE {
                self.blocks[prev as usize].next = id;
            }
            match p.state {
                State::Allocated | State::Pending => self.track_initial(p.ptr, id),
                State::Unmapped => {
                    self.pools[pool as usize].unmapped.insert((stream, p.ptr), id);
                }
                State::Free | State::Taken => self.insert_free(id),
            }
            prev = id;
        }
    }
}

/// The blocks of `seg` within `[start, end)` in address order, gaps as free blocks and
/// neighbouring free blocks as one (as the allocator keeps them).
fn parts_of(seg: &SegmentInfo, start: u64, end: u64) -> Vec<Part> {
    let mut blocks: Vec<_> = seg.blocks.iter().filter(|b| b.address >= start && b.address < end && b.size_bytes > 0).collect();
    blocks.sort_by_key(|b| b.address);
    let mut parts: Vec<Part> = Vec::new();
    let mut cursor = start;
    let push = |parts: &mut Vec<Part>, ptr: u64, size: u64, state: State| match parts.last_mut() {
        Some(last) if last.state == State::Free && state == State::Free => last.size += size,
        _ => parts.push(Part { ptr, size, state }),
    };
    for b in blocks {
        if b.address < cursor {
            continue;
        }
        if b.address > cursor {
            push(&mut parts, cursor, b.address - cursor, State::Free);
        }
        let size = b.size_bytes.min(end - b.address);
        let state = match b.state {
            BlockState::Allocated => State::Allocated,
            BlockState::PendingFree => State::Pending,
            BlockState::Free => State::Free,
        };
        push(&mut parts, b.address, size, state);
        cursor = b.address + size;
    }
    if cursor < end {
        push(&mut parts, cursor, end - cursor, State::Free);
    }
    parts
}
