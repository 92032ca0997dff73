//! Expandable segments (`expandable_segments:True`): one reserve of address space per stream
//! and pool, mapped and unmapped in pages (2 MiB in the small pool, `large_segment_size` in
//! the large one), as `ExpandableSegment`, `try_allocate_expandable_block`, `map_block` and
//! `unmap_block` do it.

use super::sim::{Ask, Block, ExpSeg, Sim, State, NONE};
use crate::allocator::SMALL_SEGMENT_BYTES;

impl Sim {
    /// `try_allocate_expandable_block`: maps pages until a free block of the request's size
    /// lies at the lowest address that can hold it.
    pub(super) fn try_allocate_expandable(&mut self, a: &Ask) -> Option<u32> {
        let mut c = self.find_expandable_block(a)?;
        if self.blocks[c as usize].state == State::Unmapped {
            let size = self.blocks[c as usize].size.min(a.size);
            if !self.map_block(c, size) {
                return None;
            }
        }
        while self.blocks[c as usize].size < a.size {
            let next = self.blocks[c as usize].next;
            if next == NONE || self.blocks[next as usize].state != State::Unmapped {
                return None;
            }
            let remaining = a.size - self.blocks[c as usize].size;
            let size = remaining.min(self.blocks[next as usize].size);
            if !self.map_block(next, size) {
                return None;
            }
            c = next;
        }
        self.remove_free(c);
        self.blocks[c as usize].state = State::Taken;
        Some(c)
    }

    fn allocatable(&self, id: u32) -> bool {
        id != NONE && matches!(self.blocks[id as usize].state, State::Free | State::Unmapped)
    }

    /// `find_expandable_block`: the lowest unmapped range of this stream's segments (with the
    /// free block before it) that has room for the request, or a new segment.
    fn find_expandable_block(&mut self, a: &Ask) -> Option<u32> {
        let pool = &self.pools[a.pool as usize];
        let candidates: Vec<u32> = pool.unmapped.range((a.stream, 0)..).take_while(|(k, _)| k.0 == a.stream).map(|(_, &id)| id).collect();
        for id in candidates {
            let prev = self.blocks[id as usize].prev;
            let start = if self.allocatable(prev) { prev } else { id };
            let mut bytes = 0u64;
            let mut b = start;
            while bytes < a.size && self.allocatable(b) {
                bytes = bytes.saturating_add(self.blocks[b as usize].size);
                b = self.blocks[b as usize].next;
            }
            if bytes >= a.size {
                return Some(start);
            }
        }
        let page = if self.pools[a.pool as usize].small { SMALL_SEGMENT_BYTES } else { self.p.large_segment };
        let size = self.p.reserve.div_ceil(page).saturating_mul(page);
        // A single allocation cannot span segments (PyTorch 2.15 fails it the same way).
        if size < a.size {
            return None;
        }
        let base = self.place(a.hint, size)?;
        let seg = self.segs.len() as u32;
        self.segs.push(ExpSeg { base, page, mapped: 0 });
        let b = Block { ptr: base, size, gc_base: 0, prev: NONE, next: NONE, pool: a.pool, seg, stream: a.stream, state: State::Unmapped };
        let id = self.new_block(b);
        self.pools[a.pool as usize].unmapped.insert((a.stream, base), id);
        Some(id)
    }

    /// `map_block`: backs the first `size` bytes of an unmapped block (rounded up to pages)
    /// with memory and caches them, merged with a free block before. `false` when the device
    /// has no room for the pages.
    pub(super) fn map_block(&mut self, id: u32, size: u64) -> bool {
        let b = self.blocks[id as usize];
        let seg = self.segs[b.seg as usize];
        let begin = (b.ptr - seg.base) / seg.page;
        let end = (b.ptr - seg.base).saturating_add(size).div_ceil(seg.page);
        let bytes = (end - begin).saturating_mul(seg.page).min(b.size);
        if bytes == 0 || self.p.capacity.is_some_and(|c| self.reserved.saturating_add(bytes) > c) {
            return false;
        }
        self.pools[b.pool as usize].unmapped.remove(&(b.stream, b.ptr));
        self.blocks[id as usize].state = State::Taken;
        if bytes < b.size {
            let rest = Block { ptr: b.ptr + bytes, size: b.size - bytes, prev: id, next: b.next, state: State::Unmapped, ..b };
            let r = self.new_block(rest);
            if b.next != NONE {
                self.blocks[b.next as usize].prev = r;
            }
            self.blocks[id as usize].next = r;
            self.blocks[id as usize].size = bytes;
            self.pools[b.pool as usize].unmapped.insert((rest.stream, rest.ptr), r);
        }
        let (prev, next) = (self.blocks[id as usize].prev, self.blocks[id as usize].next);
        self.try_merge(id, prev);
        self.try_merge(id, next);
        self.insert_free(id);
        if seg.mapped == 0 {
            self.segments += 1;
        }
        self.segs[b.seg as usize].mapped += bytes;
        self.out.device_allocs += 1;
        self.grow_reserved(bytes);
        true
    }

    /// `unmap_block`: gives back the whole pages inside a cached expandable block; what lies
    /// before and after them stays cached.
    pub(super) fn unmap_block(&mut self, id: u32) {
        let b = self.blocks[id as usize];
        let seg = self.segs[b.seg as usize];
        let begin = (b.ptr - seg.base).div_ceil(seg.page);
        let end = (b.ptr - seg.base + b.size) / seg.page;
        if begin >= end {
            return;
        }
        self.remove_free(id);
        let start = seg.base + begin * seg.page;
        let bytes = (end - begin) * seg.page;
        let before = start - b.ptr;
        let after = b.size - before - bytes;
        if before > 0 {
            let front = self.new_block(Block { size: before, next: id, state: State::Taken, ..b });
            if b.prev != NONE {
                self.blocks[b.prev as usize].next = front;
            }
            self.blocks[id as usize].prev = front;
            self.insert_free(front);
        }
        if after > 0 {
            let back = self.new_block(Block { ptr: start + bytes, size: after, prev: id, state: State::Taken, ..b });
            if b.next != NONE {
                self.blocks[b.next as usize].prev = back;
            }
            self.blocks[id as usize].next = back;
            self.insert_free(back);
        }
        let blk = &mut self.blocks[id as usize];
        blk.ptr = start;
        blk.size = bytes;
        blk.state = State::Unmapped;
        let (prev, next) = (blk.prev, blk.next);
        self.try_merge(id, prev);
        self.try_merge(id, next);
        let blk = self.blocks[id as usize];
        self.pools[blk.pool as usize].unmapped.insert((blk.stream, blk.ptr), id);
        let s = &mut self.segs[b.seg as usize];
        s.mapped = s.mapped.saturating_sub(bytes);
        if s.mapped == 0 {
            self.segments = self.segments.saturating_sub(1);
        }
        if let Some(pp) = self.private_of(b.pool) {
            pp.mallocs -= 1;
        }
        self.out.device_frees += 1;
        self.shrink_reserved(bytes);
    }

    /// `release_expandable_segment`: a segment with nothing mapped gives back its addresses.
    pub(super) fn release_expandable_segment(&mut self, id: u32) {
        let b = self.blocks[id as usize];
        self.pools[b.pool as usize].unmapped.remove(&(b.stream, b.ptr));
        let base = self.segs[b.seg as usize].base;
        self.unplace(base);
        self.drop_block(id);
    }
}
