//! The opcode machine: reads opcodes from the input and applies them to the stack, the arena
//! and the memo, passing list items through the hook.

use super::arena::Arena;
use super::input::{Input, CUT_STRING_KEEPS, MAX_ARGUMENT_BYTES};
use super::read_ahead::{Flat, FlatDict, FlatReader, KnownLists, FLAT_LOOKAHEAD};
use super::value::{decimal_value, long_value, Value, MAX_DIGITS};
use super::{Hook, Pickle, ValueId};
use crate::import::ImportError;
use std::io::Read;

/// Runs the machine over `src` to its STOP ([`super::parse_stream`]).
pub(super) fn run(src: impl Read, size_hint: Option<u64>, hook: &mut impl Hook) -> Result<Pickle, ImportError> {
    let mut vm = Vm {
        r: Input::new(src),
        a: Arena::new(),
        stack: Vec::new(),
        marks: Vec::new(),
        protocol: 0,
        size_hint,
        hook,
        flat_items: Vec::new(),
        flat_lists: Vec::new(),
        pairs: Default::default(),
        known_lists: Default::default(),
        last_str: None,
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
    /// Fresh lists of read-ahead dicts the hook took, by their opcodes.
    known_lists: KnownLists,
    /// The last fresh string of a read-ahead dict found among the arena's strings, and the id
    /// it found (a string the arena keeps to the end): a snapshot's entries repeat one (their
    /// `compile_context`, `'N/A'`), which then costs a compare, not a check and a hash lookup.
    last_str: Option<(Vec<u8>, ValueId)>,
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
        if std::mem::take(&mut self.a.rebound) {
            self.known_lists.clear();
        }
        let mut reader = FlatReader { b: window, i: 0, known: &self.known_lists, fresh_list: None };
        if reader.dict(&self.a.memo, &mut self.flat_items, &mut self.flat_lists).is_none() {
            return Ok(false);
        }
        let (consumed, fresh_list) = (reader.i, reader.fresh_list);
        let dict = FlatDict { window, items: &self.flat_items, lists: &self.flat_lists };
        let forgotten = self.a.forgotten;
        let Some(taken) = self.hook.flat_dict(&mut self.a, &dict) else { return Ok(false) };
        let a = &mut self.a;
        // The memo keys, in the order the dict's MEMOIZEs come.
        a.memoize(a.memo.count, taken.dict);
        for &(_, v) in &self.flat_items {
            match v {
                Flat::Str { at, len, memo: true } => {
                    let bytes = &window[at as usize..(at + len) as usize];
                    if let Some(id) = self.last_str.as_ref().filter(|(last, _)| **last == *bytes).map(|&(_, id)| id) {
                        a.memoize(a.memo.count, id);
                        continue;
                    }
                    let text = std::str::from_utf8(bytes).unwrap_or_default();
                    match a.strings.get(text) {
                        Some(&first) => {
                            a.memoize(a.memo.count, first);
                            self.last_str = Some((bytes.to_vec(), first));
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
                Flat::Known { id, memo: true } => {
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
        // would when a built dict went. Memo keys name every value of the dict that is not
        // fresh, so only a key the hook forgot leaves one to go (most dicts: none, and no look
        // at each value's holders).
        if a.forgotten != forgotten {
            for &(k, v) in &self.flat_items {
                a.settle(k);
                if let Flat::Id(id) = v {
                    a.settle(id);
                }
            }
            self.flat_lists.iter().for_each(|&id| a.settle(id));
        }
        if let (Some(id), Some((start, end, hash))) = (taken.list, fresh_list) {
            self.known_lists.insert(&window[start as usize..end as usize], hash, id);
        }
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
    use super::super::{is_opaque, parse, parse_stream, Arena, FlatDict, FlatTaken, Hook, Pickle, Value, ValueId, OPAQUE};
    use super::{Flat, ImportError};

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

    /// A hook that takes dicts appended to lists as opaque ids (other items stay): a built one after forgetting
    /// its memo key and giving up its reference, as the snapshot importer does; a read-ahead
    /// one after forgetting the memo key of every list it names.
    struct Forgets(u32);

    impl Hook for Forgets {
        const TAKES_FLAT_DICTS: bool = true;

        fn append(&mut self, a: &mut Arena, _: ValueId, item: ValueId) -> Result<ValueId, ImportError> {
            if !matches!(a.get(item), Value::Dict(_)) {
                return Ok(item);
            }
            self.0 += 1;
            let opaque = OPAQUE | self.0;
            a.forget_memo(item, opaque);
            a.drop_ref(item);
            Ok(opaque)
        }

        fn flat_dict(&mut self, a: &mut Arena, d: &FlatDict) -> Option<FlatTaken> {
            for &(_, v) in d.items {
                if let Flat::Id(id) = v {
                    if matches!(a.get(id), Value::List(_)) {
                        self.0 += 1;
                        a.forget_memo(id, OPAQUE | self.0);
                    }
                }
            }
            self.0 += 1;
            Some(FlatTaken { dict: OPAQUE | self.0, list: None })
        }
    }

    /// A list that only the memo names when a read-ahead dict names it (the built dict that
    /// held it was taken away) is freed once the hook forgets its key, and not before.
    #[test]
    fn a_value_a_read_ahead_dict_names_goes_once_the_hook_forgets_its_key() {
        // [{'f': [1, 2], 'x': 1.5}, {'f': <memo 3>}], appended in two batches: the first dict
        // is built (a float is no read-ahead value) and taken at its APPENDS, which leaves the
        // list to the memo alone; the second is read ahead.
        let mut data = b"\x80\x04]\x94(}\x94(\x8c\x01f\x94]\x94(K\x01K\x02e".to_vec();
        data.extend_from_slice(b"\x8c\x01x\x94G?\xf8\x00\x00\x00\x00\x00\x00ue(");
        let second = b"}\x94(h\x02h\x03u";
        let lists = |p: &Pickle| p.arena.values.iter().filter(|v| matches!(v, Value::List(l) if l.len() == 2 && !is_opaque(l[0]))).count();
        let with_second = [&data[..], second, b"e."].concat();
        let p = parse_stream(&with_second[..], None, &mut Forgets(0)).unwrap();
        let Value::List(items) = p.get(p.root) else { panic!("not a list") };
        assert_eq!(items.len(), 2);
        assert!(items.iter().all(|&i| is_opaque(i)));
        assert_eq!(lists(&p), 0, "the list the hook forgot is still held");
        // Without the second dict the memo still names the list: it stays.
        let p = parse_stream(&[&data[..], b"e."].concat()[..], None, &mut Forgets(0)).unwrap();
        assert_eq!(lists(&p), 1);
    }
}
