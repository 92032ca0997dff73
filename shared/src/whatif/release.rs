//! Giving cached memory back to the device: `release_available_cached_blocks` and
//! `release_cached_blocks` (the out-of-memory retries and `empty_cache`), and
//! `garbage_collect_cached_blocks`.

use super::sim::{Ask, Sim, State, LARGE, NONE, SMALL};

impl Sim {
    /// `release_available_cached_blocks`: with a `max_split_size`, frees the smallest cached
    /// oversize block that covers the request, or else oversize blocks from the largest down
    /// until their sizes add up to it.
    pub(super) fn release_available_cached_blocks(&mut self, a: &Ask) -> bool {
        let max_split = self.p.max_split;
        if max_split == u64::MAX {
            return false;
        }
        let want = a.size.max(max_split);
        let pool = a.pool as usize;
        let lower = (a.stream, want, 0u64);
        let first = self.pools[pool].blocks.range(lower..).next().map(|(k, &id)| (k.0, id));
        match first {
            Some((s, id)) if s == a.stream && self.blocks[id as usize].seg == NONE => {
                if self.blocks[id as usize].is_split() {
                    return false;
                }
                self.release_block(id);
                true
            }
            _ => {
                let mut released = 0u64;
                let mut cursor = lower;
                while released < want {
                    let Some((&k, &id)) = self.pools[pool].blocks.range(..cursor).next_back() else { break };
                    let b = self.blocks[id as usize];
                    if b.size < max_split || b.stream != a.stream {
                        break;
                    }
                    cursor = k;
                    if b.seg == NONE && !b.is_split() {
                        released = released.saturating_add(b.size);
                        self.release_block(id);
                    }
                }
                released >= want
            }
        }
    }

    /// `release_cached_blocks`: completes held-back frees, then gives back every cached segment
    /// with no block in use (unmapping the free pages of expandable ones), in the default
    /// pools and in the private pools whose owners are gone.
    pub(super) fn release_cached_blocks(&mut self) -> bool {
        let mut pending: Vec<(u64, u32)> = self.pending.drain().collect();
        pending.sort_unstable();
        for (_, id) in pending {
            self.free_block(id);
        }
        self.release_blocks(LARGE);
        self.release_blocks(SMALL);
        let freeable: Vec<u16> = self.private.iter().filter(|(_, pp)| pp.freeable).map(|(&p, _)| p).collect();
        for p in freeable {
            let Some((small, large)) = self.private.get(&p).map(|pp| (pp.small, pp.large)) else { continue };
            self.release_blocks(small);
            self.release_blocks(large);
            if self.private.get(&p).is_some_and(|pp| pp.mallocs == 0) {
                self.private.remove(&p);
            }
        }
        true
    }

    /// `release_blocks`: every unsplit cached block goes back; expandable blocks give back
    /// their whole free pages, and a segment left with nothing mapped goes with them.
    fn release_blocks(&mut self, pool: u32) {
        let ids: Vec<u32> = self.pools[pool as usize].blocks.values().copied().collect();
        let mut to_unmap = Vec::new();
        for id in ids {
            let b = self.blocks[id as usize];
            if b.seg != NONE {
                to_unmap.push(id);
            } else if !b.is_split() {
                self.release_block(id);
            }
        }
        for id in to_unmap {
            self.unmap_block(id);
            let b = self.blocks[id as usize];
            if b.state == State::Unmapped && !b.is_split() {
                self.release_expandable_segment(id);
            }
        }
    }

    /// `release_block`: cudaFree of a whole cached segment.
    pub(super) fn release_block(&mut self, id: u32) {
        let b = self.blocks[id as usize];
        self.remove_free(id);
        self.unplace(b.ptr);
        if let Some(pp) = self.private_of(b.pool) {
            pp.mallocs -= 1;
        }
        self.segments = self.segments.saturating_sub(1);
        self.out.device_frees += 1;
        self.shrink_reserved(b.size);
        self.drop_block(id);
    }

    /// `garbage_collect_cached_blocks`: above `garbage_collection_threshold` × the allowed
    /// memory, frees the default large pool's unsplit cached blocks that have waited at least
    /// the average number of lookups, again and again, until enough is reclaimed.
    pub(super) fn garbage_collect(&mut self) {
        let Some(allowed) = self.p.allowed else { return };
        let threshold = (self.p.gc * allowed as f64) as u64;
        if self.reserved <= threshold {
            return;
        }
        let target = self.reserved - threshold;
        let calls = self.pools[LARGE as usize].calls;
        let age = |s: &Sim, id: u32| calls.saturating_sub(s.blocks[id as usize].gc_base);
        let mut total_age = 0u64;
        let mut count = 0u64;
        for &id in self.pools[LARGE as usize].blocks.values() {
            if !self.blocks[id as usize].is_split() {
                total_age = total_age.saturating_add(age(self, id));
                count += 1;
            }
        }
        let mut reclaimed = 0u64;
        let mut freed = true;
        while reclaimed < target && freed && count > 0 {
            let threshold_age = total_age as f64 / count as f64;
            freed = false;
            let ids: Vec<u32> = self.pools[LARGE as usize].blocks.values().copied().collect();
            for id in ids {
                let b = self.blocks[id as usize];
                let a = age(self, id);
                if !b.is_split() && b.seg == NONE && a as f64 >= threshold_age {
                    freed = true;
                    reclaimed = reclaimed.saturating_add(b.size);
                    total_age = total_age.saturating_sub(a);
                    count -= 1;
                    self.release_block(id);
                }
            }
        }
    }
}
