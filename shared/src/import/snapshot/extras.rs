//! What a snapshot's trace entries carry besides memory: the pool the entry's memory belongs
//! to (`pool_id`, torch 2.12+), the thread's metadata (`user_metadata`, a text or compact JSON
//! set with `torch.cuda.memory._set_memory_metadata`), the allocator's own tag
//! (`internal_metadata`, 2.15+), and an annotation's text (`annotate` entries, 2.14+).
//!
//! An entry holds all of it in 2 bytes: an index into a table of the distinct combinations,
//! which are few (one pool per CUDA graph, one metadata text per phase a program marks).

use crate::hash::FastMap as HashMap;
use crate::import::pickle::{Arena, FlatValue, Value, ValueId};
use crate::model::{PoolId, StrId, Trace};

/// Longest text kept per note; a longer one is cut there (a program may set megabytes).
pub(super) const MAX_TEXT_BYTES: usize = 64 << 10;

/// One combination of an entry's extra fields. Indices are into [`Extras`]' tables.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub(super) struct Extra {
    /// A private pool (into [`Extras::pools`]); `None` for the default pool or none given.
    pub pool: Option<u16>,
    /// The entry named a pool (the default one included): a replay then trusts it over the
    /// segment's.
    pub pool_given: bool,
    pub user: Option<u32>,
    pub internal: Option<u32>,
}

/// The extra fields of a snapshot's entries, as tables that entries index.
pub(super) struct Extras {
    combos: Vec<Extra>,
    combo_index: HashMap<Extra, u16>,
    texts: Vec<String>,
    text_index: HashMap<String, u32>,
    /// Each text's id in the trace's strings, once one was needed.
    text_ids: Vec<Option<StrId>>,
    /// The private pools met, in order: they become [`Trace::pools`].
    pub pools: Vec<PoolId>,
    pool_index: HashMap<PoolId, u16>,
    /// `pool_id`s that were not a pair of integers.
    pub bad_pools: usize,
    /// Texts longer than [`MAX_TEXT_BYTES`], cut.
    pub cut_texts: usize,
    /// Entries whose combination did not fit the table (65 535 combinations): their extras
    /// are dropped.
    pub overflow: usize,
    /// Pools beyond the 65 535 an index holds: their entries count in the default pool.
    pub pool_overflow: usize,
}

impl Default for Extras {
    fn default() -> Self {
        let mut combo_index = HashMap::default();
        combo_index.insert(Extra::default(), 0);
        Self {
            combos: vec![Extra::default()],
            combo_index,
            texts: Vec::new(),
            text_index: HashMap::default(),
            text_ids: Vec::new(),
            pools: Vec::new(),
            pool_index: HashMap::default(),
            bad_pools: 0,
            cut_texts: 0,
            overflow: 0,
            pool_overflow: 0,
        }
    }
}

impl Extras {
    /// Index of an entry's extras, from its `pool_id`, `user_metadata` and
    /// `internal_metadata` values; 0 when it has none.
    pub fn read(&mut self, a: &Arena, pool: Option<FlatValue>, user: Option<FlatValue>, internal: Option<FlatValue>) -> u16 {
        let (pool, pool_given) = match pool {
            None | Some(FlatValue::None) => (None, false),
            Some(v) => match read_pool(a, v) {
                Some(id) => (self.pool(id), true),
                None => {
                    self.bad_pools += 1;
                    (None, false)
                }
            },
        };
        let user = user.and_then(|v| self.read_text(a, v));
        let internal = internal.and_then(|v| self.read_text(a, v));
        self.combo(Extra { pool, pool_given, user, internal })
    }

    /// A segment's private pool, from its `segment_pool_id`; `None` for the default pool or
    /// an id that is not a pair (counted as such).
    pub fn segment_pool(&mut self, a: &Arena, id: ValueId) -> Option<u16> {
        match read_pool(a, FlatValue::Id(id)) {
            Some(pool) => self.pool(pool),
            None => {
                self.bad_pools += 1;
                None
            }
        }
    }

