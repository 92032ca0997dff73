//! Dicts read ahead from the input's window for a hook ([`FlatDict`]): a snapshot's trace
//! entries, taken whole before any slot is made for them.

use super::arena::{Arena, Memo};
use super::value::{long_from_le, Value};
use super::ValueId;
use crate::hash::FxHasher;
use std::hash::Hasher;

/// A value of a [`FlatDict`], as its opcodes spell it.
#[derive(Clone, Copy)]
pub(super) enum Flat {
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
    /// A fresh list whose opcodes are byte for byte those of one a hook took before (see
    /// [`KnownLists`]): the hook's opaque id for it, and whether MEMOIZE follows it.
    Known {
        id: ValueId,
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
    pub(super) window: &'a [u8],
    pub(super) items: &'a [(ValueId, Flat)],
    pub(super) lists: &'a [ValueId],
}

impl<'a> FlatDict<'a> {
    /// Items, duplicate keys included (as a built dict counts them).
    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    #[inline(always)]
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
            Flat::Known { id, .. } => FlatValue::Id(id),
            Flat::Pair { a, b, .. } => FlatValue::Pair(a, b),
        }
    }

    /// Looks up several keys in one pass, as [`Arena::dict_pick`] does: `field` gives the
    /// position in the answer of the key whose memo reference is its argument, if any.
    #[inline]
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
pub(super) const FLAT_LOOKAHEAD: usize = 16 << 10;

/// Fresh lists a hook took, by their opcodes (`(` memo references `e`), as the opaque id the
/// hook gave each: a snapshot writes a new list of the same frames for every entry of the same
/// stack, and finding its bytes here spares resolving and interning each frame again. The
/// bytes mean the same list while no memo key they name is bound again ([`Arena::rebound`],
/// which empties this); a hook forgetting a key points it at an id that stands for the same value.
///
/// [`Arena::rebound`]: super::arena::Arena::rebound
#[derive(Default)]
pub(super) struct KnownLists {
    /// Each list's opcodes and id, found by [`list_hash`] of the opcodes (which
    /// [`FlatReader::list_end`] works out as it walks them, not in a second pass).
    lists: hashbrown::HashTable<(Box<[u8]>, ValueId)>,
    bytes: usize,
}

impl KnownLists {
    /// Most bytes of opcodes kept: a file of ever new lists stops adding past it.
    const MAX_BYTES: usize = 16 << 20;

    /// Keeps `opcodes` (a list [`FlatReader::list_end`] walked, `hash` its [`list_hash`]) as `id`.
    pub(super) fn insert(&mut self, opcodes: &[u8], hash: u64, id: ValueId) {
        if self.bytes + opcodes.len() > Self::MAX_BYTES {
            return;
        }
        match self.lists.entry(hash, |(b, _)| **b == *opcodes, |(b, _)| list_hash(b)) {
            hashbrown::hash_table::Entry::Occupied(_) => {}
            hashbrown::hash_table::Entry::Vacant(slot) => {
                slot.insert((opcodes.into(), id));
                self.bytes += opcodes.len();
            }
        }
    }

    fn get(&self, opcodes: &[u8], hash: u64) -> Option<ValueId> {
        self.lists.find(hash, |(b, _)| **b == *opcodes).map(|&(_, id)| id)
    }

    pub(super) fn clear(&mut self) {
        self.lists.clear();
        self.bytes = 0;
    }
}

/// The hash of a list's opcodes (`(`, memo references and FRAMEs, `e`, as
/// [`FlatReader::list_end`] found them): the same walk ([`walk_list`]). The opcodes name
/// their bytes, so equal opcodes are equal bytes.
fn list_hash(b: &[u8]) -> u64 {
    walk_list(b, 0).map_or(0, |(_, hash)| hash)
}

