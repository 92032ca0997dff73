//! Plain values as the arena holds them, and integers as pickle spells them (LONG1, LONG4, text).

use super::ValueId;

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
    pub(super) fn for_each_child(&self, mut f: impl FnMut(ValueId)) {
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

/// A little-endian two's complement integer (LONG1, LONG4) as an `i64`, or `None` when it
/// needs more than 64 bits.
pub(super) fn long_from_le(bytes: &[u8]) -> Option<i64> {
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
    // The bytes at the top of a word, shifted down with their sign (a copy of a slice this
    // short was a call to memcpy for every address and time of a snapshot).
    let mut word = 0u64;
    for (k, &b) in bytes.iter().enumerate() {
        word |= (b as u64) << (8 * k);
    }
    let shift = 64 - 8 * bytes.len() as u32;
    Some(((word << shift) as i64) >> shift)
}

/// Most digits of a text integer (INT, LONG), as Python's own limit for converting text to int
/// (`sys.get_int_max_str_digits()`).
pub(super) const MAX_DIGITS: usize = 4300;

/// A decimal integer (`-12`, `18446744073709551615`) as Python reads it, or `None` if it is
/// not one or has more than [`MAX_DIGITS`] digits.
pub(super) fn decimal_value(s: &str) -> Option<Value> {
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
pub(super) fn long_value(bytes: &[u8]) -> Value {
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

#[cfg(test)]
mod tests {
    use super::super::parse;
    use super::Value;

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

    /// LONG1 and LONG4 bytes of every length up to 10, each sign, as two's complement: the
    /// value is Python's (worked out through `i128`), `None` past 64 bits.
    #[test]
    fn little_endian_longs_read_as_twos_complement() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for len in 0..=10usize {
            for round in 0..200 {
                let mut bytes: Vec<u8> = (0..len)
                    .map(|_| {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        seed as u8
                    })
                    .collect();
                // Sign bytes that carry nothing, both ways, past the eighth.
                if len > 8 && round % 2 == 0 {
                    let fill = if bytes[7] & 0x80 != 0 { 0xff } else { 0 };
                    bytes[8..].fill(fill);
                }
                let mut wide = [if bytes.last().is_some_and(|b| b & 0x80 != 0) { 0xffu8 } else { 0 }; 16];
                wide[..len].copy_from_slice(&bytes);
                let python = i128::from_le_bytes(wide);
                assert_eq!(super::long_from_le(&bytes), i64::try_from(python).ok(), "{bytes:02x?}");
            }
        }
    }
}
