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
//!
//! Files: `arena.rs` (values and the memo), `input.rs` (the bytes in), `flat.rs` (entries read
//! ahead without building them), `vm.rs` (the opcodes); this one the values, the [`Hook`] and
//! the entry points.

mod arena;
mod flat;
mod input;
mod vm;

pub use arena::Arena;
use arena::*;
use flat::*;
pub use flat::{FlatDict, FlatTaken, FlatValue};
use input::*;
use vm::*;

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

/// Keeps every value.
pub struct KeepAll;

impl Hook for KeepAll {
    fn append(&mut self, _: &mut Arena, _: ValueId, item: ValueId) -> Result<ValueId, ImportError> {
        Ok(item)
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