/// The end (past its APPENDS) of the list of memo references whose MARK is at `b[start]`,
/// and the hash of its opcodes; `None` if it holds anything else or runs past `b`. Each
/// opcode is a word ([`list_item`]), four LONG_BINGETs in a row two words, hashed in two
/// lanes ([`FxHasher`] each) that take turns: a lane's multiply waits for its last one, and
/// one chain of them for every opcode was most of the walk's time.
#[inline]
fn walk_list(b: &[u8], start: usize) -> Option<(usize, u64)> {
    let mut i = start + 1;
    let (mut lane_a, mut lane_b) = (FxHasher::default(), FxHasher::default());
    loop {
        if let Some([k0, k1, k2, k3]) = four_long_gets(b, i) {
            lane_a.write_u64(k0 | k1 << 32);
            lane_b.write_u64(k2 | k3 << 32);
            i += 20;
            continue;
        }
        match list_item(b, i)? {
            ListItem::End => return Some((i + 1, lane_a.finish() ^ lane_b.finish().rotate_left(29))),
            item => {
                let (word, len) = item.word();
                lane_a.write_u64(word);
                i += len;
            }
        }
    }
}

/// What [`list_item`] finds at a position of a list of memo references.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum ListItem {
    /// A memo reference: its key, and its opcode's length (BINGET 2, LONG_BINGET 5).
    Get { key: u32, len: usize },
    /// A FRAME (9 bytes).
    Frame,
    /// APPENDS: the list's end.
    End,
}

impl ListItem {
    /// The item as a word of a list's hash, which tells it and its argument apart from any
    /// other (the key, and the opcode above it), and its length.
    fn word(self) -> (u64, usize) {
        match self {
            ListItem::Get { key, len: 5 } => (key as u64 | 1 << 32, 5),
            ListItem::Get { key, len } => (key as u64 | 2 << 32, len),
            ListItem::Frame | ListItem::End => (3 << 32, 9),
        }
    }
}

/// The opcode at `b[i]` of a list of memo references; `None` if it is anything else or runs
/// past `b`.
#[inline(always)]
fn list_item(b: &[u8], i: usize) -> Option<ListItem> {
    Some(match *b.get(i)? {
        b'j' => ListItem::Get { key: u32::from_le_bytes(b.get(i + 1..i + 5)?.try_into().ok()?), len: 5 },
        b'h' => ListItem::Get { key: *b.get(i + 1)? as u32, len: 2 },
        0x95 => {
            b.get(i + 8)?;
            ListItem::Frame
        }
        b'e' => ListItem::End,
        _ => return None,
    })
}

/// The keys of four LONG_BINGETs in a row at `b[i..i + 20]`, if that is what is there: most
/// of a large snapshot's bytes (a frame list of a program with more than 256 memo keys).
/// Their opcodes are read side by side, not each one after the last one's length is known.
#[inline(always)]
fn four_long_gets(b: &[u8], i: usize) -> Option<[u64; 4]> {
    let w: &[u8; 20] = b.get(i..i + 20)?.try_into().ok()?;
    if w[0] != b'j' || w[5] != b'j' || w[10] != b'j' || w[15] != b'j' {
        return None;
    }
    let key = |at: usize| u32::from_le_bytes([w[at + 1], w[at + 2], w[at + 3], w[at + 4]]) as u64;
    Some([key(0), key(5), key(10), key(15)])
}

