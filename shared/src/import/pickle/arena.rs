//! The arena of values and the memo: slots count their holders and are given back once nothing
//! holds or names them.

use super::value::Value;
use super::{is_opaque, ValueId, FIRST_OPAQUE};

/// The pickle memo. Pickler writes keys 0, 1, 2, ... so they live in a vector; other keys
/// (legal, but never written by Python) go to a map. The vector only grows by appending, so
/// its length is bounded by the number of PUTs, each of which costs at least two input bytes:
/// a hostile key cannot make it large.
#[derive(Default)]
pub(super) struct Memo {
    dense: Vec<ValueId>,
    sparse: crate::hash::FastMap<u32, ValueId>,
    /// Distinct keys defined (MEMOIZE uses it as its key).
    pub(super) count: u32,
}

impl Memo {
    fn insert(&mut self, key: u32, id: ValueId) {
        let k = key as usize;
        let fresh = if k < self.dense.len() {
            self.dense[k] = id;
            false
        } else if k == self.dense.len() && !self.sparse.contains_key(&key) {
            self.dense.push(id);
            true
        } else {
            self.sparse.insert(key, id).is_none()
        };
        if fresh {
            self.count = self.count.saturating_add(1);
        }
    }

    pub(super) fn get(&self, key: u32) -> Option<ValueId> {
        match self.dense.get(key as usize) {
            Some(v) => Some(*v),
            None => self.sparse.get(&key).copied(),
        }
    }
}

/// [`Arena::memo_key_of`] of a slot that no memo key names alone.
const NO_KEY: u32 = u32::MAX;

/// What a hook's opaque id reads as through [`Arena::get`].
static OPAQUE_VALUE: Value = Value::None;

/// Set on a slot that a memo key names (the key is in [`Arena::memo_key_of`] for containers).
const MEMOIZED: u8 = 1;
/// Set on a slot that is never given back: a memoized string or scalar, a value that two memo
/// keys named, the first memoized string of its text.
const PINNED: u8 = 2;
/// Set on a slot given back to the arena, until it is reused.
const FREED: u8 = 4;

/// The values of a pickle, with the memo. Every slot counts its holders (the stack, containers);
/// a slot that no holder and no memo key names any more is given back and reused.
#[derive(Default)]
pub struct Arena {
    pub(super) values: Vec<Value>,
    flags: Vec<u8>,
    refs: Vec<u32>,
    free: Vec<ValueId>,
    pub(super) memo: Memo,
    /// The memo key of each slot's container ([`NO_KEY`] if none), so that [`Arena::forget_memo`]
    /// can point the key at a hook's opaque id.
    memo_key_of: Vec<u32>,
    /// [`Arena::release`]'s work list, kept to save an allocation per release.
    work: Vec<ValueId>,
    /// The first memoized string of each text (see [`Arena::memoize`]).
    pub(super) strings: crate::hash::FastMap<Box<str>, ValueId>,
    /// The shared slots of the ints 0 to 255, None, True and False.
    pub(super) small: Vec<Option<ValueId>>,
    /// Set when a memo key already bound is bound again (PUT of a used index: Python never
    /// writes one), so that what remembers values by the keys that named them forgets them.
    pub(super) rebound: bool,
    /// How many memo keys hooks forgot ([`Arena::forget_memo`]): a value a dict named can only
    /// be left to free ([`Arena::settle`]) by a hook forgetting a key.
    pub(super) forgotten: u64,
}

impl Arena {
    /// An empty arena, its shared slots of small values not made yet.
    pub(super) fn new() -> Arena {
        Arena { small: vec![None; 259], ..Arena::default() }
    }

    /// The value `id`; a hook's opaque id reads as `None`.
    pub fn get(&self, id: ValueId) -> &Value {
        self.values.get(id as usize).unwrap_or(&OPAQUE_VALUE)
    }

    pub(super) fn get_mut(&mut self, id: ValueId) -> Option<&mut Value> {
        self.values.get_mut(id as usize)
    }

