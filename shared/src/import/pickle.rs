//! A safe subset of Python's pickle virtual machine: protocols 0 to 5, plain data only, read
//! from a stream.
//!
//! Memory snapshots are dicts, lists, tuples, strings and numbers; anything that would run
//! Python code (GLOBAL, REDUCE, ...) is refused. Values live in an arena ([`Arena`]) and memo
//! references share the arena slot instead of copying, so a pickle that references one big
//! value many times costs no more memory than its own size.
//!
//! The input is read through a small window ([`Input`]), never held whole. Slots count their
//! holders, so that a value nothing holds or names is given back and its slot reused. A
//! [`Hook`] sees every item as it is appended to a list and may keep a compact record of it
//! instead: it points the item's memo key at an opaque id of its own
//! ([`Arena::forget_memo`]) and gives the item up ([`Arena::drop_ref`]), and the item and what
//! only it held go. That is how the snapshot importer holds one compact record per trace entry
//! instead of a dozen values.

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

/// The pickle memo. Pickler writes keys 0, 1, 2, ... so they live in a vector; other keys
/// (legal, but never written by Python) go to a map. The vector only grows by appending, so
/// its length is bounded by the number of PUTs, each of which costs at least two input bytes:
/// a hostile key cannot make it large.
#[derive(Default)]
struct Memo {
    dense: Vec<ValueId>,
    sparse: crate::hash::FastMap<u32, ValueId>,
    /// Distinct keys defined (MEMOIZE uses it as its key).
    count: u32,
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

    fn get(&self, key: u32) -> Option<ValueId> {
        match self.dense.get(key as usize) {
            Some(v) => Some(*v),
            None => self.sparse.get(&key).copied(),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An integer outside `i64` (Python's are unbounded), as its little-endian two's
    /// complement bytes without redundant sign bytes: a C++ `size_t(-1)` ("unknown line")
    /// pickles as 9 bytes.
    BigInt(Box<[u8]>),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<ValueId>),
    Tuple(Vec<ValueId>),
    Dict(Vec<(ValueId, ValueId)>),
    Set(Vec<ValueId>),
}

impl Value {
    /// The integer as a `u64`, if it is one in `0..2⁶⁴` (Python's reading, not a wrap).
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::Int(i) => u64::try_from(*i).ok(),
            Value::Bool(b) => Some(u64::from(*b)),
            Value::BigInt(b) => {
                // Non-negative, and at most 8 bytes without its high zero bytes.
                if b.last().is_some_and(|&x| x & 0x80 != 0) {
                    return None;
                }
                let mut b = &b[..];
                while let [rest @ .., 0] = b {
                    b = rest;
                }
                if b.len() > 8 {
                    return None;
                }
                let mut a = [0u8; 8];
                a[..b.len()].copy_from_slice(b);
                Some(u64::from_le_bytes(a))
            }
            _ => None,
        }
    }