/// Reads the opcodes of a [`FlatDict`] from `b` (the window after its EMPTY_DICT); `None` if
/// they are anything else, or run past the window.
pub(super) struct FlatReader<'b> {
    pub(super) b: &'b [u8],
    pub(super) i: usize,
    pub(super) known: &'b KnownLists,
    /// Where the opcodes of the dict's fresh list lie in `b`, and their [`list_hash`], for
    /// [`KnownLists::insert`].
    pub(super) fresh_list: Option<(u32, u32, u64)>,
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
                                let start = self.i;
                                let (end, hash) = self.list_end(start)?;
                                if let Some(id) = self.known.get(&self.b[start..end], hash) {
                                    self.i = end;
                                    return Some(Flat::Known { id, memo: memo_list });
                                }
                                self.memo_refs(memo, lists, at, start, end)?;
                                self.i = end;
                                self.fresh_list = Some((start as u32, end as u32, hash));
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

    /// The end (past its APPENDS) of the list of memo references whose MARK is at `start`,
    /// found without resolving them, and the [`list_hash`] of its opcodes; `None` if it holds
    /// anything else or runs past the window.
    #[inline]
    fn list_end(&self, start: usize) -> Option<(usize, u64)> {
        walk_list(self.b, start)
    }

    /// The memo references of the list whose opcodes [`FlatReader::list_end`] found at
    /// `start..end` (a stack's frames: most of a trace entry's bytes), resolved into `lists`.
    #[inline]
    fn memo_refs(&self, memo: &Memo, lists: &mut Vec<ValueId>, at: usize, start: usize, end: usize) -> Option<()> {
        // Past the MARK, up to the APPENDS: only memo references and FRAMEs, whole.
        let b = self.b.get(..end)?;
        let mut i = start + 1;
        loop {
            match list_item(b, i)? {
                ListItem::Get { key, len } => {
                    if lists.len() - at >= FLAT_MAX_LIST {
                        return None;
                    }
                    lists.push(memo.get(key)?);
                    i += len;
                }
                ListItem::Frame => i += 9,
                ListItem::End => return Some(()),
            }
        }
    }

    /// The dict's items up to its SETITEMS; `None` if it is not a flat dict.
    pub(super) fn dict(&mut self, memo: &Memo, items: &mut Vec<(ValueId, Flat)>, lists: &mut Vec<ValueId>) -> Option<()> {
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
            if matches!(v, Flat::List { .. } | Flat::Known { .. }) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A list's opcodes: MARK, memo references (BINGET below 256, LONG_BINGET above), a FRAME
    /// after every seventh, APPENDS.
    fn list_opcodes(keys: &[u32]) -> Vec<u8> {
        let mut b = vec![b'('];
        for (n, &k) in keys.iter().enumerate() {
            match u8::try_from(k) {
                Ok(k) => b.extend([b'h', k]),
                Err(_) => b.extend(std::iter::once(b'j').chain(k.to_le_bytes())),
            }
            if n % 7 == 6 {
                b.push(0x95);
                b.extend(65536u64.to_le_bytes());
            }
        }
        b.push(b'e');
        b
    }

    /// The hash `list_end` works out while it walks a list is the one the table rehashes with
    /// (`list_hash`): every list kept is found again after the table has grown many times, and
    /// a list of other references is not.
    #[test]
    fn lists_kept_are_found_by_the_hash_their_walk_gives() {
        let lists: Vec<Vec<u8>> = (0..5000u32).map(|n| list_opcodes(&(0..(n % 40 + 1)).map(|i| i * 97 + n).collect::<Vec<_>>())).collect();
        let mut known = KnownLists::default();
        let walk = |b: &[u8]| {
            let reader = FlatReader { b, i: 0, known: &KnownLists::default(), fresh_list: None };
            reader.list_end(0).expect("a list of memo references")
        };
        for (n, b) in lists.iter().enumerate() {
            let (end, hash) = walk(b);
            assert_eq!((end, hash), (b.len(), list_hash(b)), "list {n}");
            known.insert(b, hash, n as ValueId);
        }
        for (n, b) in lists.iter().enumerate() {
            assert_eq!(known.get(b, walk(b).1), Some(n as ValueId), "list {n}");
        }
        let other = list_opcodes(&[1, 2, 3, 100_000]);
        assert_eq!(known.get(&other, walk(&other).1), None);
        // A list followed by more opcodes ends at its APPENDS; anything but memo references
        // in it is no such list.
        let mut longer = lists[3].clone();
        longer.extend([b'K', 1]);
        assert_eq!(walk(&longer).0, lists[3].len());
        let bad = [b'(', b'h', 1, b'K', 2, b'e'];
        let reader = FlatReader { b: &bad, i: 0, known: &known, fresh_list: None };
        assert_eq!(reader.list_end(0), None);
    }
}
