//! The pickle seen through types: a [`View`] that reads fields and names where a value is
//! when it is not what a snapshot needs ([`Loc`]), and the allocator settings read from it.

use crate::allocator::AllocatorConfig;
use crate::import::pickle::{Pickle, Value, ValueId};
use crate::import::ImportError;

/// Where a value is, as a JSON-like path (`device_traces[0][12]`), built only when an error
/// needs it: a snapshot has hundreds of thousands of entries and frames.
pub(super) trait Loc {
    fn loc(&self) -> String;
}

impl Loc for str {
    fn loc(&self) -> String {
        self.to_owned()
    }
}

impl Loc for String {
    fn loc(&self) -> String {
        self.clone()
    }
}

impl<F: Fn() -> String> Loc for F {
    fn loc(&self) -> String {
        self()
    }
}

/// A typed view of the pickle with JSON-path-like error locations.
pub(super) struct View<'a> {
    pub(super) p: &'a Pickle,
}

impl<'a> View<'a> {
    pub(super) fn err(&self, path: &(impl Loc + ?Sized), reason: impl Into<String>) -> ImportError {
        ImportError::Snapshot { path: path.loc(), reason: reason.into() }
    }

    pub(super) fn list(&self, id: ValueId, path: &(impl Loc + ?Sized)) -> Result<&'a [ValueId], ImportError> {
        match self.p.get(id) {
            Value::List(l) | Value::Tuple(l) => Ok(l),
            other => Err(self.err(path, format!("expected a list, found {}", other.type_name()))),
        }
    }

    pub(super) fn field(&self, id: ValueId, key: &str, path: &(impl Loc + ?Sized)) -> Result<ValueId, ImportError> {
        if !matches!(self.p.get(id), Value::Dict(_)) {
            return Err(self.err(path, format!("expected a dict, found {}", self.p.get(id).type_name())));
        }
        self.p.dict_get(id, key).ok_or_else(|| self.err(path, format!("expected key '{key}', which is missing")))
    }

    pub(super) fn int(&self, id: ValueId, key: &str, path: &(impl Loc + ?Sized)) -> Result<i64, ImportError> {
        let v = self.field(id, key, path)?;
        match self.p.get(v) {
            Value::Int(i) => Ok(*i),
            Value::Bool(b) => Ok(*b as i64),
            Value::BigInt(_) => Err(self.err(&format!("{}.{key}", path.loc()), "expected a 64-bit integer, found a larger one")),
            other => Err(self.err(&format!("{}.{key}", path.loc()), format!("expected an integer, found {}", other.type_name()))),
        }
    }

    pub(super) fn size(&self, id: ValueId, key: &str, path: &(impl Loc + ?Sized)) -> Result<u64, ImportError> {
        if let Some(u) = self.p.dict_get(id, key).and_then(|v| self.p.get(v).as_u64()) {
            return Ok(u);
        }
        let v = self.int(id, key, path)?;
        u64::try_from(v).map_err(|_| self.err(&format!("{}.{key}", path.loc()), format!("expected a size ≥ 0, found {v}")))
    }

    pub(super) fn opt_int(&self, id: ValueId, key: &str) -> Option<i64> {
        match self.p.dict_get(id, key).map(|v| self.p.get(v)) {
            Some(Value::Int(i)) => Some(*i),
            _ => None,
        }
    }

    pub(super) fn str(&self, id: ValueId, key: &str, path: &(impl Loc + ?Sized)) -> Result<&'a str, ImportError> {
        let v = self.field(id, key, path)?;
        match self.p.get(v) {
            Value::Str(s) => Ok(s),
            other => Err(self.err(&format!("{}.{key}", path.loc()), format!("expected a string, found {}", other.type_name()))),
        }
    }

    pub(super) fn opt_str(&self, id: ValueId, key: &str) -> Option<&'a str> {
        match self.p.dict_get(id, key).map(|v| self.p.get(v)) {
            Some(Value::Str(s)) => Some(s),
            _ => None,
        }
    }
}

/// Most JSON nodes made from the allocator settings (a dozen in real snapshots): shared
/// references could otherwise make a few bytes of pickle expand exponentially.
pub(super) const SETTINGS_NODE_BUDGET: usize = 4096;

/// Converts a pickle value to JSON for display (allocator settings); past `depth` 16 or the
/// node budget, values become `null`.
pub(super) fn to_json(p: &Pickle, id: ValueId, depth: usize, budget: &mut usize) -> serde_json::Value {
    use serde_json::Value as J;
    if *budget == 0 {
        return J::Null;
    }
    *budget -= 1;
    if depth > 16 {
        return J::Null;
    }
    match p.get(id) {
        Value::None => J::Null,
        Value::Bool(b) => J::Bool(*b),
        Value::Int(i) => J::from(*i),
        Value::BigInt(_) => p.get(id).as_u64().map_or_else(|| J::String("<an integer beyond 64 bits>".into()), J::from),
        Value::Float(f) => serde_json::Number::from_f64(*f).map(J::Number).unwrap_or(J::Null),
        Value::Str(s) => J::String(s.clone()),
        Value::Bytes(b) => J::String(format!("<{} bytes>", b.len())),
        Value::List(l) | Value::Tuple(l) | Value::Set(l) => {
            let mut items = Vec::new();
            for &v in l {
                if *budget == 0 {
                    break;
                }
                items.push(to_json(p, v, depth + 1, budget));
            }
            J::Array(items)
        }
        Value::Dict(d) => {
            let mut m = serde_json::Map::new();
            for &(k, v) in d {
                if *budget == 0 {
                    break;
                }
                let key = match p.get(k) {
                    Value::Str(s) => s.clone(),
                    Value::Int(i) => i.to_string(),
                    other => other.type_name().to_owned(),
                };
                m.insert(key, to_json(p, v, depth + 1, budget));
            }
            J::Object(m)
        }
    }
}

pub(super) fn config_from_settings(v: &View, settings: Option<ValueId>) -> AllocatorConfig {
    let mut c = AllocatorConfig::default();
    let Some(s) = settings else { return c };
    if let Some(m) = v.opt_int(s, "max_split_size") {
        if m > 0 {
            c.max_split_bytes = Some(m as u64);
        }
    }
    if let Some(Value::Bool(b)) = v.p.dict_get(s, "expandable_segments").map(|x| v.p.get(x)) {
        c.expandable_segments = *b;
    }
    if let Some(Value::Dict(d)) = v.p.dict_get(s, "roundup_power2_divisions").map(|x| v.p.get(x)) {
        let mut divs = Vec::new();
        for &(k, val) in d {
            let (Value::Str(k), Value::Int(n)) = (v.p.get(k), v.p.get(val)) else { continue };
            let Ok(mb) = k.parse::<u64>() else { continue };
            if mb == 0 || !mb.is_power_of_two() {
                continue;
            }
            let idx = mb.trailing_zeros() as usize;
            if divs.len() <= idx {
                divs.resize(idx + 1, 0);
            }
            divs[idx] = (*n).max(0) as u64;
        }
        if divs.iter().any(|&d| d > 1) {
            c.roundup_power2_divisions = divs;
        }
    }
    c
}