    /// How many holders (the stack, containers) `id` has; 0 for an opaque id.
    pub fn refs(&self, id: ValueId) -> u32 {
        self.refs.get(id as usize).copied().unwrap_or(0)
    }

    /// True if `id` stays in its slot until the parse ends (a memo key names it, or it is
    /// pinned): a cache keyed by slot may remember it until [`Arena::forget_memo`].
    pub fn is_named(&self, id: ValueId) -> bool {
        self.flags.get(id as usize).is_some_and(|&f| f & (MEMOIZED | PINNED) != 0)
    }

    pub(super) fn add_ref(&mut self, id: ValueId) {
        if let Some(r) = self.refs.get_mut(id as usize) {
            *r = r.saturating_add(1);
        }
    }

    /// Keeps `id` in its slot until the parse ends.
    pub fn pin(&mut self, id: ValueId) {
        if let Some(f) = self.flags.get_mut(id as usize) {
            *f |= PINNED;
        }
    }

    pub(super) fn alloc(&mut self, v: Value, size_hint: Option<u64>) -> Result<ValueId, String> {
        if let Some(id) = self.free.pop() {
            self.values[id as usize] = v;
            self.flags[id as usize] = 0;
            self.refs[id as usize] = 1;
            self.memo_key_of[id as usize] = NO_KEY;
            return Ok(id);
        }
        // Ids stay below `2^31 - 1`, so that an id with the high bit set is never `u32::MAX`.
        if self.values.len() >= FIRST_OPAQUE as usize - 1 {
            return Err(format!("more than {} values", FIRST_OPAQUE - 1));
        }
        if self.values.len() == self.values.capacity() {
            // Growth capped at the input's length when it is known: every live value cost at
            // least one input byte, so doubling must not reserve past that.
            let room = match size_hint {
                Some(total) => usize::try_from(total).unwrap_or(usize::MAX).saturating_sub(self.values.len()).max(1),
                None => usize::MAX,
            };
            let grow = self.values.capacity().max(64).min(room);
            self.values.reserve_exact(grow);
            self.flags.reserve_exact(grow);
            self.refs.reserve_exact(grow);
            self.memo_key_of.reserve_exact(grow);
        }
        self.values.push(v);
        self.flags.push(0);
        self.refs.push(1);
        self.memo_key_of.push(NO_KEY);
        Ok((self.values.len() - 1) as ValueId)
    }

    /// Points the memo key that names the container `id` at the hook's `opaque` id instead, so
    /// that a later reference gets the hook's record; true if no memo key names `id` now (it
    /// goes once nothing holds it). False for a pinned value, which stays.
    pub fn forget_memo(&mut self, id: ValueId, opaque: ValueId) -> bool {
        debug_assert!(is_opaque(opaque));
        let Some(&flags) = self.flags.get(id as usize) else { return false };
        if flags & PINNED != 0 {
            return false;
        }
        let key = std::mem::replace(&mut self.memo_key_of[id as usize], NO_KEY);
        if key != NO_KEY {
            self.memo.insert(key, opaque);
        }
        self.flags[id as usize] &= !MEMOIZED;
        self.forgotten += 1;
        true
    }

    /// The holder that took `id` from the stack gives it up (a hook that kept a record of it
    /// instead); the slot goes if nothing else holds or names it.
    pub fn drop_ref(&mut self, id: ValueId) {
        let Some(r) = self.refs.get_mut(id as usize) else { return };
        *r = r.saturating_sub(1);
        if *r == 0 && self.flags[id as usize] & (MEMOIZED | PINNED | FREED) == 0 {
            self.release(id);
        }
    }

    /// Frees `id` if nothing holds or names it (a hook forgot its memo key).
    #[inline]
    pub(super) fn settle(&mut self, id: ValueId) {
        // A hook's opaque id (most of a trace entry's references once its frames are known)
        // has no slot.
        if is_opaque(id) {
            return;
        }
        if self.refs(id) == 0 && self.flags.get(id as usize).is_some_and(|&f| f & (MEMOIZED | PINNED | FREED) == 0) {
            self.release(id);
        }
    }

