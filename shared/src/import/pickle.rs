//! A safe subset of Python's pickle virtual machine: protocols 0 to 5, plain data only.
//!
//! Memory snapshots are dicts, lists, tuples, strings and numbers; anything that would run
//! Python code (GLOBAL, REDUCE, ...) is refused. Values live in an arena and memo references
//! share the arena slot instead of copying, so a pickle that references one big value many times
//! costs no more memory than its own size.

use super::ImportError;

/// Index of a value in [`Pickle::values`].
pub type ValueId = u32;

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
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<ValueId>),
    Tuple(Vec<ValueId>),
    Dict(Vec<(ValueId, ValueId)>),
    Set(Vec<ValueId>),
}

impl Value {
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes(_) => "bytes",
            Value::List(_) => "list",
            Value::Tuple(_) => "tuple",
            Value::Dict(_) => "dict",
            Value::Set(_) => "set",
        }
    }
}

/// A parsed pickle: the arena and the root value.
#[derive(Debug)]
pub struct Pickle {
    pub values: Vec<Value>,
    pub root: ValueId,
    pub protocol: u8,
}

impl Pickle {
    pub fn get(&self, id: ValueId) -> &Value {
        &self.values[id as usize]
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
            Value::Dict(items) => items
                .iter()
                .rev()
                .find(|(k, _)| matches!(self.get(*k), Value::Str(s) if s == key))
                .map(|&(_, v)| v),
            _ => None,
        }
    }
}

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn err(&self, at: usize, reason: impl Into<String>) -> ImportError {
        ImportError::Pickle {
            offset: at,
            reason: reason.into(),
        }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], ImportError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len());
        match end {
            Some(end) => {
                let s = &self.data[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(self.err(
                self.pos,
                format!(
                    "truncated: {what} needs {n} bytes but only {} remain",
                    self.data.len() - self.pos
                ),
            )),
        }
    }

    fn u8(&mut self) -> Result<u8, ImportError> {
        Ok(self.take(1, "an opcode argument")?[0])
    }

    fn u16(&mut self) -> Result<u16, ImportError> {
        let b = self.take(2, "a 2-byte argument")?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, ImportError> {
        let b = self.take(4, "a 4-byte argument")?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, ImportError> {
        let b = self.take(8, "an 8-byte argument")?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn line(&mut self) -> Result<&'a str, ImportError> {
        let start = self.pos;
        let rest = &self.data[self.pos..];
        let nl = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| self.err(start, "truncated: a text argument has no terminating newline"))?;
        self.pos += nl + 1;
        std::str::from_utf8(&rest[..nl]).map_err(|_| self.err(start, "text argument is not UTF-8"))
    }

    fn len_arg(&mut self, n: u64) -> Result<usize, ImportError> {
        let remaining = (self.data.len() - self.pos) as u64;
        if n > remaining {
            return Err(self.err(
                self.pos,
                format!("truncated: a length of {n} bytes exceeds the {remaining} bytes that remain"),
            ));
        }
        Ok(n as usize)
    }
}

fn long_from_le(bytes: &[u8], at: usize) -> Result<i64, ImportError> {
    if bytes.is_empty() {
        return Ok(0);
    }
    if bytes.len() > 8 {
        // Python's encoder adds a sign byte; accept it when it carries no information.
        let (low, high) = bytes.split_at(8);
        let sign = if low[7] & 0x80 != 0 { 0xff } else { 0 };
        if high.iter().any(|&b| b != sign) {
            return Err(ImportError::Pickle {
                offset: at,
                reason: format!("integer of {} bytes does not fit in 64 bits", bytes.len()),
            });
        }
        return long_from_le(low, at);
    }
    let neg = bytes[bytes.len() - 1] & 0x80 != 0;
    let mut a = if neg { [0xffu8; 8] } else { [0u8; 8] };
    a[..bytes.len()].copy_from_slice(bytes);
    Ok(i64::from_le_bytes(a))
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

/// Parses a pickle into plain values.
pub fn parse(data: &[u8]) -> Result<Pickle, ImportError> {
    let mut r = Reader { data, pos: 0 };
    // Snapshots hold a value per 13–30 bytes: one slot per 12 bytes covers them without
    // regrowing (a regrowth copies the arena, costs page faults, and in wasm keeps both).
    let mut values: Vec<Value> = Vec::with_capacity(data.len() / 12);
    let mut stack: Vec<ValueId> = Vec::new();
    let mut marks: Vec<usize> = Vec::new();
    let mut memo = Memo::default();
    let mut protocol = 0u8;

    // Every value costs at least one opcode byte, so the arena never holds more than one value
    // per input byte; its growth is capped at that budget so that doubling cannot overshoot it
    // (a value is 32 bytes: the arena costs at most 32 bytes per input byte).
    let value_budget = data.len();
    macro_rules! push {
        ($v:expr) => {{
            if values.len() == values.capacity() {
                let room = value_budget.saturating_sub(values.len());
                if room == 0 {
                    return Err(r.err(r.pos, format!("more than {value_budget} values in a pickle of {value_budget} bytes")));
                }
                values.reserve_exact(values.capacity().max(64).min(room));
            }
            values.push($v);
            stack.push((values.len() - 1) as ValueId);
        }};
    }

    loop {
        let at = r.pos;
        let Some(&op) = data.get(r.pos) else {
            return Err(r.err(at, "truncated: the pickle ends before its STOP opcode"));
        };
        r.pos += 1;
        // Values below the last MARK belong to it: no opcode but the mark's own may take them
        // (as in CPython's unpickler, "unpickling stack underflow").
        let floor = marks.last().copied().unwrap_or(0);
        let pop = |stack: &mut Vec<ValueId>, r: &Reader| {
            if stack.len() <= floor {
                return Err(r.err(at, format!("opcode 0x{op:02x} needs a value but the stack is empty above its last MARK")));
            }
            stack
                .pop()
                .ok_or_else(|| r.err(at, format!("opcode 0x{op:02x} needs a value but the stack is empty")))
        };
        let pop_mark = |marks: &mut Vec<usize>, r: &Reader| {
            marks
                .pop()
                .ok_or_else(|| r.err(at, format!("opcode 0x{op:02x} needs a MARK but there is none")))
        };
        match op {
            0x80 => {
                protocol = r.u8()?;
                if protocol > 5 {
                    return Err(r.err(at, format!("unsupported pickle protocol {protocol}; expected 0 to 5")));
                }
            }
            0x95 => {
                r.u64()?;
            }
            b'.' => {
                let root = pop(&mut stack, &r)?;
                if r.pos < data.len() {
                    return Err(r.err(at, format!("{} bytes follow the STOP opcode; expected the pickle to end there", data.len() - r.pos)));
                }
                return Ok(Pickle { values, root, protocol });
            }
            b'(' => marks.push(stack.len()),
            // POP of a MARK with nothing above it drops the mark (CPython's load_pop).
            b'0' if marks.last() == Some(&stack.len()) && !marks.is_empty() => {
                marks.pop();
            }
            b'0' => {
                pop(&mut stack, &r)?;
            }
            b'1' => {
                let m = pop_mark(&mut marks, &r)?;
                stack.truncate(m);
            }
            b'2' => {
                let top = top_above(&stack, floor).ok_or_else(|| r.err(at, "DUP on an empty stack"))?;
                stack.push(top);
            }
            b'N' => push!(Value::None),
            0x88 => push!(Value::Bool(true)),
            0x89 => push!(Value::Bool(false)),
            b'I' => {
                let s = r.line()?;
                let v = match s {
                    "01" => Value::Bool(true),
                    "00" => Value::Bool(false),
                    _ => Value::Int(s.parse().map_err(|_| r.err(at, format!("INT argument {s:?} is not an integer")))?),
                };
                push!(v)
            }
            b'J' => {
                let v = r.u32()? as i32;
                push!(Value::Int(v as i64))
            }
            b'K' => {
                let v = r.u8()?;
                push!(Value::Int(v as i64))
            }
            b'M' => {
                let v = r.u16()?;
                push!(Value::Int(v as i64))
            }
            b'L' => {
                let s = r.line()?;
                let s = s.strip_suffix('L').unwrap_or(s);
                let v = s
                    .parse::<i64>()
                    .map_err(|_| r.err(at, format!("LONG argument {s:?} is not a 64-bit integer")))?;
                push!(Value::Int(v))
            }
            0x8a => {
                let n = r.u8()? as usize;
                let b = r.take(n, "LONG1 bytes")?;
                push!(Value::Int(long_from_le(b, at)?))
            }
            0x8b => {
                let n = r.u32()? as u64;
                let n = r.len_arg(n)?;
                let b = r.take(n, "LONG4 bytes")?;
                push!(Value::Int(long_from_le(b, at)?))
            }
            b'F' => {
                let s = r.line()?;
                let v = s
                    .parse::<f64>()
                    .map_err(|_| r.err(at, format!("FLOAT argument {s:?} is not a number")))?;
                push!(Value::Float(v))
            }
            b'G' => {
                let b = r.take(8, "BINFLOAT")?;
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                push!(Value::Float(f64::from_be_bytes(a)))
            }
            b'S' => {
                let s = r.line()?;
                let s = s
                    .strip_prefix(['\'', '"'])
                    .and_then(|s| s.strip_suffix(['\'', '"']))
                    .ok_or_else(|| r.err(at, "STRING argument is not quoted"))?;
                push!(Value::Str(s.to_owned()))
            }
            b'T' | b'U' => {
                let n = if op == b'T' { r.u32()? as u64 } else { r.u8()? as u64 };
                let n = r.len_arg(n)?;
                let b = r.take(n, "a string")?;
                // Protocol 2 byte strings are Latin-1 in Python 3.
                push!(Value::Str(b.iter().map(|&c| c as char).collect()))
            }
            b'V' => {
                let s = r.line()?;
                push!(Value::Str(s.to_owned()))
            }
            b'X' | 0x8c | 0x8d => {
                let n = match op {
                    b'X' => r.u32()? as u64,
                    0x8c => r.u8()? as u64,
                    _ => r.u64()?,
                };
                let n = r.len_arg(n)?;
                let b = r.take(n, "a unicode string")?;
                let s = std::str::from_utf8(b).map_err(|e| r.err(at, format!("string is not UTF-8: {e}")))?;
                push!(Value::Str(s.to_owned()))
            }
            b'B' | b'C' | 0x8e | 0x96 => {
                let n = match op {
                    b'B' => r.u32()? as u64,
                    b'C' => r.u8()? as u64,
                    _ => r.u64()?,
                };
                let n = r.len_arg(n)?;
                let b = r.take(n, "bytes")?;
                push!(Value::Bytes(b.to_vec()))
            }
            b']' => push!(Value::List(Vec::new())),
            b')' => push!(Value::Tuple(Vec::new())),
            b'}' => push!(Value::Dict(Vec::new())),
            0x8f => push!(Value::Set(Vec::new())),
            b'l' | b't' | 0x91 | b'd' => {
                let m = pop_mark(&mut marks, &r)?;
                let items: Vec<ValueId> = stack.split_off(m);
                let v = match op {
                    b'l' => Value::List(items),
                    b't' => Value::Tuple(items),
                    0x91 => Value::Set(items),
                    _ => {
                        if !items.len().is_multiple_of(2) {
                            return Err(r.err(at, "DICT needs an even number of items"));
                        }
                        Value::Dict(items.chunks(2).map(|c| (c[0], c[1])).collect())
                    }
                };
                push!(v)
            }
            0x85..=0x87 => {
                let n = (op - 0x84) as usize;
                if stack.len() < floor + n {
                    return Err(r.err(at, format!("TUPLE{n} needs {n} values on the stack")));
                }
                let items = stack.split_off(stack.len() - n);
                push!(Value::Tuple(items))
            }
            b'a' => {
                let v = pop(&mut stack, &r)?;
                let target = top_above(&stack, floor).ok_or_else(|| r.err(at, "APPEND without a list"))?;
                match &mut values[target as usize] {
                    Value::List(l) => l.push(v),
                    other => return Err(r.err(at, format!("APPEND to a {}, expected a list", other.type_name()))),
                }
            }
            b'e' | 0x90 => {
                let m = pop_mark(&mut marks, &r)?;
                let items = stack.split_off(m);
                let target = top_above(&stack, marks.last().copied().unwrap_or(0)).ok_or_else(|| r.err(at, "APPENDS without a list"))?;
                match &mut values[target as usize] {
                    Value::List(l) | Value::Set(l) => l.extend(items),
                    other => return Err(r.err(at, format!("APPENDS to a {}, expected a list", other.type_name()))),
                }
            }
            b's' => {
                let v = pop(&mut stack, &r)?;
                let k = pop(&mut stack, &r)?;
                let target = top_above(&stack, floor).ok_or_else(|| r.err(at, "SETITEM without a dict"))?;
                match &mut values[target as usize] {
                    Value::Dict(d) => d.push((k, v)),
                    other => return Err(r.err(at, format!("SETITEM on a {}, expected a dict", other.type_name()))),
                }
            }
            b'u' => {
                let m = pop_mark(&mut marks, &r)?;
                let items = stack.split_off(m);
                if !items.len().is_multiple_of(2) {
                    return Err(r.err(at, "SETITEMS needs an even number of items"));
                }
                let target = top_above(&stack, marks.last().copied().unwrap_or(0)).ok_or_else(|| r.err(at, "SETITEMS without a dict"))?;
                match &mut values[target as usize] {
                    Value::Dict(d) => d.extend(items.chunks(2).map(|c| (c[0], c[1]))),
                    other => return Err(r.err(at, format!("SETITEMS on a {}, expected a dict", other.type_name()))),
                }
            }
            b'p' | b'q' | b'r' | 0x94 => {
                let key = match op {
                    b'p' => {
                        let s = r.line()?;
                        s.parse::<u32>().map_err(|_| r.err(at, format!("PUT index {s:?} is not a number")))?
                    }
                    b'q' => r.u8()? as u32,
                    b'r' => r.u32()?,
                    _ => memo.count,
                };
                let top = top_above(&stack, floor).ok_or_else(|| r.err(at, "memoize on an empty stack"))?;
                memo.insert(key, top);
            }
            b'g' | b'h' | b'j' => {
                let key = match op {
                    b'g' => {
                        let s = r.line()?;
                        s.parse::<u32>().map_err(|_| r.err(at, format!("GET index {s:?} is not a number")))?
                    }
                    b'h' => r.u8()? as u32,
                    _ => r.u32()?,
                };
                let id = memo
                    .get(key)
                    .ok_or_else(|| r.err(at, format!("memo entry {key} is used before it is defined")))?;
                stack.push(id);
            }
            b'c' | 0x93 | b'i' => {
                let what = if op == b'c' || op == b'i' {
                    let module = r.line()?;
                    let name = r.line()?;
                    format!("{module}.{name}")
                } else {
                    "a class named on the stack".to_owned()
                };
                return Err(r.err(
                    at,
                    format!("the pickle constructs a Python object ({what}); expected plain data (dicts, lists, strings, numbers)"),
                ));
            }
            b'R' | b'b' | b'o' | 0x81 | 0x92 | b'P' | b'Q' | 0x82 | 0x83 | 0x84 | 0x97 | 0x98 => {
                return Err(r.err(
                    at,
                    format!("opcode 0x{op:02x} builds Python objects; expected plain data (dicts, lists, strings, numbers)"),
                ));
            }
            _ => {
                return Err(r.err(at, format!("unknown pickle opcode 0x{op:02x}")));
            }
        }
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
    fn refuses_objects_and_truncation_with_offsets() {
        // pickle.dumps(collections.OrderedDict(), protocol=2)
        let data = b"\x80\x02ccollections\nOrderedDict\nq\x00)Rq\x01.";
        let e = parse(data).unwrap_err().to_string();
        assert!(e.contains("collections.OrderedDict") && e.contains("byte 2"), "{e}");
        let e = parse(b"\x80\x04\x95").unwrap_err().to_string();
        assert!(e.contains("truncated"), "{e}");
        let e = parse(b"\x80\x04X\xff\xff\xff\x7f").unwrap_err().to_string();
        assert!(e.contains("exceeds"), "{e}");
    }
}
