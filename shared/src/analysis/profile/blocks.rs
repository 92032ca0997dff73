//! Allocation blocks of the main device: one per alloc/free pair (or per block alive before
//! recording), found again by storage address and time when an op's tensors are matched.

use crate::model::{EventType, Phase, Trace, INPUT_LAYER};
use std::collections::HashMap;

/// Block of an event that is not one of the main device's allocs or frees.
pub(super) const NO_BLOCK: u32 = u32::MAX;

/// One allocation's life.
#[derive(Clone, Debug)]
pub(super) struct Block {
    pub size_bytes: u64,
    /// `None`: alive before recording.
    pub alloc_ts: Option<u64>,
    pub free_ts: Option<u64>,
    pub alloc_phase: Phase,
    pub alloc_layer_is_input: bool,
    /// Known from an event (counted in the totals) rather than only seen in an op's tensors.
    pub from_event: bool,
}

/// Every block of the main device, by address.
pub(super) struct Blocks {
    pub blocks: Vec<Block>,
    /// Block of each event of the main device (`NO_BLOCK` for the others and non-block events).
    pub event_block: Vec<u32>,
    by_address: HashMap<u64, Vec<u32>>,
}

impl Blocks {
    /// Takes a trace and its main device; gives the blocks its alloc and free events make.
    pub fn build(trace: &Trace, device: u8) -> Self {
        let ev = &trace.events;
        let input = trace.strings.lookup(INPUT_LAYER);
        let mut blocks = Vec::new();
        let mut event_block = vec![NO_BLOCK; ev.len()];
        let mut by_address: HashMap<u64, Vec<u32>> = HashMap::new();
        let mut open: HashMap<u64, u32> = HashMap::new();
        for (i, slot) in event_block.iter_mut().enumerate() {
            if ev.device[i] != device {
                continue;
            }
            let (addr, ts) = (ev.address[i], ev.ts_ns[i]);
            match ev.event_type(i) {
                EventType::Alloc => {
                    let id = blocks.len() as u32;
                    blocks.push(Block {
                        size_bytes: ev.size_bytes[i],
                        alloc_ts: Some(ts),
                        free_ts: None,
                        alloc_phase: ev.phase(i),
                        alloc_layer_is_input: Some(ev.layer[i]) == input,
                        from_event: true,
                    });
                    // A second alloc at an open address means the free was lost: close it.
                    if let Some(old) = open.insert(addr, id) {
                        blocks[old as usize].free_ts.get_or_insert(ts);
                    }
                    by_address.entry(addr).or_default().push(id);
                    *slot = id;
                }
                EventType::Free => {
                    let id = match open.remove(&addr) {
                        Some(id) => id,
                        None => {
                            // Alive before recording: it starts at minus infinity.
                            let id = blocks.len() as u32;
                            blocks.push(Block {
                                size_bytes: ev.size_bytes[i],
                                alloc_ts: None,
                                free_ts: None,
                                alloc_phase: Phase::Other,
                                alloc_layer_is_input: false,
                                from_event: true,
                            });
                            by_address.entry(addr).or_default().insert(0, id);
                            id
                        }
                    };
                    blocks[id as usize].free_ts = Some(ts);
                    *slot = id;
                }
                _ => {}
            }
        }
        Self { blocks, event_block, by_address }
    }

    /// The block at `addr` alive at `ts`, among those already known.
    pub fn find(&self, addr: u64, ts: u64) -> Option<u32> {
        let list = self.by_address.get(&addr)?;
        let k = list.partition_point(|&b| self.blocks[b as usize].alloc_ts.is_none_or(|a| a <= ts));
        let b = *list.get(k.checked_sub(1)?)?;
        self.blocks[b as usize].free_ts.is_none_or(|f| f >= ts).then_some(b)
    }

    /// The block at `addr` alive at `ts`; a storage never seen in the events becomes a block
    /// alive before recording (not counted in the totals: its size is only what the op saw).
    pub fn lookup(&mut self, addr: u64, size_bytes: u64, ts: u64) -> Option<u32> {
        if addr == 0 {
            return None;
        }
        if let Some(list) = self.by_address.get(&addr) {
            let first_alloc = self.blocks[list[0] as usize].alloc_ts;
            if first_alloc.is_none_or(|a| a <= ts) {
                // Known address: the block alive then, or none (a stale pointer).
                return self.find(addr, ts);
            }
        }
        let id = self.blocks.len() as u32;
        self.blocks.push(Block {
            size_bytes,
            alloc_ts: None,
            free_ts: None,
            alloc_phase: Phase::Other,
            alloc_layer_is_input: false,
            from_event: false,
        });
        self.by_address.entry(addr).or_default().insert(0, id);
        Some(id)
    }
}