    fn combo(&mut self, e: Extra) -> u16 {
        if let Some(&k) = self.combo_index.get(&e) {
            return k;
        }
        let Ok(k) = u16::try_from(self.combos.len()) else {
            self.overflow += 1;
            return 0;
        };
        self.combos.push(e);
        self.combo_index.insert(e, k);
        k
    }

    pub fn get(&self, k: u16) -> Extra {
        self.combos.get(k as usize).copied().unwrap_or_default()
    }

    /// The index of a private pool, registering it; `None` for the default pool `(0, 0)`.
    pub fn pool(&mut self, id: PoolId) -> Option<u16> {
        if id == PoolId(0, 0) {
            return None;
        }
        if let Some(&k) = self.pool_index.get(&id) {
            return Some(k);
        }
        let Ok(k) = u16::try_from(self.pools.len()) else {
            self.pool_overflow += 1;
            return None;
        };
        self.pools.push(id);
        self.pool_index.insert(id, k);
        Some(k)
    }

    /// A text's index; `None` for an empty text or a value that is not a string.
    fn read_text(&mut self, a: &Arena, v: FlatValue) -> Option<u32> {
        let s = match v {
            FlatValue::Str(s) => s,
            FlatValue::Id(id) => match a.get(id) {
                Value::Str(s) => s.as_str(),
                _ => return None,
            },
            _ => return None,
        };
        if s.is_empty() {
            return None;
        }
        let s = if s.len() > MAX_TEXT_BYTES {
            self.cut_texts += 1;
            let mut end = MAX_TEXT_BYTES;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            std::borrow::Cow::Owned(format!("{}… (cut from {} bytes)", &s[..end], s.len()))
        } else {
            std::borrow::Cow::Borrowed(s)
        };
        if let Some(&k) = self.text_index.get(s.as_ref()) {
            return Some(k);
        }
        let k = u32::try_from(self.texts.len()).ok()?;
        self.texts.push(s.clone().into_owned());
        self.text_index.insert(s.into_owned(), k);
        self.text_ids.push(None);
        Some(k)
    }

    /// The trace's string for text `k`.
    pub fn trace_text(&mut self, k: u32, trace: &mut Trace) -> StrId {
        let k = k as usize;
        if let Some(id) = self.text_ids[k] {
            return id;
        }
        let id = trace.strings.intern(&self.texts[k]);
        self.text_ids[k] = Some(id);
        id
    }

    /// What the importer could not keep, as the trace's warnings.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if self.bad_pools > 0 {
            w.push(format!(
                "{} trace entries have a `pool_id` that is not a pair of integers: their memory is counted in the pool of its segment",
                self.bad_pools
            ));
        }
        if self.cut_texts > 0 {
            w.push(format!("{} metadata texts longer than {} KiB were cut there", self.cut_texts, MAX_TEXT_BYTES >> 10));
        }
        if self.overflow > 0 {
            w.push(format!(
                "{} trace entries carry more distinct pool and metadata combinations than the importer keeps (65 535): their metadata was dropped",
                self.overflow
            ));
        }
        if self.pool_overflow > 0 {
            w.push(format!("{} pool ids beyond the 65 535 the importer keeps were counted in the default pool", self.pool_overflow));
        }
        w
    }
}

/// A `pool_id`: a pair of integers (a tuple, or a list as other tools write it).
fn read_pool(a: &Arena, v: FlatValue) -> Option<PoolId> {
    if let FlatValue::Pair(x, y) = v {
        return Some(PoolId(x, y));
    }
    let items = match v {
        FlatValue::Id(id) => match a.get(id) {
            Value::Tuple(items) | Value::List(items) => items.as_slice(),
            _ => return None,
        },
        FlatValue::List(items) => items,
        _ => return None,
    };
    let [x, y] = items else { return None };
    match (a.get(*x), a.get(*y)) {
        (Value::Int(x), Value::Int(y)) => Some(PoolId(*x, *y)),
        _ => None,
    }
}
