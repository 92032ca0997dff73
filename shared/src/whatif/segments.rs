//! The simulated allocator's segment map at a moment: what the viewer's Segments view draws
//! beside the recorded one, under another `PYTORCH_CUDA_ALLOC_CONF`.

use super::conf::{AllocConf, ConfError};
use super::outcome::SimOptions;
use super::requests::DeviceRequests;
use super::sim::{Sim, State, NONE};
use crate::model::{BlockInfo, BlockState, Pool, SegmentInfo};

/// The segments of `dev`'s simulated allocator (configured by `conf`) once every request whose
/// event is at or before `event` has been served, as [`crate::analysis::segments_at`] gives the
/// recorded ones: in address order, each with its blocks in address order. `None`: before the
/// first request (the initial segments). An expandable segment is listed as its mapped ranges,
/// one segment each, as a snapshot lists them.
///
/// Fails only for a configuration the model cannot replay (`backend:cudaMallocAsync`).
pub fn segments_after(
    dev: &DeviceRequests,
    conf: &AllocConf,
    opts: &SimOptions,
    event: Option<u32>,
) -> Result<Vec<SegmentInfo>, ConfError> {
    let mut sim = Sim::start(dev, conf, opts)?;
    if let Some(event) = event {
        for (k, r) in dev.requests.iter().enumerate().take_while(|(_, r)| r.event <= event) {
            sim.step(k, r, dev);
        }
    }
    Ok(sim.segment_map(dev.device))
}

impl Sim {
    /// Every segment's blocks, walked from each segment's first block.
    fn segment_map(&self, device: u8) -> Vec<SegmentInfo> {
        let mut dropped = vec![false; self.blocks.len()];
        for &id in &self.spare {
            dropped[id as usize] = true;
        }
        let mut out = Vec::new();
        for (first, b) in self.blocks.iter().enumerate() {
            if dropped[first] || b.prev != NONE {
                continue;
            }
            let pool = &self.pools[b.pool as usize];
            let new_segment = |address: u64| SegmentInfo {
                address,
                size_bytes: 0,
                device,
                stream: b.stream,
                pool: if pool.small { Pool::Small } else { Pool::Large },
                blocks: Vec::new(),
                private_pool: pool.private,
            };
            let mut range: Option<SegmentInfo> = None;
            let mut id = first as u32;
            while id != NONE {
                let blk = &self.blocks[id as usize];
                let state = match blk.state {
                    State::Allocated => Some(BlockState::Allocated),
                    State::Pending => Some(BlockState::PendingFree),
                    State::Free | State::Taken => Some(BlockState::Free),
                    State::Unmapped => None,
                };
                match state {
                    // Unmapped address space ends a mapped range.
                    None => out.extend(range.take()),
                    Some(state) => {
                        let seg = range.get_or_insert_with(|| new_segment(blk.ptr));
                        seg.size_bytes += blk.size;
                        seg.blocks.push(BlockInfo { address: blk.ptr, size_bytes: blk.size, state });
                    }
                }
                id = blk.next;
            }
            out.extend(range);
        }
        out.sort_by_key(|s| s.address);
        out
    }
}
