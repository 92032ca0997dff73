//! What ran besides memory: operators with their tensors, module scopes, and the interned stack
//! frames allocations carry.

use super::*;

/// A tensor an operator read or wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorRef {
    /// Storage pointer (or another stable id of the storage); 0 when the source has none.
    pub storage_id: u64,
    pub size_bytes: u64,
    /// Index into [`Trace::shapes`]; `u32::MAX` when unknown.
    pub shape: u32,
}

/// An operator execution (forward op, autograd node, optimizer kernel ...).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OperatorEvent {
    pub name: StrId,
    pub phase: Phase,
    /// Autograd sequence number; -1 when the op has none.
    pub seq_nr: i64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub thread: u64,
    /// The forward thread of a backward node (pairs it with its forward op); 0 when unknown.
    pub fwd_thread: u64,
    /// Innermost layer scope (module path) the op ran in.
    pub layer: StrId,
    /// Range into [`Trace::tensors`].
    pub inputs: (u32, u32),
    /// Range into [`Trace::tensors`].
    pub outputs: (u32, u32),
}

/// A named scope: a module path such as `layer1.0.conv1`, `optimizer.step`, an iteration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerScope {
    pub name: StrId,
    pub start_ns: u64,
    pub end_ns: u64,
    /// Nesting depth, 0 for outermost.
    pub depth: u16,
    pub phase: Phase,
    pub thread: u64,
}

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
    pub(super) frame_index: HashMap<Frame, u32>,
    #[serde(skip)]
    pub(super) stack_index: HashMap<Vec<u32>, u32>,
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