    /// Frees `id` (held and named by nothing) and, depth first without recursion, every value
    /// that only it held.
    fn release(&mut self, id: ValueId) {
        let mut work = std::mem::take(&mut self.work);
        work.push(id);
        self.flags[id as usize] = FREED;
        while let Some(id) = work.pop() {
            let v = std::mem::replace(&mut self.values[id as usize], Value::None);
            self.free.push(id);
            v.for_each_child(|c| {
                let Some(r) = self.refs.get_mut(c as usize) else { return };
                *r = r.saturating_sub(1);
                if *r == 0 && self.flags[c as usize] & (MEMOIZED | PINNED | FREED) == 0 {
                    self.flags[c as usize] = FREED;
                    work.push(c)
                }
            });
        }
        self.work = work;
    }

    /// Looks up several keys of the dict `id` in one pass over its items (a later duplicate
    /// wins, as in Python); all `None` if `id` is not a dict.
    pub fn dict_pick<const N: usize>(&self, id: ValueId, keys: [&str; N]) -> [Option<ValueId>; N] {
        let mut out = [None; N];
        if let Value::Dict(items) = self.get(id) {
            for &(k, v) in items {
                if let Value::Str(s) = self.get(k) {
                    if let Some(slot) = keys.iter().position(|key| key == s) {
                        out[slot] = Some(v);
                    }
                }
            }
        }
        out
    }

    /// Looks `key` up in the dict `id`; `None` if `id` is not a dict or lacks the key.
    pub fn dict_get(&self, id: ValueId, key: &str) -> Option<ValueId> {
        match self.get(id) {
            Value::Dict(items) => items.iter().rev().find(|(k, _)| matches!(self.get(*k), Value::Str(s) if s == key)).map(|&(_, v)| v),
            _ => None,
        }
    }

    /// Records that memo `key` names `id`, and returns the value the stack should hold: a
    /// fresh string equal to one memoized before becomes that one (Python memoizes every
    /// string object, and snapshots hold a new `"N/A"` object per entry; without this each
    /// would outlive its entry, since the memo might name it again).
    pub(super) fn memoize(&mut self, key: u32, id: ValueId) -> ValueId {
        let id = self.canonical_str(id);
        if let Some(old) = self.memo.get(key) {
            self.rebound = true;
            if !is_opaque(old) && self.memo_key_of[old as usize] == key {
                // The key moves away from a container that a hook might still forget: keep it.
                self.memo_key_of[old as usize] = NO_KEY;
                self.pin(old);
            }
        }
        if !is_opaque(id) {
            let flags = self.flags[id as usize];
            if flags & MEMOIZED != 0 || key == NO_KEY {
                self.pin(id);
            } else if matches!(self.values[id as usize], Value::List(_) | Value::Tuple(_) | Value::Dict(_) | Value::Set(_)) {
                self.flags[id as usize] |= MEMOIZED;
                self.memo_key_of[id as usize] = key;
            } else {
                // Only containers are forgotten; a memoized scalar or string stays.
                self.pin(id);
            }
        }
        self.memo.insert(key, id);
        id
    }

    /// `id` if it is not a fresh string; else the first memoized string equal to it (`id`'s
    /// slot given back), or `id` itself, remembered as the first.
    fn canonical_str(&mut self, id: ValueId) -> ValueId {
        if is_opaque(id) || self.flags[id as usize] != 0 || self.refs[id as usize] != 1 {
            return id;
        }
        let Value::Str(text) = &self.values[id as usize] else { return id };
        match self.strings.get(text.as_str()) {
            Some(&first) => {
                self.release(id);
                self.add_ref(first);
                first
            }
            None => {
                self.strings.insert(text.as_str().into(), id);
                // Never given back: later equal strings become it.
                self.pin(id);
                id
            }
        }
    }
}
