//! Text attached to events: user metadata, annotations, the allocator's own tags.

use super::StrId;
use serde::{Deserialize, Serialize};

/// What kind of text an [`EventNote`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoteKind {
    /// The thread's metadata when the event happened (`torch.cuda.memory._set_memory_metadata`):
    /// text, or compact JSON text when a dict was set.
    UserMetadata,
    /// Attached later to the live allocation the event made
    /// (`torch.cuda.memory._annotate_tensor`), at `ts_ns`, from the stack `stack`.
    Annotation,
    /// A tag of the allocator's own (`internal_metadata`, e.g. `mallocWithAddress`).
    Internal,
}

/// Text attached to one event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventNote {
    /// Index of the event: for an annotation, the allocation it names.
    pub event: u32,
    pub kind: NoteKind,
    pub text: StrId,
    /// When the text was attached (the event's own time, or the annotation's).
    pub ts_ns: u64,
    /// The annotating call's stack (index into
    /// [`StackTable::stacks`](super::StackTable::stacks)), for annotations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<u32>,
}
