//! Interned strings: every name in a trace (layers, ops, frames, streams) is held once and
//! named by a [`StrId`].

use crate::hash::FastMap as HashMap;
use serde::{Deserialize, Serialize};

/// Index into [`StringTable`]. `StrId::NONE` stands for "no string" (e.g. no layer).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StrId(pub u32);

impl StrId {
    pub const NONE: StrId = StrId(u32::MAX);

    pub fn is_none(self) -> bool {
        self == Self::NONE
    }

    /// [`Self::is_none`] for serde's `skip_serializing_if`.
    pub fn is_none_ref(&self) -> bool {
        self.is_none()
    }
}

/// Interned strings: every name in a trace (layers, ops, frames, streams) is stored once.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(from = "Vec<String>", into = "Vec<String>")]
pub struct StringTable {
    strings: Vec<String>,
    index: HashMap<String, u32>,
}

impl From<Vec<String>> for StringTable {
    fn from(strings: Vec<String>) -> Self {
        let index = strings.iter().enumerate().map(|(i, s)| (s.clone(), i as u32)).collect();
        Self { strings, index }
    }
}

impl From<StringTable> for Vec<String> {
    fn from(table: StringTable) -> Self {
        table.strings
    }
}

impl StringTable {
    pub fn intern(&mut self, s: &str) -> StrId {
        if let Some(&id) = self.index.get(s) {
            return StrId(id);
        }
        let id = self.strings.len() as u32;
        self.strings.push(s.to_owned());
        self.index.insert(s.to_owned(), id);
        StrId(id)
    }

    /// The id of `s` if it was interned.
    pub fn lookup(&self, s: &str) -> Option<StrId> {
        self.index.get(s).map(|&i| StrId(i))
    }

    /// The string of `id`; `None` for [`StrId::NONE`] or an id out of range.
    pub fn get(&self, id: StrId) -> Option<&str> {
        self.strings.get(id.0 as usize).map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.strings.len()
    }

    pub fn is_empty(&self) -> bool {
        self.strings.is_empty()
    }

    pub fn heap_bytes(&self) -> usize {
        // Each string is held twice (vector and index key) plus the map's slots.
        self.strings.iter().map(|s| 2 * s.capacity()).sum::<usize>()
            + self.strings.capacity() * std::mem::size_of::<String>()
            + self.index.capacity() * (std::mem::size_of::<String>() + 4 + 8)
    }
}
