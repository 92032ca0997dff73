//! A safe subset of Python's pickle virtual machine: protocols 0 to 5, plain data only, read
//! from a stream.
//!
//! Memory snapshots are dicts, lists, tuples, strings and numbers; anything that would run
//! Python code (GLOBAL, REDUCE, ...) is refused. Values live in an arena ([`Arena`]) and memo
//! references share the arena slot instead of copying, so a pickle that references one big
//! value many times costs no more memory than its own size.
//!
//! The input is read through a small window ([`input::Input`]), never held whole. Slots count their
//! holders, so that a value nothing holds or names is given back and its slot reused. A
//! [`Hook`] sees every item as it is appended to a list and may keep a compact record of it
//! instead: it points the item's memo key at an opaque id of its own
//! ([`Arena::forget_memo`]) and gives the item up ([`Arena::drop_ref`]), and the item and what
//! only it held go. That is how the snapshot importer holds one compact record per trace entry
//! instead of a dozen values.
//!
//! Here: the ids, the parsed [`Pickle`], the [`Hook`] interface and the entry points
//! ([`parse`], [`parse_stream`]). Elsewhere:
//! - `value.rs`: [`Value`], and integers as the opcodes spell them.
//! - `arena.rs`: [`Arena`] and the memo: slots, holder counts, memo keys.
//! - `read_ahead.rs`: dicts read ahead for a hook ([`FlatDict`], [`FlatValue`]).
//! - `input.rs`: the window over the input, and the longest argument read.
//! - `vm.rs`: the opcode machine.

mod arena;
mod input;
mod read_ahead;
mod value;
mod vm;

pub use arena::Arena;
pub use read_ahead::{FlatDict, FlatValue};
pub use value::Value;

use super::ImportError;
use std::io::Read;

/// Index of a value in the arena, or an opaque id (high bit set) that a [`Hook`] returned.
pub type ValueId = u32;

/// Ids with this bit set are a hook's own (see [`Hook`]); the arena never hands them out.
pub const OPAQUE: ValueId = 1 << 31;
const FIRST_OPAQUE: ValueId = OPAQUE;

/// True if `id` is a hook's opaque id rather than an arena slot.
pub fn is_opaque(id: ValueId) -> bool {
    id & OPAQUE != 0
}

/// A parsed pickle: the arena and the root value.
pub struct Pickle {
    pub arena: Arena,
    pub root: ValueId,
    pub protocol: u8,
    /// Bytes the pickle took, up to and including STOP.
    pub input_bytes: u64,
}

impl std::fmt::Debug for Pickle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pickle")
            .field("root", &self.root)
            .field("protocol", &self.protocol)
            .field("values", &self.arena.values.len())
            .field("input_bytes", &self.input_bytes)
            .finish()
    }
}

impl Pickle {
    pub fn get(&self, id: ValueId) -> &Value {
        self.arena.get(id)
    }

    pub fn dict_pick<const N: usize>(&self, id: ValueId, keys: [&str; N]) -> [Option<ValueId>; N] {
        self.arena.dict_pick(id, keys)
    }

    pub fn dict_get(&self, id: ValueId, key: &str) -> Option<ValueId> {
        self.arena.dict_get(id, key)
    }
}

/// Sees every item appended to a list while the pickle is read.
pub trait Hook {
    /// True if [`Hook::flat_dict`] may take dicts: the machine then reads ahead at every dict
    /// that is about to be appended to a list.
    const TAKES_FLAT_DICTS: bool = false;

    /// `item` is about to be appended to the list `list`; returns what to append instead: the
    /// item itself, or an opaque id (with [`OPAQUE`] set) after [`Arena::drop_ref`] gave the
    /// item's reference up (and [`Arena::forget_memo`] pointed its memo key at the opaque id).
    fn append(&mut self, arena: &mut Arena, list: ValueId, item: ValueId) -> Result<ValueId, ImportError>;

    /// A dict about to be appended to a list, read ahead whole before any slot is made for it
    /// (see [`FlatDict`]). Returns the opaque ids that the dict's memo key, and its fresh list's
    /// if it has one, are to name instead of values: the dict is then never built, and what
    /// [`Hook::append`] would have done with it is done. `None` leaves no trace: the dict's
    /// opcodes then run one by one, and [`Hook::append`] sees it. A hook that took the
    /// dict may have called [`Arena::forget_memo`] on the values it names.
    fn flat_dict(&mut self, _arena: &mut Arena, _dict: &FlatDict) -> Option<FlatTaken> {
        None
    }
}

/// What a [`Hook`] that took a [`FlatDict`] makes the memo name.
pub struct FlatTaken {
    /// An opaque id, for the dict.
    pub dict: ValueId,
    /// An opaque id for the dict's fresh list, or `None` to build that list as usual.
    pub list: Option<ValueId>,
}

/// Keeps every value.
pub struct KeepAll;

impl Hook for KeepAll {
    fn append(&mut self, _: &mut Arena, _: ValueId, item: ValueId) -> Result<ValueId, ImportError> {
        Ok(item)
    }
}

/// Parses a whole pickle held in memory into plain values.
pub fn parse(data: &[u8]) -> Result<Pickle, ImportError> {
    parse_stream(data, Some(data.len() as u64), &mut KeepAll)
}

/// Parses a pickle read from `src`, passing every list item through `hook`. `size_hint` is the
/// input's length when known: it caps the arena's growth (see [`Arena`]).
pub fn parse_stream(src: impl Read, size_hint: Option<u64>, hook: &mut impl Hook) -> Result<Pickle, ImportError> {
    vm::run(src, size_hint, hook)
}