    pub fn type_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::BigInt(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "list",
            Value::Tuple(_) => "tuple",
            Value::Dict(_) => "dict",
            Value::Set(_) => "set",
        }
    }

    /// The values this one holds directly.
    fn for_each_child(&self, mut f: impl FnMut(ValueId)) {
        match self {
            Value::List(l) | Value::Tuple(l) | Value::Set(l) => l.iter().copied().for_each(f),
            Value::Dict(d) => d.iter().for_each(|&(k, v)| {
                f(k);
                f(v)
            }),
            _ => {}
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
    values: Vec<Value>,
    flags: Vec<u8>,
    refs: Vec<u32>,
    free: Vec<ValueId>,
    memo: Memo,
    /// The memo key of each slot's container ([`NO_KEY`] if none), so that [`Arena::forget_memo`]
    /// can point the key at a hook's opaque id.
    memo_key_of: Vec<u32>,
    /// [`Arena::release`]'s work list, kept to save an allocation per release.
    work: Vec<ValueId>,
    /// The first memoized string of each text (see [`Arena::memoize`]).
    strings: crate::hash::FastMap<Box<str>, ValueId>,
    /// The shared slots of the ints 0 to 255, None, True and False.
    small: Vec<Option<ValueId>>,
}

impl Arena {
    /// The value `id`; a hook's opaque id reads as `None`.
    pub fn get(&self, id: ValueId) -> &Value {
        self.values.get(id as usize).unwrap_or(&OPAQUE_VALUE)
    }

    fn get_mut(&mut self, id: ValueId) -> Option<&mut Value> {
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

    fn add_ref(&mut self, id: ValueId) {
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

    fn alloc(&mut self, v: Value, size_hint: Option<u64>) -> Result<ValueId, String> {
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
    fn settle(&mut self, id: ValueId) {
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

/// A value of a [`FlatDict`], as its opcodes spell it.
#[derive(Clone, Copy)]
enum Flat {
    /// A memo reference: an arena slot or a hook's opaque id.
    Id(ValueId),
    Int(i64),
    None,
    Bool(bool),
    /// A fresh string: its bytes in the window, and whether MEMOIZE follows it.
    Str {
        at: u32,
        len: u32,
        memo: bool,
    },
    /// A fresh list of memo references: its items in `FlatDict::lists`.
    List {
        at: u32,
        len: u32,
        memo: bool,
    },
    /// A fresh pair of integers (`TUPLE2`), as a snapshot's `pool_id` (torch 2.12+).
    Pair {
        a: i64,
        b: i64,
        memo: bool,
    },
}

/// A value of a [`FlatDict`], for a hook.
#[derive(Clone, Copy)]
pub enum FlatValue<'a> {
    /// A memo reference: an arena slot or a hook's opaque id.
    Id(ValueId),
    Int(i64),
    None,
    Bool(bool),
    /// A fresh string.
    Str(&'a str),
    /// A fresh list of memo references.
    List(&'a [ValueId]),
    /// A fresh pair of integers.
    Pair(i64, i64),
}

impl FlatValue<'_> {
    /// Calls `f` with the value as the arena would hold it; fresh strings and lists come
    /// without their contents (for a type name or a match on their kind).
    pub fn with_value<T>(&self, a: &Arena, f: impl FnOnce(&Value) -> T) -> T {
        match *self {
            FlatValue::Id(id) => f(a.get(id)),
            FlatValue::Int(i) => f(&Value::Int(i)),
            FlatValue::None => f(&Value::None),
            FlatValue::Bool(b) => f(&Value::Bool(b)),
            FlatValue::Str(_) => f(&Value::Str(String::new())),
            FlatValue::List(_) => f(&Value::List(Vec::new())),
            FlatValue::Pair(..) => f(&Value::Tuple(Vec::new())),
        }
    }

    /// The integer this is, if it is one.
    pub fn int(&self, a: &Arena) -> Option<i64> {
        match *self {
            FlatValue::Int(i) => Some(i),
            FlatValue::Id(id) => match a.get(id) {
                Value::Int(i) => Some(*i),
                _ => None,
            },
            _ => None,
        }
    }
}

/// A dict read ahead from the input's window: `} MEMOIZE ( key value ... SETITEMS`, keys memo
/// references, values memo references, numbers, None, bools, strings, or at most one list of
/// memo references, as Python writes a snapshot's trace entries. Reading it makes no slot and
/// changes no memo key; the machine does both only once a hook took it.
pub struct FlatDict<'a> {
    window: &'a [u8],
    items: &'a [(ValueId, Flat)],
    lists: &'a [ValueId],
}

impl<'a> FlatDict<'a> {
    /// Items, duplicate keys included (as a built dict counts them).
    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    fn value(&self, v: Flat) -> FlatValue<'a> {
        match v {
            Flat::Id(id) => FlatValue::Id(id),
            Flat::Int(i) => FlatValue::Int(i),
            Flat::None => FlatValue::None,
            Flat::Bool(b) => FlatValue::Bool(b),
            // Checked as UTF-8 when it was read.
            Flat::Str { at, len, .. } => {
                FlatValue::Str(std::str::from_utf8(&self.window[at as usize..(at + len) as usize]).unwrap_or_default())
            }
            Flat::List { at, len, .. } => FlatValue::List(&self.lists[at as usize..(at + len) as usize]),
            Flat::Pair { a, b, .. } => FlatValue::Pair(a, b),
        }
    }

    /// Looks up several keys in one pass, as [`Arena::dict_pick`] does: `field` gives the
    /// position in the answer of the key whose memo reference is its argument, if any.
    pub fn pick<const N: usize>(&self, mut field: impl FnMut(ValueId) -> Option<usize>) -> [Option<FlatValue<'a>>; N] {
        let mut out = [None; N];
        for &(k, v) in self.items {
            if let Some(slot) = field(k).and_then(|i| out.get_mut(i)) {
                *slot = Some(self.value(v));
            }
        }
        out
    }
}

/// Most items a read-ahead dict may have, and most items of its list; larger ones run as
/// opcodes.
const FLAT_MAX_ITEMS: usize = 64;
const FLAT_MAX_LIST: usize = 4096;
/// Bytes the window must hold ahead of a dict before it is read ahead.
const FLAT_LOOKAHEAD: usize = 16 << 10;

/// Reads the opcodes of a [`FlatDict`] from `b` (the window after its EMPTY_DICT); `None` if
/// they are anything else, or run past the window.
struct FlatReader<'b> {
    b: &'b [u8],
    i: usize,
}

impl FlatReader<'_> {
    #[inline]
    fn byte(&mut self) -> Option<u8> {
        let c = *self.b.get(self.i)?;
        self.i += 1;
        Some(c)
    }

    #[inline]
    fn bytes(&mut self, n: usize) -> Option<&[u8]> {
        let s = self.b.get(self.i..self.i.checked_add(n)?)?;
        self.i += n;
        Some(s)
    }

    fn u32(&mut self) -> Option<u32> {
        let b = self.bytes(4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// The opcode at the cursor, past any FRAME (protocol 4 writes them between any two
    /// opcodes).
    fn peek(&mut self) -> Option<u8> {
        while *self.b.get(self.i)? == 0x95 {
            self.i += 9;
        }
        self.b.get(self.i).copied()
    }

    /// The opcode at the cursor, consumed.
    fn op(&mut self) -> Option<u8> {
        self.peek()?;
        self.byte()
    }

    /// BINGET or LONG_BINGET at the cursor, resolved through the memo.
    fn get(&mut self, memo: &Memo) -> Option<ValueId> {
        let key = match self.op()? {
            b'h' => self.byte()? as u32,
            b'j' => self.u32()?,
            _ => return None,
        };
        memo.get(key)
    }

    /// A MEMOIZE at the cursor, if there is one.
    fn memoize(&mut self) -> bool {
        let m = self.peek() == Some(0x94);
        self.i += usize::from(m);
        m
    }

    /// The argument of BININT1 (`K`), BININT2 (`M`) or BININT (`J`), the opcode consumed.
    fn small_int(&mut self, op: u8) -> Option<i64> {
        Some(match op {
            b'K' => self.byte()? as i64,
            b'M' => {
                let b = self.bytes(2)?;
                u16::from_le_bytes([b[0], b[1]]) as i64
            }
            _ => self.u32()? as i32 as i64,
        })
    }

    fn string(&mut self, n: usize) -> Option<Flat> {
        let at = self.i;
        std::str::from_utf8(self.bytes(n)?).ok()?;
        Some(Flat::Str { at: u32::try_from(at).ok()?, len: n as u32, memo: self.memoize() })
    }

    /// A value; a fresh list's items go to `lists`.
    fn value(&mut self, memo: &Memo, lists: &mut Vec<ValueId>) -> Option<Flat> {
        Some(match self.peek()? {
            b'h' | b'j' => Flat::Id(self.get(memo)?),
            op => {
                self.i += 1;
                match op {
                    b'K' | b'M' | b'J' => {
                        let a = self.small_int(op)?;
                        // Two integers and TUPLE2: a fresh pair.
                        let save = self.i;
                        let pair = match self.peek() {
                            Some(op @ (b'K' | b'M' | b'J')) => {
                                self.i += 1;
                                let b = self.small_int(op)?;
                                (self.peek() == Some(0x86)).then_some(b)
                            }
                            _ => None,
                        };
                        match pair {
                            Some(b) => {
                                self.i += 1;
                                Flat::Pair { a, b, memo: self.memoize() }
                            }
                            None => {
                                self.i = save;
                                Flat::Int(a)
                            }
                        }
                    }
                    0x8a => {
                        let n = self.byte()? as usize;
                        if n > 9 {
                            return None;
                        }
                        Flat::Int(long_from_le(self.bytes(n)?)?)
                    }
                    b'N' => Flat::None,
                    0x88 => Flat::Bool(true),
                    0x89 => Flat::Bool(false),
                    0x8c => {
                        let n = self.byte()? as usize;
                        self.string(n)?
                    }
                    b'X' => {
                        let n = self.u32()? as usize;
                        self.string(n)?
                    }
                    b']' => {
                        let memo_list = self.memoize();
                        let at = lists.len();
                        match self.peek() {
                            Some(b'(') => {
                                self.i += 1;
                                while self.peek()? != b'e' {
                                    if lists.len() - at >= FLAT_MAX_LIST {
                                        return None;
                                    }
                                    lists.push(self.get(memo)?);
                                }
                                self.i += 1;
                            }
                            // One item: BINGET then APPEND. (A memo reference not followed by
                            // APPEND is the next key: the list is empty.)
                            Some(b'h' | b'j') => {
                                let save = self.i;
                                let item = self.get(memo)?;
                                if self.peek() == Some(b'a') {
                                    self.i += 1;
                                    lists.push(item);
                                } else {
                                    self.i = save;
                                }
                            }
                            _ => {}
                        }
                        let len = (lists.len() - at) as u32;
                        Flat::List { at: at as u32, len, memo: memo_list }
                    }
                    _ => return None,
                }
            }
        })
    }

    /// The dict's items up to its SETITEMS; `None` if it is not a flat dict.
    fn dict(&mut self, memo: &Memo, items: &mut Vec<(ValueId, Flat)>, lists: &mut Vec<ValueId>) -> Option<()> {
        if self.op()? != 0x94 || self.op()? != b'(' {
            return None;
        }
        let mut fresh_lists = 0;
        while self.peek()? != b'u' {
            if items.len() >= FLAT_MAX_ITEMS {
                return None;
            }
            let k = self.get(memo)?;
            let v = self.value(memo, lists)?;
            if matches!(v, Flat::List { .. }) {
                fresh_lists += 1;
                if fresh_lists > 1 {
                    return None;
                }
            }
            items.push((k, v));
        }
        self.i += 1;
        Some(())
    }
}

/// Keeps every value.
pub struct KeepAll;

impl Hook for KeepAll {
    fn append(&mut self, _: &mut Arena, _: ValueId, item: ValueId) -> Result<ValueId, ImportError> {
        Ok(item)
    }
}

/// Longest string, bytes or integer argument read: the window holds one whole, and no plain
/// data a snapshot holds comes near it.
const MAX_ARGUMENT_BYTES: usize = 64 << 20;
/// What is kept of a longer unicode string.
const CUT_STRING_KEEPS: usize = 64 << 10;

/// The input, read through a window that grows only to the longest argument.
struct Input<R> {
    src: R,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// Offset in the input of `buf[start]`.
    offset: u64,
    eof: bool,
}

impl<R: Read> Input<R> {
    fn new(src: R) -> Self {
        Input { src, buf: vec![0; 64 << 10], start: 0, end: 0, offset: 0, eof: false }
    }

    fn pos(&self) -> usize {
        usize::try_from(self.offset).unwrap_or(usize::MAX)
    }

    fn err(&self, at: usize, reason: impl Into<String>) -> ImportError {
        ImportError::Pickle { offset: at, reason: reason.into() }
    }

    /// Reads until at least `n` bytes are buffered or the input ends; returns what is buffered.
    fn fill(&mut self, n: usize) -> Result<usize, ImportError> {
        while self.end - self.start < n && !self.eof {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            if self.end == self.buf.len() {
                // Grows with the data that arrives, never to a length the input only claims.
                let len = self.buf.len().saturating_mul(2);
                self.buf.resize(len, 0);
            }
            match self.src.read(&mut self.buf[self.end..]) {
                Ok(0) => self.eof = true,
                Ok(k) => self.end += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(ImportError::Read { reason: e.to_string() }),
            }
        }
        Ok(self.end - self.start)
    }

    #[inline]
    fn advance(&mut self, n: usize) {
        self.start += n;
        self.offset += n as u64;
    }

    #[inline]
    fn opcode(&mut self) -> Result<Option<u8>, ImportError> {
        if self.start == self.end && self.fill(1)? == 0 {
            return Ok(None);
        }
        let b = self.buf[self.start];
        self.advance(1);
        Ok(Some(b))
    }

    #[inline]
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8], ImportError> {
        if self.end - self.start >= n {
            let s = self.start;
            self.advance(n);
            return Ok(&self.buf[s..s + n]);
        }
        let have = self.fill(n)?;
        if have < n {
            return Err(self.err(self.pos(), format!("truncated: {what} needs {n} bytes but only {have} remain")));
        }
        let s = self.start;
        self.advance(n);
        Ok(&self.buf[s..s + n])
    }

    #[inline]
    fn u8(&mut self) -> Result<u8, ImportError> {
        Ok(self.take(1, "an opcode argument")?[0])
    }

    #[inline]
    fn u16(&mut self) -> Result<u16, ImportError> {
        let b = self.take(2, "a 2-byte argument")?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    #[inline]
    fn u32(&mut self) -> Result<u32, ImportError> {
        let b = self.take(4, "a 4-byte argument")?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    #[inline]
    fn u64(&mut self) -> Result<u64, ImportError> {
        let b = self.take(8, "an 8-byte argument")?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// A length argument as a `usize`; its bytes are checked when they are read.
    fn len(&mut self, n: u64) -> Result<usize, ImportError> {
        if n > MAX_ARGUMENT_BYTES as u64 {
            return Err(self.err(
                self.pos(),
                format!(
                    "a string or number of {n} bytes; expected at most {} MiB (the window holds one argument whole)",
                    MAX_ARGUMENT_BYTES >> 20
                ),
            ));
        }
        Ok(n as usize)
    }

    fn line(&mut self) -> Result<&str, ImportError> {
        let at = self.pos();
        let mut searched = 0;
        let nl = loop {
            if let Some(i) = self.buf[self.start + searched..self.end].iter().position(|&b| b == b'\n') {
                break searched + i;
            }
            searched = self.end - self.start;
            if self.fill(searched + 1)? == searched {
                return Err(self.err(at, "truncated: a text argument has no terminating newline"));
            }
        };
        let s = self.start;
        self.advance(nl + 1);
        std::str::from_utf8(&self.buf[s..s + nl]).map_err(|_| self.err(at, "text argument is not UTF-8"))
    }

    /// Bytes left after the current position (read to the end, not kept).
    fn remaining(&mut self) -> Result<u64, ImportError> {
        let mut n = (self.end - self.start) as u64;
        self.start = self.end;
        let mut scratch = [0u8; 8192];
        loop {
            match self.src.read(&mut scratch) {
                Ok(0) => return Ok(n),
                Ok(k) => n += k as u64,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(ImportError::Read { reason: e.to_string() }),
            }
        }
    }
}

impl Arena {
    /// Records that memo `key` names `id`, and returns the value the stack should hold: a
    /// fresh string equal to one memoized before becomes that one (Python memoizes every
    /// string object, and snapshots hold a new `"N/A"` object per entry; without this each
    /// would outlive its entry, since the memo might name it again).
    fn memoize(&mut self, key: u32, id: ValueId) -> ValueId {
        let id = self.canonical_str(id);
        if let Some(old) = self.memo.get(key) {
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

/// A little-endian two's complement integer (LONG1, LONG4) as an `i64`, or `None` when it
/// needs more than 64 bits.
fn long_from_le(bytes: &[u8]) -> Option<i64> {
    if bytes.is_empty() {
        return Some(0);
    }
    if bytes.len() > 8 {
        // Python's encoder adds a sign byte; accept it when it carries no information.
        let (low, high) = bytes.split_at(8);
        let sign = if low[7] & 0x80 != 0 { 0xff } else { 0 };
        if high.iter().any(|&b| b != sign) {
            return None;
        }
        return long_from_le(low);
    }
    let neg = bytes[bytes.len() - 1] & 0x80 != 0;
    let mut a = if neg { [0xffu8; 8] } else { [0u8; 8] };
    a[..bytes.len()].copy_from_slice(bytes);
    Some(i64::from_le_bytes(a))
}

/// Most digits of a text integer (INT, LONG), as Python's own limit for converting text to int
/// (`sys.get_int_max_str_digits()`).
const MAX_DIGITS: usize = 4300;

/// A decimal integer (`-12`, `18446744073709551615`) as Python reads it, or `None` if it is
/// not one or has more than [`MAX_DIGITS`] digits.
fn decimal_value(s: &str) -> Option<Value> {
    if let Ok(v) = s.parse::<i64>() {
        return Some(Value::Int(v));
    }
    let (neg, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if digits.is_empty() || digits.len() > MAX_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Magnitude, little-endian, then two's complement with a sign byte.
    let mut mag: Vec<u8> = vec![0];
    for d in digits.bytes() {
        let mut carry = u32::from(d - b'0');
        for b in &mut mag {
            let v = u32::from(*b) * 10 + carry;
            *b = v as u8;
            carry = v >> 8;
        }
        if carry > 0 {
            mag.push(carry as u8);
        }
    }
    mag.push(0);
    if neg {
        let mut carry = 1u16;
        for b in &mut mag {
            let v = u16::from(!*b) + carry;
            *b = v as u8;
            carry = v >> 8;
        }
    }
    Some(long_value(&mag))
}

/// An integer of LONG1 or LONG4 bytes, as Python reads it: an `Int` where it fits, else a
/// `BigInt`.
fn long_value(bytes: &[u8]) -> Value {
    match long_from_le(bytes) {
        Some(v) => Value::Int(v),
        None => {
            // Without redundant sign bytes, so that equal integers hold equal bytes.
            let mut b = bytes;
            while let [rest @ .., x, last] = b {
                if (*last == 0 && x & 0x80 == 0) || (*last == 0xff && x & 0x80 != 0) {
                    b = &b[..rest.len() + 1];
                } else {
                    break;
                }
            }
            Value::BigInt(b.into())
        }
    }
}

/// The top of the stack if it lies above the last MARK (`floor`): values below a MARK belong
/// to it, as in CPython's unpickler.
fn top_above(stack: &[ValueId], floor: usize) -> Option<ValueId> {
    if stack.len() > floor {
        stack.last().copied()
    } else {
        None
    }
}

fn perr(at: usize, reason: impl Into<String>) -> ImportError {
    ImportError::Pickle { offset: at, reason: reason.into() }
}

/// Parses a whole pickle held in memory into plain values.
pub fn parse(data: &[u8]) -> Result<Pickle, ImportError> {
    parse_stream(data, Some(data.len() as u64), &mut KeepAll)
}

/// Parses a pickle read from `src`, passing every list item through `hook`. `size_hint` is the
/// input's length when known: it caps the arena's growth (see [`Arena`]).
pub fn parse_stream(src: impl Read, size_hint: Option<u64>, hook: &mut impl Hook) -> Result<Pickle, ImportError> {
    let mut vm = Vm {
        r: Input::new(src),
        a: Arena { small: vec![None; 259], ..Arena::default() },
        stack: Vec::new(),
        marks: Vec::new(),
        protocol: 0,
        size_hint,
        hook,
        flat_items: Vec::new(),
        flat_lists: Vec::new(),
        pairs: Default::default(),
    };
    loop {
        let at = vm.r.pos();
        let Some(op) = vm.r.opcode()? else {
            return Err(perr(at, "truncated: the pickle ends before its STOP opcode"));
        };
        if op == b'.' {
            return vm.stop(op, at);
        }
        vm.step(op, at)?;
    }
}

/// The pickle machine: the input, the arena, the stack and its marks. Its methods take the
/// opcode and its offset (`at`, for errors), read the opcode's arguments and apply it.
struct Vm<'h, R, H> {
    r: Input<R>,
    a: Arena,
    stack: Vec<ValueId>,
    /// Stack lengths at each MARK.
    marks: Vec<usize>,
    protocol: u8,
    size_hint: Option<u64>,
    hook: &'h mut H,
    /// A [`FlatDict`]'s items and list items, kept to save allocations.
    flat_items: Vec<(ValueId, Flat)>,
    flat_lists: Vec<ValueId>,
    /// The tuple each fresh pair of integers read ahead stands for, by value.
    pairs: crate::hash::FastMap<(i64, i64), ValueId>,
}

/// Control: one step, the stack and the end.
impl<R: Read, H: Hook> Vm<'_, R, H> {
    /// Applies opcode `op` (anything but STOP), sending it to the method of its kind.
    #[inline(always)]
    fn step(&mut self, op: u8, at: usize) -> Result<(), ImportError> {
        match op {
            b'}' if H::TAKES_FLAT_DICTS && self.appending() && self.flat_dict()? => Ok(()),
            0x80 | 0x95 => self.framing(op, at),
            b'(' | b'0' | b'1' | b'2' => self.stack_op(op, at),
            b'N' | 0x88 | 0x89 | b'I' | b'J' | b'K' | b'M' | b'L' | 0x8a | 0x8b | b'F' | b'G' => self.number(op, at),
            b'S' | b'T' | b'U' | b'V' | b'X' | 0x8c | 0x8d | b'B' | b'C' | 0x8e | 0x96 => self.text(op, at),
            b']' | b')' | b'}' | 0x8f | b'l' | b't' | 0x91 | b'd' | 0x85..=0x87 => self.build(op, at),
            b'a' | b'e' | 0x90 | b's' | b'u' => self.fill(op, at),
            b'p' | b'q' | b'r' | 0x94 | b'g' | b'h' | b'j' => self.memo(op, at),
            b'c' | 0x93 | b'i' | b'R' | b'b' | b'o' | 0x81 | 0x92 | b'P' | b'Q' | 0x82 | 0x83 | 0x84 | 0x97 | 0x98 => {
                self.refuse_object(op, at)
            }
            _ => Err(perr(at, format!("unknown pickle opcode 0x{op:02x}"))),
        }
    }

    /// PROTO (checks the version) and FRAME (ignored: the input is read as one stream).
    fn framing(&mut self, op: u8, at: usize) -> Result<(), ImportError> {
        if op == 0x80 {
            self.protocol = self.r.u8()?;
            if self.protocol > 5 {
                return Err(perr(at, format!("unsupported pickle protocol {}; expected 0 to 5", self.protocol)));
            }
        } else {
            self.r.u64()?;
        }
        Ok(())
    }

    /// STOP: takes the machine; gives the pickle whose root is the top of the stack, if the
    /// input ends there.
    fn stop(mut self, op: u8, at: usize) -> Result<Pickle, ImportError> {
        let root = self.pop(op, at)?;
        let input_bytes = self.r.offset;
        let rest = self.r.remaining()?;
        if rest > 0 {
            return Err(perr(at, format!("{rest} bytes follow the STOP opcode; expected the pickle to end there")));
        }
        Ok(Pickle { arena: self.a, root, protocol: self.protocol, input_bytes })
    }

    /// MARK, POP, POP_MARK and DUP.
    fn stack_op(&mut self, op: u8, at: usize) -> Result<(), ImportError> {
        match op {
            b'(' => self.marks.push(self.stack.len()),
            // POP of a MARK with nothing above it drops the mark (CPython's load_pop).
            b'0' if self.marks.last() == Some(&self.stack.len()) && !self.marks.is_empty() => {
                self.marks.pop();
            }
            b'0' => {
                self.pop(op, at)?;
            }
            b'1' => {
                let m = self.pop_mark(op, at)?;
                self.stack.truncate(m);
            }
            _ => {
                let top = top_above(&self.stack, self.floor()).ok_or_else(|| perr(at, "DUP on an empty stack"))?;
                self.a.add_ref(top);
                self.stack.push(top);
            }
        }
        Ok(())
    }

    /// Stack length at the last MARK: values below it belong to the mark, and no opcode but the
    /// mark's own may take them (as in CPython's unpickler, "unpickling stack underflow").
    #[inline]
    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    #[inline]
    fn pop(&mut self, op: u8, at: usize) -> Result<ValueId, ImportError> {
        if self.stack.len() <= self.floor() {
            return Err(perr(at, format!("opcode 0x{op:02x} needs a value but the stack is empty above its last MARK")));
        }
        self.stack.pop().ok_or_else(|| perr(at, format!("opcode 0x{op:02x} needs a value but the stack is empty")))
    }

    #[inline]
    fn pop_mark(&mut self, op: u8, at: usize) -> Result<usize, ImportError> {
        self.marks.pop().ok_or_else(|| perr(at, format!("opcode 0x{op:02x} needs a MARK but there is none")))
    }

    /// Puts `v` in a new slot on the stack.
    #[inline]
    fn push(&mut self, v: Value) -> Result<(), ImportError> {
        let id = self.a.alloc(v, self.size_hint).map_err(|e| self.r.err(self.r.pos(), e))?;
        self.stack.push(id);
        Ok(())
    }

    /// Puts the shared slot `k` of an immutable value (None, True, False, the one-byte ints)
    /// on the stack, so that a list of a billion Nones costs its list, not a billion values.
    #[inline]
    fn push_small(&mut self, k: usize, v: Value) -> Result<(), ImportError> {
        let id = match self.a.small[k] {
            Some(id) => {
                self.a.add_ref(id);
                id
            }
            None => {
                let id = self.a.alloc(v, self.size_hint).map_err(|e| self.r.err(self.r.pos(), e))?;
                self.a.pin(id);
                self.a.small[k] = Some(id);
                id
            }
        };
        self.stack.push(id);
        Ok(())
    }
}

/// Dicts read ahead for the hook.
impl<R: Read, H: Hook> Vm<'_, R, H> {
    /// True if the values above the last MARK are to be appended to a list (APPENDS), as a
    /// list's items are.
    fn appending(&self) -> bool {
        let floor = self.floor();
        let below = if self.marks.len() >= 2 { self.marks[self.marks.len() - 2] } else { 0 };
        !self.marks.is_empty() && floor > below && matches!(self.a.get(self.stack[floor - 1]), Value::List(_))
    }

    /// After an EMPTY_DICT: reads the dict ahead ([`FlatDict`]) and offers it to the hook. True
    /// if the hook took it: its opcodes are consumed, the memo names what the generic opcodes
    /// would have left it naming, and the stack holds the hook's id. False changes nothing.
    fn flat_dict(&mut self) -> Result<bool, ImportError> {
        self.r.fill(FLAT_LOOKAHEAD)?;
        let window = &self.r.buf[self.r.start..self.r.end];
        self.flat_items.clear();
        self.flat_lists.clear();
        let mut reader = FlatReader { b: window, i: 0 };
        if reader.dict(&self.a.memo, &mut self.flat_items, &mut self.flat_lists).is_none() {
            return Ok(false);
        }
        let consumed = reader.i;
        let dict = FlatDict { window, items: &self.flat_items, lists: &self.flat_lists };
        let Some(taken) = self.hook.flat_dict(&mut self.a, &dict) else { return Ok(false) };
        let a = &mut self.a;
        // The memo keys, in the order the dict's MEMOIZEs come.
        a.memoize(a.memo.count, taken.dict);
        for &(_, v) in &self.flat_items {
            match v {
                Flat::Str { at, len, memo: true } => {
                    let text = std::str::from_utf8(&window[at as usize..(at + len) as usize]).unwrap_or_default();
                    match a.strings.get(text) {
                        Some(&first) => {
                            a.memoize(a.memo.count, first);
                        }
                        None => {
                            let id = a.alloc(Value::Str(text.to_owned()), self.size_hint).map_err(|e| self.r.err(self.r.pos(), e))?;
                            a.memoize(a.memo.count, id);
                            a.drop_ref(id);
                        }
                    }
                }
                Flat::List { memo: true, .. } if let Some(id) = taken.list => {
                    a.memoize(a.memo.count, id);
                }
                Flat::Pair { a: x, b: y, memo: true } => {
                    // One pinned tuple per distinct pair (a snapshot writes a fresh `pool_id`
                    // per entry): what the memo names is equal, which is all a reader sees.
                    let id = match self.pairs.get(&(x, y)) {
                        Some(&id) => id,
                        None => {
                            let err = |e| self.r.err(self.r.pos(), e);
                            let ix = a.alloc(Value::Int(x), self.size_hint).map_err(err)?;
                            let iy = a.alloc(Value::Int(y), self.size_hint).map_err(err)?;
                            let id = a.alloc(Value::Tuple(vec![ix, iy]), self.size_hint).map_err(err)?;
                            a.pin(id);
                            self.pairs.insert((x, y), id);
                            id
                        }
                    };
                    a.memoize(a.memo.count, id);
                }
                Flat::List { at, len, memo: true } => {
                    let items = self.flat_lists[at as usize..(at + len) as usize].to_vec();
                    items.iter().for_each(|&i| a.add_ref(i));
                    let id = a.alloc(Value::List(items), self.size_hint).map_err(|e| self.r.err(self.r.pos(), e))?;
                    a.memoize(a.memo.count, id);
                    a.drop_ref(id);
                }
                _ => {}
            }
        }
        // What the dict named and no one holds or names now (the hook forgot it) goes, as it
        // would when a built dict went.
        for &(k, v) in &self.flat_items {
            a.settle(k);
            if let Flat::Id(id) = v {
                a.settle(id);
            }
        }
        self.flat_lists.iter().for_each(|&id| a.settle(id));
        self.r.advance(consumed);
        self.stack.push(taken.dict);
        Ok(true)
    }
}

/// Values: numbers and strings.
impl<R: Read, H: Hook> Vm<'_, R, H> {
    /// None, the bools, and the integer and float opcodes.
    fn number(&mut self, op: u8, at: usize) -> Result<(), ImportError> {
        match op {
            b'N' => self.push_small(256, Value::None),
            0x88 => self.push_small(257, Value::Bool(true)),
            0x89 => self.push_small(258, Value::Bool(false)),
            b'I' => {
                let s = self.r.line()?;
                let v = match s {
                    "01" => Value::Bool(true),
                    "00" => Value::Bool(false),
                    _ => decimal_value(s)
                        .ok_or_else(|| perr(at, format!("INT argument {s:?} is not an integer of at most {MAX_DIGITS} digits")))?,
                };
                self.push(v)
            }
            b'J' => {
                let v = self.r.u32()? as i32;
                self.push(Value::Int(v as i64))
            }
            b'K' => {
                let v = self.r.u8()?;
                self.push_small(v as usize, Value::Int(v as i64))
            }
            b'M' => {
                let v = self.r.u16()?;
                self.push(Value::Int(v as i64))
            }
            b'L' => {
                let s = self.r.line()?;
                let s = s.strip_suffix('L').unwrap_or(s);
                let v = decimal_value(s)
                    .ok_or_else(|| perr(at, format!("LONG argument {s:?} is not an integer of at most {MAX_DIGITS} digits")))?;
                self.push(v)
            }
            0x8a => {
                let n = self.r.u8()? as usize;
                let v = long_value(self.r.take(n, "LONG1 bytes")?);
                self.push(v)
            }
            0x8b => {
                let n = self.r.u32()? as u64;
                let n = self.r.len(n)?;
                let v = long_value(self.r.take(n, "LONG4 bytes")?);
                self.push(v)
            }
            b'F' => {
                let s = self.r.line()?;
                let v = s.parse::<f64>().map_err(|_| perr(at, format!("FLOAT argument {s:?} is not a number")))?;
                self.push(Value::Float(v))
            }
            _ => {
                let b = self.r.take(8, "BINFLOAT")?;
                let mut x = [0u8; 8];
                x.copy_from_slice(b);
                self.push(Value::Float(f64::from_be_bytes(x)))
            }
        }
    }

    /// A unicode string longer than the window holds (a program's metadata text of 100 MB):
    /// its first [`CUT_STRING_KEEPS`] bytes and how long it was; the rest is read past in
    /// pieces, so memory stays bounded.
    fn cut_string(&mut self, n: u64) -> Result<(), ImportError> {
        let truncated = |e: ImportError| match e {
            ImportError::Pickle { offset, reason } if reason.starts_with("truncated") => ImportError::Pickle {
                offset,
                reason: format!(
                    "truncated: a unicode string of {n} bytes (more than {} MiB, read in pieces) ends early",
                    MAX_ARGUMENT_BYTES >> 20
                ),
            },
            e => e,
        };
        let kept = self.r.take(CUT_STRING_KEEPS, "a unicode string").map_err(truncated)?;
        let valid = match std::str::from_utf8(kept) {
            Ok(s) => s,
            Err(e) => std::str::from_utf8(&kept[..e.valid_up_to()]).unwrap_or_default(),
        };
        let s = format!("{valid}… (cut from {n} bytes)");
        let mut left = n - CUT_STRING_KEEPS as u64;
        while left > 0 {
            let piece = left.min(1 << 20) as usize;
            self.r.take(piece, "a unicode string").map_err(truncated)?;
            left -= piece as u64;
        }
        self.push(Value::Str(s))
    }

    /// The string and bytes opcodes.
    fn text(&mut self, op: u8, at: usize) -> Result<(), ImportError> {
        let v = match op {
            b'S' => {
                let s = self.r.line()?;
                let s = s
                    .strip_prefix(['\'', '"'])
                    .and_then(|s| s.strip_suffix(['\'', '"']))
                    .ok_or_else(|| perr(at, "STRING argument is not quoted"))?
                    .to_owned();
                Value::Str(s)
            }
            b'T' | b'U' => {
                let n = if op == b'T' { self.r.u32()? as u64 } else { self.r.u8()? as u64 };
                let n = self.r.len(n)?;
                let b = self.r.take(n, "a string")?;
                // Protocol 2 byte strings are Latin-1 in Python 3.
                Value::Str(b.iter().map(|&c| c as char).collect())
            }
            b'V' => Value::Str(self.r.line()?.to_owned()),
            b'X' | 0x8c | 0x8d => {
                let n = match op {
                    b'X' => self.r.u32()? as u64,
                    0x8c => self.r.u8()? as u64,
                    _ => self.r.u64()?,
                };
                if n > MAX_ARGUMENT_BYTES as u64 {
                    return self.cut_string(n);
                }
                let n = self.r.len(n)?;
                let b = self.r.take(n, "a unicode string")?;
                match std::str::from_utf8(b) {
                    Ok(s) => Value::Str(s.to_owned()),
                    Err(e) => return Err(perr(at, format!("string is not UTF-8: {e}"))),
                }
            }
            _ => {
                let n = match op {
                    b'B' => self.r.u32()? as u64,
                    b'C' => self.r.u8()? as u64,
                    _ => self.r.u64()?,
                };
                let n = self.r.len(n)?;
                Value::Bytes(self.r.take(n, "bytes")?.to_vec())
            }
        };
        self.push(v)
    }
}

/// Containers: building them and filling them.
impl<R: Read, H: Hook> Vm<'_, R, H> {
    /// The empty containers, and those built from the values above a MARK or the top 1 to 3.
    fn build(&mut self, op: u8, at: usize) -> Result<(), ImportError> {
        let v = match op {
            b']' => Value::List(Vec::new()),
            b')' => Value::Tuple(Vec::new()),
            b'}' => Value::Dict(Vec::new()),
            0x8f => Value::Set(Vec::new()),
            b'l' | b't' | 0x91 | b'd' => {
                let m = self.pop_mark(op, at)?;
                let items: Vec<ValueId> = self.stack.split_off(m);
                match op {
                    b'l' => Value::List(items),
                    b't' => Value::Tuple(items),
                    0x91 => Value::Set(items),
                    _ => {
                        if !items.len().is_multiple_of(2) {
                            return Err(perr(at, "DICT needs an even number of items"));
                        }
                        Value::Dict(items.chunks(2).map(|c| (c[0], c[1])).collect())
                    }
                }
            }
            _ => {
                let n = (op - 0x84) as usize;
                if self.stack.len() < self.floor() + n {
                    return Err(perr(at, format!("TUPLE{n} needs {n} values on the stack")));
                }
                Value::Tuple(self.stack.split_off(self.stack.len() - n))
            }
        };
        self.push(v)
    }

    /// APPEND, APPENDS, ADDITEMS, SETITEM and SETITEMS: list items pass through the hook.
    fn fill(&mut self, op: u8, at: usize) -> Result<(), ImportError> {
        match op {
            b'a' => {
                let v = self.pop(op, at)?;
                let target = top_above(&self.stack, self.floor()).ok_or_else(|| perr(at, "APPEND without a list"))?;
                let a = &mut self.a;
                match a.get(target) {
                    Value::List(_) => {}
                    other => return Err(perr(at, format!("APPEND to a {}, expected a list", other.type_name()))),
                }
                let v = self.hook.append(a, target, v)?;
                if let Some(Value::List(l)) = a.get_mut(target) {
                    l.push(v);
                }
            }
            b'e' | 0x90 => {
                let m = self.pop_mark(op, at)?;
                let mut items = self.stack.split_off(m);
                let target = top_above(&self.stack, self.floor()).ok_or_else(|| perr(at, "APPENDS without a list"))?;
                let a = &mut self.a;
                match a.get(target) {
                    Value::List(_) => {
                        for item in &mut items {
                            *item = self.hook.append(a, target, *item)?;
                        }
                    }
                    Value::Set(_) => {}
                    other => return Err(perr(at, format!("APPENDS to a {}, expected a list", other.type_name()))),
                }
                if let Some(Value::List(l) | Value::Set(l)) = a.get_mut(target) {
                    l.extend(items);
                }
            }
            b's' => {
                let v = self.pop(op, at)?;
                let k = self.pop(op, at)?;
                let target = top_above(&self.stack, self.floor()).ok_or_else(|| perr(at, "SETITEM without a dict"))?;
                let a = &mut self.a;
                match a.get_mut(target) {
                    Some(Value::Dict(d)) => d.push((k, v)),
                    _ => return Err(perr(at, format!("SETITEM on a {}, expected a dict", a.get(target).type_name()))),
                }
            }
            _ => {
                let m = self.pop_mark(op, at)?;
                let items = self.stack.split_off(m);
                if !items.len().is_multiple_of(2) {
                    return Err(perr(at, "SETITEMS needs an even number of items"));
                }
                let target = top_above(&self.stack, self.floor()).ok_or_else(|| perr(at, "SETITEMS without a dict"))?;
                let a = &mut self.a;
                match a.get_mut(target) {
                    Some(Value::Dict(d)) => d.extend(items.chunks(2).map(|c| (c[0], c[1]))),
                    _ => return Err(perr(at, format!("SETITEMS on a {}, expected a dict", a.get(target).type_name()))),
                }
            }
        }
        Ok(())
    }
}

/// The memo, and the opcodes that would run Python code.
impl<R: Read, H: Hook> Vm<'_, R, H> {
    /// PUT, BINPUT, LONG_BINPUT and MEMOIZE name the top of the stack; GET, BINGET and
    /// LONG_BINGET push what a key names.
    fn memo(&mut self, op: u8, at: usize) -> Result<(), ImportError> {
        match op {
            b'p' | b'q' | b'r' | 0x94 => {
                let key = match op {
                    b'p' => {
                        let s = self.r.line()?;
                        s.parse::<u32>().map_err(|_| perr(at, format!("PUT index {s:?} is not a number")))?
                    }
                    b'q' => self.r.u8()? as u32,
                    b'r' => self.r.u32()?,
                    _ => self.a.memo.count,
                };
                let top = top_above(&self.stack, self.floor()).ok_or_else(|| perr(at, "memoize on an empty stack"))?;
                let kept = self.a.memoize(key, top);
                if let Some(last) = self.stack.last_mut() {
                    *last = kept;
                }
            }
            _ => {
                let key = match op {
                    b'g' => {
                        let s = self.r.line()?;
                        s.parse::<u32>().map_err(|_| perr(at, format!("GET index {s:?} is not a number")))?
                    }
                    b'h' => self.r.u8()? as u32,
                    _ => self.r.u32()?,
                };
                let id = self.a.memo.get(key).ok_or_else(|| perr(at, format!("memo entry {key} is used before it is defined")))?;
                self.a.add_ref(id);
                self.stack.push(id);
            }
        }
        Ok(())
    }

    /// GLOBAL, STACK_GLOBAL, INST and the opcodes that call or build objects: always the
    /// error that refuses them, naming the class where the pickle spells it out.
    fn refuse_object(&mut self, op: u8, at: usize) -> Result<(), ImportError> {
        if !matches!(op, b'c' | 0x93 | b'i') {
            return Err(self
                .r
                .err(at, format!("opcode 0x{op:02x} builds Python objects; expected plain data (dicts, lists, strings, numbers)")));
        }
        let what = if op == b'c' || op == b'i' {
            let module = self.r.line()?.to_owned();
            let name = self.r.line()?;
            format!("{module}.{name}")
        } else {
            "a class named on the stack".to_owned()
        };
        Err(self.r.err(at, format!("the pickle constructs a Python object ({what}); expected plain data (dicts, lists, strings, numbers)")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_protocol_2_dict_with_memo_and_long() {
        // pickle.dumps({'a': [1, 2**40, -3], 'b': 'x', 'c': (True, None, 1.5)}, protocol=2)
        let data = b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01]q\x02(K\x01\x8a\x06\x00\x00\x00\x00\x00\x01J\xfd\xff\xff\xffeX\x01\x00\x00\x00bq\x03X\x01\x00\x00\x00xq\x04X\x01\x00\x00\x00cq\x05\x88NG?\xf8\x00\x00\x00\x00\x00\x00\x87q\x06u.";
        let p = parse(data).unwrap();
        assert_eq!(p.protocol, 2);
        let a = p.dict_get(p.root, "a").unwrap();
        let Value::List(items) = p.get(a) else { panic!("a is not a list") };
        let ints: Vec<_> = items.iter().map(|&i| p.get(i).clone()).collect();
        assert_eq!(ints, vec![Value::Int(1), Value::Int(1 << 40), Value::Int(-3)]);
        let c = p.dict_get(p.root, "c").unwrap();
        let Value::Tuple(t) = p.get(c) else { panic!("c is not a tuple") };
        assert_eq!(p.get(t[2]), &Value::Float(1.5));
    }

    #[test]
    fn integers_beyond_64_bits_read_as_python_reads_them() {
        // pickle.dumps([2**64-1, -2**64, 2**100, 2**63], protocol=2): LONG1 of 9, 9, 13, 9 bytes.
        let data = b"\x80\x02]q\x00(\x8a\t\xff\xff\xff\xff\xff\xff\xff\xff\x00\x8a\t\x00\x00\x00\x00\x00\x00\x00\x00\xff\x8a\r\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x10\x8a\t\x00\x00\x00\x00\x00\x00\x00\x80\x00e.";
        let p = parse(data).unwrap();
        let Value::List(items) = p.get(p.root) else { panic!("not a list") };
        let u: Vec<Option<u64>> = items.iter().map(|&i| p.get(i).as_u64()).collect();
        assert_eq!(u, vec![Some(u64::MAX), None, None, Some(1 << 63)]);
        assert!(items.iter().all(|&i| p.get(i).type_name() == "int"));
        // The same as text (protocol 0): LONG lines.
        let p = parse(b"(lp0\nL18446744073709551615L\naL-18446744073709551616L\na.").unwrap();
        let Value::List(items) = p.get(p.root) else { panic!("not a list") };
        assert_eq!(p.get(items[0]).as_u64(), Some(u64::MAX));
        assert!(matches!(p.get(items[1]), Value::BigInt(_)) && p.get(items[1]).as_u64().is_none());
        // Python's own limit on digits.
        let long = format!("(lp0\nL{}L\na.", "9".repeat(4301));
        assert!(parse(long.as_bytes()).unwrap_err().to_string().contains("at most 4300 digits"));
    }

    #[test]
    fn none_bools_and_small_ints_share_one_slot_each() {
        // [None] * 1000 + [True, False, 7, 7, 300]: the list, None, True, False, 7 and 300.
        let mut data = b"\x80\x04](".to_vec();
        data.extend(std::iter::repeat_n(b'N', 1000));
        data.extend_from_slice(b"\x88\x89K\x07K\x07M\x2c\x01e.");
        let p = parse(&data).unwrap();
        assert_eq!(p.arena.values.len(), 6);
        let Value::List(items) = p.get(p.root) else { panic!("not a list") };
        assert_eq!(items.len(), 1005);
        assert_eq!(p.get(items[999]), &Value::None);
        assert_eq!(items[1002], items[1003]);
        assert_eq!(p.get(items[1004]), &Value::Int(300));
    }

    #[test]
    fn refuses_objects_and_truncation_with_offsets() {
        // pickle.dumps(collections.OrderedDict(), protocol=2)
        let data = b"\x80\x02ccollections\nOrderedDict\nq\x00)Rq\x01.";
        let e = parse(data).unwrap_err().to_string();
        assert!(e.contains("collections.OrderedDict") && e.contains("byte 2"), "{e}");
        let e = parse(b"\x80\x04\x95").unwrap_err().to_string();
        assert!(e.contains("truncated"), "{e}");
        let e = parse(b"\x80\x04X\xff\xff\xff\x7f").unwrap_err().to_string();
        assert!(e.contains("2147483647 bytes") && e.contains("truncated"), "{e}");
        let e = parse(b"\x80\x04B\xff\xff\xff\x7f").unwrap_err().to_string();
        assert!(e.contains("2147483647 bytes") && e.contains("at most 64 MiB"), "{e}");
    }
}
