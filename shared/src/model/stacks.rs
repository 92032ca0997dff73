//! Call stacks of allocations, interned: each frame once, each stack a list of frame indices.

use super::StrId;
use crate::hash::FastMap as HashMap;
use serde::{Deserialize, Serialize};

/// One stack frame of an allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Frame {
    pub name: StrId,
    pub filename: StrId,
    pub line: u32,
}

/// Call stacks, interned: frames once, stacks as lists of frame indices (innermost first).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StackTable {
    pub frames: Vec<Frame>,
    /// Each stack is `frame_ids[start..end]`.
    pub stacks: Vec<(u32, u32)>,
    pub frame_ids: Vec<u32>,
    /// (event index, stack index), sorted by event index.
    pub event_stacks: Vec<(u32, u32)>,
    #[serde(skip)]
    frame_index: HashMap<Frame, u32>,
    #[serde(skip)]
    stack_index: HashMap<Vec<u32>, u32>,
}

impl StackTable {
    pub fn intern_frame(&mut self, f: Frame) -> u32 {
        *self.frame_index.entry(f).or_insert_with(|| {
            self.frames.push(f);
            (self.frames.len() - 1) as u32
        })
    }

    pub fn intern_stack(&mut self, frame_ids: Vec<u32>) -> u32 {
        if let Some(&id) = self.stack_index.get(&frame_ids) {
            return id;
        }
        let start = self.frame_ids.len() as u32;
        self.frame_ids.extend_from_slice(&frame_ids);
        self.stacks.push((start, self.frame_ids.len() as u32));
        let id = (self.stacks.len() - 1) as u32;
        self.stack_index.insert(frame_ids, id);
        id
    }

    /// The frames of stack `id`, innermost first.
    pub fn stack(&self, id: u32) -> impl Iterator<Item = &Frame> {
        self.stack_frame_ids(id).iter().filter_map(|&f| self.frames.get(f as usize))
    }

    /// The frame indices of stack `id`, innermost first (empty for an unknown stack).
    pub fn stack_frame_ids(&self, id: u32) -> &[u32] {
        let (s, e) = self.stacks.get(id as usize).copied().unwrap_or((0, 0));
        self.frame_ids.get(s as usize..e as usize).unwrap_or(&[])
    }

    /// The stack recorded for event `event`, if any.
    pub fn stack_of_event(&self, event: usize) -> Option<u32> {
        self.event_stacks.binary_search_by_key(&(event as u32), |&(e, _)| e).ok().map(|i| self.event_stacks[i].1)
    }

    pub fn heap_bytes(&self) -> usize {
        self.frames.capacity() * std::mem::size_of::<Frame>()
            + self.stacks.capacity() * 8
            + self.frame_ids.capacity() * 4
            + self.event_stacks.capacity() * 8
            + self.frame_index.capacity() * (std::mem::size_of::<Frame>() + 4 + 8)
            + self.stack_index.keys().map(|k| k.capacity() * 4 + 24 + 4 + 8).sum::<usize>()
    }

    pub(crate) fn drop_indexes(&mut self) {
        self.frame_index = HashMap::default();
        self.stack_index = HashMap::default();
    }
}
