//! Importer of PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot` pickles).
//!
//! Trace entries record requested sizes; the allocator counts blocks. The importer therefore
//! replays segments and blocks ([`crate::allocator`]) starting from the memory that existed
//! before recording began, recovered from the final `segments` state, so that every event's
//! `allocated_bytes` is what `torch.cuda.memory_allocated()` said at that moment.

mod extras;

use super::pickle::{self, FlatDict, FlatTaken, FlatValue, Pickle, Value, ValueId};
use super::ImportError;
use crate::allocator::{AllocatorConfig, AllocatorState, SMALL_REQUEST_BYTES, SMALL_SEGMENT_BYTES};
use crate::hash::{FastMap as HashMap, FastSet as HashSet};
use crate::model::{
    BlockInfo, BlockState, Device, EventNote, EventRecord, EventType, Frame, LayerScope, NoteKind, Phase, Pool, SegmentInfo, SourceFormat,
    StrId, Totals, Trace, TraceMeta,
};
use extras::Extras;

/// Where a value is, as a JSON-like path (`device_traces[0][12]`), built only when an error
/// needs it: a snapshot has hundreds of thousands of entries and frames.
trait Loc {
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
struct View<'a> {
    p: &'a Pickle,
}

impl<'a> View<'a> {
    fn err(&self, path: &(impl Loc + ?Sized), reason: impl Into<String>) -> ImportError {
        ImportError::Snapshot { path: path.loc(), reason: reason.into() }
    }

    fn list(&self, id: ValueId, path: &(impl Loc + ?Sized)) -> Result<&'a [ValueId], ImportError> {
        match self.p.get(id) {
            Value::List(l) | Value::Tuple(l) => Ok(l),
            other => Err(self.err(path, format!("expected a list, found {}", other.type_name()))),
        }
    }

    fn field(&self, id: ValueId, key: &str, path: &(impl Loc + ?Sized)) -> Result<ValueId, ImportError> {
        if !matches!(self.p.get(id), Value::Dict(_)) {
            return Err(self.err(path, format!("expected a dict, found {}", self.p.get(id).type_name())));
        }
        self.p.dict_get(id, key).ok_or_else(|| self.err(path, format!("expected key '{key}', which is missing")))
    }

    fn int(&self, id: ValueId, key: &str, path: &(impl Loc + ?Sized)) -> Result<i64, ImportError> {
        let v = self.field(id, key, path)?;
        match self.p.get(v) {
            Value::Int(i) => Ok(*i),
            Value::Bool(b) => Ok(*b as i64),
            Value::BigInt(_) => Err(self.err(&format!("{}.{key}", path.loc()), "expected a 64-bit integer, found a larger one")),
            other => Err(self.err(&format!("{}.{key}", path.loc()), format!("expected an integer, found {}", other.type_name()))),
        }
    }

    fn size(&self, id: ValueId, key: &str, path: &(impl Loc + ?Sized)) -> Result<u64, ImportError> {
        if let Some(u) = self.p.dict_get(id, key).and_then(|v| self.p.get(v).as_u64()) {
            return Ok(u);
        }
        let v = self.int(id, key, path)?;
        u64::try_from(v).map_err(|_| self.err(&format!("{}.{key}", path.loc()), format!("expected a size ≥ 0, found {v}")))
    }

    fn opt_int(&self, id: ValueId, key: &str) -> Option<i64> {
        match self.p.dict_get(id, key).map(|v| self.p.get(v)) {
            Some(Value::Int(i)) => Some(*i),
            _ => None,
        }
    }

    fn str(&self, id: ValueId, key: &str, path: &(impl Loc + ?Sized)) -> Result<&'a str, ImportError> {
        let v = self.field(id, key, path)?;
        match self.p.get(v) {
            Value::Str(s) => Ok(s),
            other => Err(self.err(&format!("{}.{key}", path.loc()), format!("expected a string, found {}", other.type_name()))),
        }
    }

    fn opt_str(&self, id: ValueId, key: &str) -> Option<&'a str> {
        match self.p.dict_get(id, key).map(|v| self.p.get(v)) {
            Some(Value::Str(s)) => Some(s),
            _ => None,
        }
    }
}

/// Most JSON nodes made from the allocator settings (a dozen in real snapshots): shared
/// references could otherwise make a few bytes of pickle expand exponentially.
const SETTINGS_NODE_BUDGET: usize = 4096;

/// What walking the snapshot may cost: one unit per segment, block, trace entry and
/// annotation and one per item of their dicts. Without shared references each unit has bytes
/// of its own (a dict is at least one opcode, an item at least two), so a budget of the input's
/// length never refuses a real snapshot; with them (`[L]*N`, a list referenced N times through
/// the memo) a few bytes would expand to N copies of L, and are counted as such.
struct WalkBudget {
    left: usize,
    input_bytes: usize,
}

impl WalkBudget {
    fn charge(&mut self, v: &View, id: ValueId, path: &(impl Loc + ?Sized)) -> Result<(), ImportError> {
        let items = match v.p.get(id) {
            Value::Dict(d) => d.len(),
            _ => 0,
        };
        self.charge_items(items, path)
    }

    fn charge_items(&mut self, items: usize, path: &(impl Loc + ?Sized)) -> Result<(), ImportError> {
        match self.left.checked_sub(1 + items) {
            Some(left) => {
                self.left = left;
                Ok(())
            }
            None => Err(ImportError::Snapshot {
                path: path.loc(),
                reason: format!(
                    "the snapshot's shared references expand to more segments, blocks and entries than a pickle of {} bytes can hold; expected each to be its own object",
                    self.input_bytes
                ),
            }),
        }
    }
}

/// Most devices a snapshot may name (device indices are stored in a byte).
const MAX_DEVICES: usize = 256;
/// The device index pinned host memory's entries and segments take while the importer reads
/// them (CUDA devices are below it); it becomes the device after the last CUDA one.
const HOST_DEVICE: u8 = 255;

/// Converts a pickle value to JSON for display (allocator settings); past `depth` 16 or the
/// node budget, values become `null`.
fn to_json(p: &Pickle, id: ValueId, depth: usize, budget: &mut usize) -> serde_json::Value {
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

fn config_from_settings(v: &View, settings: Option<ValueId>) -> AllocatorConfig {
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

/// An entry's `size`: what it says, read the same way by the [`Compactor`] and the walk.
/// `Err(Some(reason))` for a value that is not a size, `Err(None)` when it is missing (a
/// `snapshot` entry needs none).
fn entry_size(action: Action, size: Option<&Value>) -> Result<u64, Option<String>> {
    match size {
        Some(Value::Int(i)) if *i >= 0 => Ok(*i as u64),
        Some(Value::Bool(b)) => Ok(u64::from(*b)),
        _ if matches!(action, Action::Snapshot | Action::Annotate) => Ok(0),
        Some(Value::Int(i)) => Err(Some(format!("expected a size ≥ 0, found {i}"))),
        Some(Value::BigInt(_)) => Err(Some("expected a size below 2⁶³ bytes, found a larger integer".to_owned())),
        Some(other) => Err(Some(format!("expected an integer, found {}", other.type_name()))),
        None => Err(None),
    }
}

/// The fields of a trace entry's dict that its record keeps, in [`Compactor::entry`]'s order.
const ENTRY_KEYS: [&str; 9] = ["action", "addr", "size", "stream", "time_us", "frames", "pool_id", "user_metadata", "internal_metadata"];

/// One trace entry, decoded. 40 bytes: a snapshot's entries are held until they are sorted by
/// time.
#[derive(Clone)]
struct Entry {
    addr: u64,
    size: u64,
    time_us: i64,
    /// Position in its device's trace (for error paths; entries are then sorted by time);
    /// [`UNPLACED`] while a compacted entry has not been found in `device_traces` yet.
    index: u32,
    frames: PackedFrames,
    /// Items of the entry's dict, for the [`WalkBudget`].
    items: u16,
    /// In [`LocalStreams`].
    stream: u16,
    /// Its pool and metadata, in [`Extras`] (0: none).
    extra: u16,
    device: u8,
    action: Action,
}

const _: () = assert!(std::mem::size_of::<Entry>() == 40);

/// A snapshot's entries, in blocks of at most [`EntryBlocks::BLOCK`] while it streams: a `Vec`
/// doubles as it grows, and in a browser's worker (whose memory never shrinks) a 19.2 M-entry
/// snapshot rose from 1.29 to 2.54 GiB at one doubling of 0.67 to 1.34 GB of entries, 570 MB
/// of it never used. Blocks grow the memory one block at a time, and the replay gives each
/// block back as it is done, while the trace's columns grow.
#[derive(Default)]
struct EntryBlocks {
    blocks: Vec<Vec<Entry>>,
    len: usize,
}

impl EntryBlocks {
    /// Entries per block while streaming (2.5 MiB).
    const BLOCK: usize = 1 << 16;

    fn len(&self) -> usize {
        self.len
    }

    fn push(&mut self, e: Entry) {
        match self.blocks.last_mut() {
            Some(b) if b.len() < Self::BLOCK => b.push(e),
            // Each block grows from empty (to exactly `BLOCK`, a power of two), so a small
            // snapshot holds what its entries need, not a whole block.
            _ => self.blocks.push(vec![e]),
        }
        self.len += 1;
    }

    fn get(&self, k: usize) -> &Entry {
        &self.blocks[k / Self::BLOCK][k % Self::BLOCK]
    }

    fn get_mut(&mut self, k: usize) -> &mut Entry {
        &mut self.blocks[k / Self::BLOCK][k % Self::BLOCK]
    }

    /// Adds `more` after these entries, as a block of its own (indices past it no longer hold).
    fn append(&mut self, more: Vec<Entry>) {
        self.len += more.len();
        if !more.is_empty() {
            self.blocks.push(more);
        }
    }

    /// Keeps the entries `keep` takes, in place.
    fn retain(&mut self, keep: impl Fn(&Entry) -> bool) {
        for b in &mut self.blocks {
            b.retain(&keep);
        }
        self.blocks.retain(|b| !b.is_empty());
        self.len = self.blocks.iter().map(Vec::len).sum();
    }

    fn iter(&self) -> impl Iterator<Item = &Entry> {
        self.blocks.iter().flatten()
    }

    fn for_each_mut(&mut self, f: impl FnMut(&mut Entry)) {
        self.blocks.iter_mut().flatten().for_each(f);
    }

    /// The first and the last entry (blocks may differ in length: not through [`Self::get`]).
    fn ends(&self) -> Option<(&Entry, &Entry)> {
        Some((self.blocks.first()?.first()?, self.blocks.last()?.last()?))
    }

    /// Sorted by `key`, stably; entries already in order are left where they are (checking
    /// costs a pass, sorting far more), others become one block.
    fn sort_by_key<K: Ord>(&mut self, key: impl Fn(&Entry) -> K) {
        if self.iter().is_sorted_by_key(&key) {
            return;
        }
        let mut all = Vec::with_capacity(self.len);
        for b in std::mem::take(&mut self.blocks) {
            all.extend(b);
        }
        // Stable, so it finds the long runs already in order (half as many instructions on real
        // snapshots); its buffer of half the entries is less than what the replay adds later.
        all.sort_by_key(key);
        self.blocks.push(all);
    }
}

/// An `Option<Frames>` in 4 bytes: `u32::MAX` is none, the high bit marks a pickle value (the
/// arena's ids stay below `2^31 - 1`), anything else is a local stack (below `2^29`).
#[derive(Clone, Copy)]
struct PackedFrames(u32);

impl PackedFrames {
    const NONE: PackedFrames = PackedFrames(u32::MAX);

    fn new(frames: Option<Frames>) -> Self {
        match frames {
            None => Self::NONE,
            Some(Frames::Local(sid)) => PackedFrames(sid),
            Some(Frames::Value(id)) => PackedFrames(id | (1 << 31)),
        }
    }

    fn get(self) -> Option<Frames> {
        match self.0 {
            u32::MAX => None,
            v if v & (1 << 31) != 0 => Some(Frames::Value(v & !(1 << 31))),
            v => Some(Frames::Local(v)),
        }
    }
}

/// The snapshot's stream ids as local indices, so that an entry holds 2 bytes for its stream;
/// they enter the trace in the order the walk meets them, as before.
#[derive(Default)]
struct LocalStreams {
    raw: Vec<i64>,
    ids: HashMap<i64, u16>,
}

impl LocalStreams {
    fn id(&mut self, raw: i64) -> Option<u16> {
        if let Some(&i) = self.ids.get(&raw) {
            return Some(i);
        }
        let i = u16::try_from(self.raw.len()).ok()?;
        self.raw.push(raw);
        self.ids.insert(raw, i);
        Some(i)
    }

    fn raw(&self, id: u16) -> i64 {
        self.raw[id as usize]
    }
}

/// [`Entry::index`] of an entry the walk has not placed.
const UNPLACED: u32 = u32::MAX;

/// An entry's stack: still a pickle value, or already a [`LocalFrames`] stack.
#[derive(Clone, Copy)]
enum Frames {
    Value(ValueId),
    Local(u32),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    /// Older snapshots: a free that is both requested and completed.
    Free,
    SegmentAlloc,
    SegmentFree,
    SegmentMap,
    SegmentUnmap,
    Snapshot,
    Oom,
    /// Metadata attached to the live allocation at `addr` (torch 2.14+).
    Annotate,
}

fn parse_action(s: &str) -> Option<Action> {
    Some(match s {
        "alloc" => Action::Alloc,
        "free_requested" => Action::FreeRequested,
        "free_completed" => Action::FreeCompleted,
        "free" => Action::Free,
        "segment_alloc" => Action::SegmentAlloc,
        "segment_free" => Action::SegmentFree,
        "segment_map" => Action::SegmentMap,
        "segment_unmap" => Action::SegmentUnmap,
        "snapshot" => Action::Snapshot,
        "oom" => Action::Oom,
        "annotate" => Action::Annotate,
        _ => return None,
    })
}

/// Stream ids as the trace's stream indices, looked up in a map (the model's own lookup is a
/// linear search, quadratic over a file with a stream per entry).
#[derive(Default)]
struct Streams {
    ids: HashMap<i64, u16>,
}

impl Streams {
    fn index(&mut self, trace: &mut Trace, stream: i64) -> Result<u16, ImportError> {
        if let Some(&i) = self.ids.get(&stream) {
            return Ok(i);
        }
        if trace.streams.len() > u16::MAX as usize {
            return Err(ImportError::Snapshot {
                path: "device_traces".into(),
                reason: format!("more than {} distinct streams", u16::MAX as usize + 1),
            });
        }
        // Distinct ids have distinct names and only this map adds streams, so the stream is
        // new: no search needed.
        let name = trace.strings.intern(&stream_name(stream));
        trace.streams.push(name);
        let i = (trace.streams.len() - 1) as u16;
        self.ids.insert(stream, i);
        Ok(i)
    }
}

fn stream_name(stream: i64) -> String {
    if stream == 0 {
        "default".to_owned()
    } else {
        format!("0x{stream:x}")
    }
}

fn pool_for_segment(size: u64) -> Pool {
    if size == SMALL_SEGMENT_BYTES {
        Pool::Small
    } else {
        Pool::Large
    }
}

/// A frame as the snapshot wrote it, before it enters the trace's tables.
#[derive(Clone, PartialEq, Eq, Hash)]
struct LocalFrame {
    name: Box<str>,
    filename: Box<str>,
    line: u32,
}

/// Frames and stacks interned while the pickle streams, so that an entry keeps a stack id and
/// not its frame list. They enter the trace's tables later, in time order (see
/// [`StackInterner`]), so that the trace's ids are what a walk of the whole pickle gives.
#[derive(Default)]
struct LocalFrames {
    frames: Vec<LocalFrame>,
    frame_index: HashMap<LocalFrame, u32>,
    stacks: Vec<Box<[u32]>>,
    stack_index: HashMap<Box<[u32]>, u32>,
    /// Frame dicts already converted, by slot; only slots that are never reused (memoized or
    /// shared ones) are cached.
    frame_cache: HashMap<ValueId, u32>,
}

impl LocalFrames {
    /// The frame dict `f`, or `None` if it lacks a string `name` or `filename`.
    fn frame(&mut self, a: &pickle::Arena, f: ValueId) -> Option<u32> {
        if pickle::is_opaque(f) {
            return (f & TAGS == FRAME_TAG).then_some(f & !(pickle::OPAQUE | TAGS));
        }
        if let Some(&id) = self.frame_cache.get(&f) {
            return Some(id);
        }
        let [name, filename, line] = a.dict_pick(f, ["name", "filename", "line"]);
        let (Value::Str(name), Value::Str(filename)) = (a.get(name?), a.get(filename?)) else {
            return None;
        };
        let line = match line.map(|l| a.get(l)) {
            Some(Value::Int(i)) => (*i).clamp(0, u32::MAX as i64) as u32,
            _ => 0,
        };
        let frame = LocalFrame { name: name.as_str().into(), filename: filename.as_str().into(), line };
        let id = match self.frame_index.get(&frame) {
            Some(&id) => id,
            None => {
                let id = self.frames.len() as u32;
                self.frames.push(frame.clone());
                self.frame_index.insert(frame, id);
                id
            }
        };
        if a.is_named(f) {
            self.frame_cache.insert(f, id);
        }
        Some(id)
    }

    fn stack(&mut self, ids: &[u32]) -> u32 {
        if let Some(&id) = self.stack_index.get(ids) {
            return id;
        }
        let id = self.stacks.len() as u32;
        self.stacks.push(ids.into());
        self.stack_index.insert(ids.into(), id);
        id
    }
}

/// Opaque ids of [`LocalFrames`] stacks carry this bit besides [`pickle::OPAQUE`]; entries do not.
const STACK_TAG: ValueId = 1 << 30;
/// Opaque ids of [`LocalFrames`] frames carry this bit besides [`pickle::OPAQUE`].
const FRAME_TAG: ValueId = 1 << 29;
/// The tag bits of an opaque id; what remains is the index.
const TAGS: ValueId = STACK_TAG | FRAME_TAG;

/// The pickle hook of the snapshot importer: every trace entry appended to a list becomes a
/// compact [`Entry`] and its values are given back to the arena, so that a snapshot's memory
/// while it streams is its entries' compact records, its distinct frames and stacks, and the
/// final segment state. Entries that a walk of the pickle would refuse are left as values, and
/// the walk reports them with their path.
#[derive(Default)]
struct Compactor {
    entries: EntryBlocks,
    local: LocalFrames,
    streams: LocalStreams,
    /// Entries held in several places, by slot, while a holder remains.
    shared_entries: HashMap<ValueId, u32>,
    keys: EntryKeys,
    /// Leaves every entry to [`Compactor::compact`] (the tests compare both ways).
    no_read_ahead: bool,
    /// [`Compactor::frames`]'s frame ids, kept to save an allocation per entry.
    frame_ids: Vec<u32>,
    /// The entries' pools and metadata.
    extras: Extras,
}

/// The frame list an entry named, as [`Compactor::entry`] read it into a stack.
struct FrameList {
    /// Its arena slot; `None` for a fresh list read ahead.
    slot: Option<ValueId>,
    stack: u32,
}

/// The [`ENTRY_KEYS`] position of each key string met in a read-ahead entry, by slot: a
/// snapshot's entries name their keys through the memo, so comparing strings once per slot
/// is enough.
#[derive(Default)]
struct EntryKeys {
    /// By slot: 0 unknown, [`EntryKeys::NOT_A_FIELD`], or the position plus one. Key strings
    /// are memoized early, so their slots are small; larger ones are compared each time.
    slots: Vec<u8>,
}

impl EntryKeys {
    const NOT_A_FIELD: u8 = u8::MAX;
    const MAX_SLOT: usize = 1 << 16;

    /// Position in [`ENTRY_KEYS`] of the key `k`, if it is one of them.
    #[inline]
    fn field(&mut self, a: &pickle::Arena, k: ValueId) -> Option<usize> {
        match self.slots.get(k as usize) {
            Some(0) | None => {}
            Some(&Self::NOT_A_FIELD) => return None,
            Some(&i) => return Some(i as usize - 1),
        }
        let Value::Str(s) = a.get(k) else { return None };
        let i = ENTRY_KEYS.iter().position(|key| key == s);
        // A named string stays in its slot to the end; others may be given back and reused.
        if a.is_named(k) && (k as usize) < Self::MAX_SLOT {
            if self.slots.len() <= k as usize {
                self.slots.resize(k as usize + 1, 0);
            }
            self.slots[k as usize] = i.map_or(Self::NOT_A_FIELD, |i| i as u8 + 1);
        }
        i
    }
}

impl Compactor {
    /// The index in [`Compactor::entries`] of an opaque entry id.
    fn entry_index(id: ValueId) -> Option<usize> {
        (pickle::is_opaque(id) && id & TAGS == 0).then_some((id & !pickle::OPAQUE) as usize)
    }

    fn local_stack(id: ValueId) -> Option<u32> {
        (pickle::is_opaque(id) && id & TAGS == STACK_TAG).then_some(id & !(pickle::OPAQUE | TAGS))
    }

    /// The stack of a frame list: `None` if it is not one the walk would accept.
    fn frames(&mut self, a: &pickle::Arena, frames: &[ValueId]) -> Option<u32> {
        let mut ids = std::mem::take(&mut self.frame_ids);
        ids.clear();
        for &f in frames {
            match self.local.frame(a, f) {
                Some(id) => ids.push(id),
                None => {
                    self.frame_ids = ids;
                    return None;
                }
            }
        }
        let sid = self.local.stack(&ids);
        self.frame_ids = ids;
        Some(sid)
    }

    fn compact(&mut self, a: &mut pickle::Arena, item: ValueId) -> Option<ValueId> {
        // An entry held in several places (fetched from the memo) is read once.
        if let Some(&k) = self.shared_entries.get(&item) {
            if self.entries.len() >= FRAME_TAG as usize {
                return None;
            }
            let copy = Entry { index: UNPLACED, ..self.entries.get(k as usize).clone() };
            return Some(self.push(a, item, copy));
        }
        let Value::Dict(d) = a.get(item) else { return None };
        let items = d.len();
        let fields = a.dict_pick(item, ENTRY_KEYS).map(|v| v.map(FlatValue::Id));
        let (entry, frames) = self.entry(a, fields, items)?;
        if let Some(FrameList { slot: Some(list), stack }) = frames {
            self.forget_frame_list(a, list, stack);
        }
        Some(self.push(a, item, entry))
    }

    /// The record of an entry whose dict has `items` items and these [`ENTRY_KEYS`] fields,
    /// with the frame list it read; `None` if the walk would refuse the entry (it is then left as a
    /// value, for the walk to report).
    fn entry(
        &mut self,
        a: &pickle::Arena,
        [action_v, addr_v, size_v, stream_v, time_v, frames_v, pool_v, user_v, internal_v]: [Option<FlatValue>; 9],
        items: usize,
    ) -> Option<(Entry, Option<FrameList>)> {
        let action = match action_v? {
            FlatValue::Str(s) => parse_action(s)?,
            FlatValue::Id(id) => match a.get(id) {
                Value::Str(s) => parse_action(s)?,
                _ => return None,
            },
            _ => return None,
        };
        let size = size_v.map_or(entry_size(action, None), |v| v.with_value(a, |v| entry_size(action, Some(v)))).ok()?;
        let int = |x: Option<FlatValue>| x.and_then(|x| x.int(a));
        let (addr, time_us) = (int(addr_v).unwrap_or(0) as u64, int(time_v).unwrap_or(0));
        let stream = self.streams.id(int(stream_v).unwrap_or(0))?;
        let items = u16::try_from(items).ok()?;
        let mut frames_list = None;
        let frames = match frames_v {
            None => None,
            Some(FlatValue::Id(f)) if pickle::is_opaque(f) => Some(Self::local_stack(f)?),
            Some(FlatValue::Id(f)) => match a.get(f) {
                Value::List(l) if l.is_empty() => None,
                Value::List(l) | Value::Tuple(l) => {
                    let sid = self.frames(a, l)?;
                    frames_list = Some(FrameList { slot: Some(f), stack: sid });
                    Some(sid)
                }
                _ => return None,
            },
            Some(FlatValue::List([])) => None,
            Some(FlatValue::List(l)) => {
                let sid = self.frames(a, l)?;
                frames_list = Some(FrameList { slot: None, stack: sid });
                Some(sid)
            }
            Some(_) => return None,
        };
        if self.entries.len() >= FRAME_TAG as usize
            || self.local.stacks.len() >= FRAME_TAG as usize
            || self.local.frames.len() >= FRAME_TAG as usize
        {
            return None;
        }
        let extra = self.extras.read(a, pool_v, user_v, internal_v);
        let entry = Entry {
            device: 0,
            index: UNPLACED,
            action,
            addr,
            size,
            stream,
            time_us,
            frames: PackedFrames::new(frames.map(Frames::Local)),
            items,
            extra,
        };
        Some((entry, frames_list))
    }

    /// Points the memo key of the frame list `list` (of stack `sid`) and those of its frames
    /// at the opaque stack and frames: later references (Python memoizes every dict and list)
    /// get those, and the values go with their last holder.
    fn forget_frame_list(&mut self, a: &mut pickle::Arena, list: ValueId, sid: u32) {
        if let Value::List(items) | Value::Tuple(items) = a.get(list) {
            let items = items.clone();
            self.forget_frames(a, &items, sid);
        }
        a.forget_memo(list, pickle::OPAQUE | STACK_TAG | sid);
    }

    /// Points the memo keys of the frame dicts `frames` (those of stack `sid`) at the opaque
    /// frames, so that later references get those; the dicts go with their last holder.
    fn forget_frames(&mut self, a: &mut pickle::Arena, frames: &[ValueId], sid: u32) {
        for (&frame, &lid) in frames.iter().zip(self.local.stacks[sid as usize].iter()) {
            if !pickle::is_opaque(frame) && a.forget_memo(frame, pickle::OPAQUE | FRAME_TAG | lid) {
                self.local.frame_cache.remove(&frame);
            }
        }
    }

    /// Keeps `entry`, the record of `item`, and gives `item` up.
    fn push(&mut self, a: &mut pickle::Arena, item: ValueId, entry: Entry) -> ValueId {
        let k = self.entries.len() as u32;
        let opaque = pickle::OPAQUE | k;
        self.entries.push(entry);
        if a.refs(item) > 1 && !self.shared_entries.contains_key(&item) {
            // Held elsewhere too: kept in its slot for good, so that the slot stays its key.
            a.pin(item);
            self.shared_entries.insert(item, k);
        }
        a.forget_memo(item, opaque);
        a.drop_ref(item);
        opaque
    }
}

impl pickle::Hook for Compactor {
    const TAKES_FLAT_DICTS: bool = true;

    /// A trace entry read ahead: kept as its record, as [`Compactor::compact`] would once it
    /// was built and appended.
    fn flat_dict(&mut self, a: &mut pickle::Arena, d: &FlatDict) -> Option<FlatTaken> {
        if self.no_read_ahead {
            return None;
        }
        let fields = d.pick(|k| self.keys.field(a, k));
        let (entry, frames) = self.entry(a, fields, d.len())?;
        let mut list = None;
        match (frames, fields[5]) {
            (Some(FrameList { slot: Some(slot), stack }), _) => self.forget_frame_list(a, slot, stack),
            (Some(FrameList { slot: None, stack }), Some(FlatValue::List(items))) => {
                self.forget_frames(a, items, stack);
                list = Some(pickle::OPAQUE | STACK_TAG | stack);
            }
            _ => {}
        }
        let k = self.entries.len() as u32;
        self.entries.push(entry);
        Some(FlatTaken { dict: pickle::OPAQUE | k, list })
    }

    fn append(&mut self, a: &mut pickle::Arena, _list: ValueId, item: ValueId) -> Result<ValueId, ImportError> {
        if pickle::is_opaque(item) {
            return Ok(item);
        }
        Ok(self.compact(a, item).unwrap_or(item))
    }
}

/// A stack in the trace's tables, with the phase and layer it names.
#[derive(Clone, Copy)]
struct InternedStack {
    stack: u32,
    phase: Phase,
    layer: StrId,
}

/// Interns the entries' stacks into the trace's tables, in the order the entries are walked.
#[derive(Default)]
struct StackInterner {
    frames: HashMap<u32, u32>,
    stacks: HashMap<u32, InternedStack>,
    /// Frame lists that were left as values, by slot.
    values: HashMap<ValueId, u32>,
}

impl StackInterner {
    fn stack(
        &mut self,
        v: &View,
        local: &mut LocalFrames,
        trace: &mut Trace,
        frames: Frames,
        path: &dyn Fn() -> String,
    ) -> Result<InternedStack, ImportError> {
        let sid = match frames {
            Frames::Local(sid) => sid,
            Frames::Value(list) => match self.values.get(&list) {
                Some(&sid) => sid,
                None => {
                    let items = v.list(list, &path)?;
                    let mut ids = Vec::with_capacity(items.len());
                    for (i, &f) in items.iter().enumerate() {
                        let id = match local.frame(&v.p.arena, f) {
                            Some(id) => id,
                            None => {
                                // Not a frame: say what is wrong, as the walk of a frame does.
                                let fpath = || format!("{}[{i}]", path());
                                v.str(f, "name", &fpath)?;
                                v.str(f, "filename", &fpath)?;
                                return Err(v.err(&fpath, "expected a frame"));
                            }
                        };
                        ids.push(id);
                    }
                    let sid = local.stack(&ids);
                    self.values.insert(list, sid);
                    sid
                }
            },
        };
        if let Some(&s) = self.stacks.get(&sid) {
            return Ok(s);
        }
        let mut ids = Vec::with_capacity(local.stacks[sid as usize].len());
        for &lf in local.stacks[sid as usize].iter() {
            let id = match self.frames.get(&lf) {
                Some(&id) => id,
                None => {
                    let f = &local.frames[lf as usize];
                    let frame = Frame { name: trace.strings.intern(&f.name), filename: trace.strings.intern(&f.filename), line: f.line };
                    let id = trace.stacks.intern_frame(frame);
                    self.frames.insert(lf, id);
                    id
                }
            };
            ids.push(id);
        }
        let (phase, layer) = classify_stack(trace, &ids);
        let interned = InternedStack { stack: trace.stacks.intern_stack(ids), phase, layer };
        self.stacks.insert(sid, interned);
        Ok(interned)
    }
}

/// Phase and a layer name from an allocation's stack: the autograd engine means backward,
/// `torch/optim` means optimizer, `torch/nn/modules` means forward; the layer is the innermost
/// Python frame of user code (`name (file.py:line)`), which is what a user can act on.
fn classify_stack(trace: &mut Trace, frame_ids: &[u32]) -> (Phase, StrId) {
    let mut phase = Phase::Other;
    let mut user: Option<(StrId, StrId, u32)> = None;
    for &fid in frame_ids {
        let f = trace.stacks.frames[fid as usize];
        let name = trace.str(f.name);
        let file = trace.str(f.filename);
        if phase == Phase::Other {
            if name.contains("torch::autograd::Engine") || name.contains("evaluate_function") {
                phase = Phase::Backward;
            } else if file.contains("/torch/optim/") {
                phase = Phase::Optimizer;
            } else if file.contains("/torch/nn/modules/") {
                phase = Phase::Forward;
            }
        }
        if user.is_none() && file.ends_with(".py") && !file.contains("/site-packages/") && !file.contains("/torch/") {
            user = Some((f.name, f.filename, f.line));
        }
    }
    let layer = match user {
        Some((n, file, line)) => {
            let base = trace.str(file).rsplit('/').next().unwrap_or("").to_owned();
            let label = format!("{} ({base}:{line})", trace.str(n));
            trace.strings.intern(&label)
        }
        None => StrId::NONE,
    };
    (phase, layer)
}

/// Imports a snapshot pickle.
pub fn import(data: &[u8]) -> Result<Trace, ImportError> {
    import_stream(data, Some(data.len() as u64))
}

/// Imports a snapshot pickle read from `src`, which is never held whole.
pub fn import_reader(src: impl std::io::Read) -> Result<Trace, ImportError> {
    import_stream(src, None)
}

/// Imports a snapshot pickle read from `src`: the pickle is parsed (its entries compacted as
/// they stream), then walked and replayed in stages.
fn import_stream(src: impl std::io::Read, size_hint: Option<u64>) -> Result<Trace, ImportError> {
    import_with(src, size_hint, Compactor::default())
}

fn import_with(src: impl std::io::Read, size_hint: Option<u64>, mut compactor: Compactor) -> Result<Trace, ImportError> {
    let p = pickle::parse_stream(src, size_hint, &mut compactor)?;
    let v = View { p: &p };
    let root = RootIds::find(&p)?;
    let settings = p.dict_get(p.root, "allocator_settings");
    let config = config_from_settings(&v, settings);
    let mut meta = TraceMeta::new(SourceFormat::PytorchSnapshot);
    let mut settings_budget = SETTINGS_NODE_BUDGET;
    meta.allocator_settings = settings.map(|s| to_json(&p, s, 0, &mut settings_budget));
    let mut trace = Trace::new(meta);

    let input_bytes = usize::try_from(p.input_bytes).unwrap_or(usize::MAX);
    let mut budget = WalkBudget { left: input_bytes, input_bytes };
    let mut finals = final_segments(&v, root.segments, false, &mut compactor.extras, &mut budget)?;
    if let Some(host) = p.dict_get(p.root, "host_segments") {
        finals.extend(final_segments(&v, host, true, &mut compactor.extras, &mut budget)?);
    }
    let traces = Traces { device: root.device_traces, host: p.dict_get(p.root, "host_traces") };
    if traces.host.is_some() && p.dict_get(p.root, "host_segments").is_none() {
        trace.meta.warnings.push(
            "the snapshot has `host_traces` but no `host_segments`: pinned host memory alive before recording began is unknown and taken as none"
                .to_owned(),
        );
    }
    let mut entries = walk_device_traces(&v, &traces, &mut compactor, &mut budget, &mut trace)?;
    let host = add_devices(&mut trace, &mut finals, &mut entries);
    let pre = PreExisting::scan(&entries, &compactor.streams);
    // Devices the snapshot names segments of: only there is reserved memory known.
    let with_segments: HashSet<usize> = finals.iter().map(|f| f.device).chain(pre.seg_ranges.keys().copied()).collect();
    let mut streams = Streams::default();
    let start = StartState::build(&finals, &pre, &config, &mut streams, &mut trace)?;
    let states = allocator_states(&mut trace, start.initial, &start.loose_allocated, &config, host, entries.len() > 0);

    // External annotations (e.g. `Optimizer.step#SGD.step`) become scopes, within the trace
    // entries' time (the entries are sorted by time by now).
    if let Some(ann) = p.dict_get(p.root, "external_annotations") {
        let ns = |e: &Entry| (e.time_us.max(0) as u64).saturating_mul(1000);
        let span = entries.ends().map(|(first, last)| (ns(first), ns(last)));
        import_annotations(&v, &mut trace, ann, span, &mut budget)?;
    }
    let mut replay = Replay::new(&trace, &finals, states, start.loose_allocated, start.loose_pending, streams);
    replay.run(&v, entries, &mut compactor, &mut trace)?;
    replay.finish(&mut compactor.extras, &mut trace);
    if replay.estimated > 0 {
        trace
            .meta
            .warnings
            .push(format!("{} frees of blocks not seen allocated were sized by rounding the requested size", replay.estimated));
    }
    trace.meta.start_unix_ns = trace.events.ts_ns.first().copied();
    trace.finish();
    check_allocated_within_reserved(&mut trace, &with_segments, host)?;
    Ok(trace)
}

/// On a CUDA device every allocated block lies in a reserved segment: a replay where
/// allocated exceeds reserved misread the entries (frees it did not see, sizes it got wrong),
/// or the snapshot's segments cannot hold its allocations (some tools write such files). Its
/// allocated timeline is still what the entries say, so the device is opened with it and its
/// reserved memory marked unknown (`TraceMeta::reserved_unknown`), with a warning that says
/// where the two first disagree. A device the snapshot names no segment of (trace entries
/// alone, as some tools write them) has no reserved memory to compare with: it is marked
/// unknown too. Pinned host memory keeps its replayed totals, with a warning.
fn check_allocated_within_reserved(trace: &mut Trace, with_segments: &HashSet<usize>, host: Option<usize>) -> Result<(), ImportError> {
    let ev = &trace.events;
    // The first contradiction of each device with segments.
    let mut contradiction: Vec<Option<String>> = vec![None; MAX_DEVICES];
    for (d, t) in ev.base_totals.iter().enumerate() {
        if with_segments.contains(&d) && t.allocated_bytes > t.reserved_bytes {
            contradiction[d] =
                Some(format!("{} bytes allocated inside {} bytes reserved before the first entry", t.allocated_bytes, t.reserved_bytes));
        }
    }
    // Devices with events, for the devices without segments.
    let mut has_events = [false; MAX_DEVICES];
    let first = ev.ts_ns.first().copied().unwrap_or(0);
    let mut cursor = ev.cursor();
    for i in 0..ev.len() {
        let d = ev.device[i] as usize;
        has_events[d] = true;
        let t = cursor.advance();
        if t.allocated_bytes > t.reserved_bytes && with_segments.contains(&d) && contradiction[d].is_none() {
            contradiction[d] = Some(format!(
                "{} bytes allocated inside {} bytes reserved at {:.3} ms (a {} of {} bytes at 0x{:x})",
                t.allocated_bytes,
                t.reserved_bytes,
                ev.ts_ns[i].saturating_sub(first) as f64 / 1e6,
                ev.event_type(i).as_str(),
                ev.size_bytes[i],
                ev.address[i]
            ));
        }
    }
    for (d, what) in contradiction.into_iter().enumerate() {
        let Some(what) = what else { continue };
        let name = trace.devices[d].to_string();
        if Some(d) == host {
            trace.meta.warnings.push(format!(
                "pinned host memory's entries contradict its segments ({what}): its totals are shown as replayed, the GPUs' are not affected"
            ));
            continue;
        }
        trace.events.forget_reserved(d);
        trace.meta.reserved_unknown.push(d as u8);
        trace.meta.warnings.push(format!(
            "the snapshot's segments cannot hold its allocations on {name} ({what}; allocated memory lies inside reserved segments, \
             so segments or their entries are missing): allocated memory is shown as the entries give it, reserved memory is unknown"
        ));
    }
    for d in (0..MAX_DEVICES).filter(|d| has_events[*d] && !with_segments.contains(d)) {
        trace.meta.reserved_unknown.push(d as u8);
        trace.meta.warnings.push(format!(
            "the snapshot names no segment of {} (neither in `segments` nor in its trace entries): its reserved memory is unknown and shown as 0",
            trace.devices[d]
        ));
    }
    trace.meta.reserved_unknown.sort_unstable();
    Ok(())
}

/// The two keys a snapshot's root dict must have.
struct RootIds {
    segments: ValueId,
    device_traces: ValueId,
}

impl RootIds {
    /// Takes the parsed pickle; gives its `segments` and `device_traces`, or what was found
    /// instead of a snapshot.
    fn find(p: &Pickle) -> Result<Self, ImportError> {
        let root = p.root;
        let Value::Dict(items) = p.get(root) else {
            return Err(ImportError::NotASnapshot { found: format!("a pickled {}", p.get(root).type_name()) });
        };
        let (Some(segments), Some(device_traces)) = (p.dict_get(root, "segments"), p.dict_get(root, "device_traces")) else {
            let keys: Vec<String> = items
                .iter()
                .take(8)
                .map(|(k, _)| match p.get(*k) {
                    Value::Str(s) => format!("'{s}'"),
                    other => other.type_name().to_owned(),
                })
                .collect();
            return Err(ImportError::NotASnapshot { found: format!("a dict with keys [{}]", keys.join(", ")) });
        };
        Ok(Self { segments, device_traces })
    }
}

/// A segment of the final state (`segments`).
struct FinalSeg {
    address: u64,
    size: u64,
    device: usize,
    stream: i64,
    pool: Pool,
    /// Its private pool (index into [`Extras::pools`]), from `segment_pool_id`.
    private_pool: Option<u16>,
    blocks: Vec<FinalBlock>,
}

/// A block of a final segment.
struct FinalBlock {
    address: u64,
    size_bytes: u64,
    /// Taken (its state is `active_*`).
    active: bool,
    /// Freed, waiting for other streams (`active_pending_free`): not counted as allocated.
    pending: bool,
}

/// Takes the `segments` list (or `host_segments`, when `host`); gives the final state it
/// describes.
fn final_segments(
    v: &View,
    segments_id: ValueId,
    host: bool,
    extras: &mut Extras,
    budget: &mut WalkBudget,
) -> Result<Vec<FinalSeg>, ImportError> {
    let mut finals = Vec::new();
    let name = if host { "host_segments" } else { "segments" };
    for (i, &s) in v.list(segments_id, name)?.iter().enumerate() {
        let path = format!("{name}[{i}]");
        budget.charge(v, s, &path)?;
        let address = v.size(s, "address", &path)?;
        let size = v.size(s, "total_size", &path)?;
        let device = if host { HOST_DEVICE as u64 } else { v.size(s, "device", &path)? };
        if !host && device >= HOST_DEVICE as u64 {
            return Err(v.err(&format!("{path}.device"), format!("device index {device} is out of range (at most {})", HOST_DEVICE - 1)));
        }
        let device = device as usize;
        let stream = v.opt_int(s, "stream").unwrap_or(0);
        let pool = match v.opt_str(s, "segment_type") {
            Some("small") => Pool::Small,
            Some("large") => Pool::Large,
            _ => pool_for_segment(size),
        };
        let private_pool = v.p.dict_get(s, "segment_pool_id").and_then(|id| extras.segment_pool(&v.p.arena, id));
        let mut blocks = Vec::new();
        let blocks_id = v.field(s, "blocks", &path)?;
        for (j, &b) in v.list(blocks_id, &format!("{path}.blocks"))?.iter().enumerate() {
            let bpath = format!("{path}.blocks[{j}]");
            budget.charge(v, b, &bpath)?;
            let state = v.str(b, "state", &bpath)?;
            let address = v.opt_int(b, "address").map(|a| a as u64);
            let size_bytes = v.size(b, "size", &bpath)?;
            // Older snapshots omit block addresses; blocks are contiguous from the segment start.
            let address = address.unwrap_or_else(|| address_from_previous(&blocks, s, v));
            blocks.push(FinalBlock { address, size_bytes, active: state.starts_with("active"), pending: state == "active_pending_free" });
        }
        finals.push(FinalSeg { address, size, device, stream, pool, private_pool, blocks });
    }
    Ok(finals)
}

fn address_from_previous(blocks: &[FinalBlock], seg: ValueId, v: &View) -> u64 {
    match blocks.last() {
        Some(b) => b.address.saturating_add(b.size_bytes),
        None => v.opt_int(seg, "address").unwrap_or(0) as u64,
    }
}

/// Takes `device_traces` and the compacted entries; gives the trace entries of every device,
/// merged by time. Compacted entries are placed where the walk finds them: the first time in
/// place, again as a copy; any the walk never finds are dropped. Unknown actions are counted
/// in the trace's warnings.
fn walk_device_traces(
    v: &View,
    traces: &Traces,
    compactor: &mut Compactor,
    budget: &mut WalkBudget,
    trace: &mut Trace,
) -> Result<EntryBlocks, ImportError> {
    let mut walk = Walk { entries: std::mem::take(&mut compactor.entries), more: Vec::new(), skipped: HashMap::default() };
    let device_traces = v.list(traces.device, "device_traces")?;
    if device_traces.len() >= HOST_DEVICE as usize {
        return Err(v.err("device_traces", format!("{} devices; expected at most {}", device_traces.len(), HOST_DEVICE)));
    }
    for (dev, &t) in device_traces.iter().enumerate() {
        let list = v.list(t, &format!("device_traces[{dev}]"))?;
        walk.device(v, list, dev as u8, &|i| format!("device_traces[{dev}][{i}]"), compactor, budget)?;
    }
    if let Some(host) = traces.host {
        walk.device(v, v.list(host, "host_traces")?, HOST_DEVICE, &|i| format!("host_traces[{i}]"), compactor, budget)?;
    }
    let Walk { mut entries, more, skipped } = walk;
    let mut skipped: Vec<(String, usize)> = skipped.into_iter().collect();
    skipped.sort();
    for (action, n) in &skipped {
        trace.meta.warnings.push(format!("skipped {n} trace entries with unknown action '{action}'"));
    }
    entries.append(more);
    entries.retain(|e| e.index != UNPLACED);
    // Each device's order for equal times, as a stable sort of the walk's order would keep it.
    entries.sort_by_key(|e: &Entry| (e.time_us, e.device, e.index));
    Ok(entries)
}

/// The lists of trace entries: one per CUDA device, and pinned host memory's (torch 2.14+,
/// recorded with `record_pinned_host_memory=True`).
struct Traces {
    device: ValueId,
    host: Option<ValueId>,
}

/// The entries as the walk places them.
struct Walk {
    /// The compacted entries, placed where the walk finds them.
    entries: EntryBlocks,
    /// Entries placed a second time and those read from values, after the compacted ones.
    more: Vec<Entry>,
    /// Entries of unknown actions, by action.
    skipped: HashMap<String, usize>,
}

impl Walk {
    /// Places the entries of one device's list. Compacted entries are placed where the walk
    /// finds them: the first time in place, again as a copy; any the walk never finds are
    /// dropped. Unknown actions are counted.
    fn device(
        &mut self,
        v: &View,
        list: &[ValueId],
        dev: u8,
        path_of: &dyn Fn(usize) -> String,
        compactor: &mut Compactor,
        budget: &mut WalkBudget,
    ) -> Result<(), ImportError> {
        let compacted = self.entries.len();
        for (i, &e) in list.iter().enumerate() {
            let path = || path_of(i);
            let index =
                u32::try_from(i).ok().filter(|&i| i != UNPLACED).ok_or_else(|| v.err(&path, "more entries than a trace can hold"))?;
            if let Some(k) = Compactor::entry_index(e).filter(|&k| k < compacted) {
                let entry = self.entries.get_mut(k);
                budget.charge_items(entry.items as usize, &path)?;
                if entry.index == UNPLACED {
                    entry.device = dev;
                    entry.index = index;
                } else {
                    self.more.push(Entry { device: dev, index, ..entry.clone() });
                }
                continue;
            }
            budget.charge(v, e, &path)?;
            let place = EntryPlace { device: dev, index };
            match read_entry(v, e, place, &mut compactor.streams, &mut compactor.extras, &path)? {
                ReadEntry::Known(entry) => self.more.push(entry),
                ReadEntry::UnknownAction(action) => *self.skipped.entry(action.to_owned()).or_default() += 1,
            }
        }
        Ok(())
    }
}

/// Where the walk found an entry.
#[derive(Clone, Copy)]
struct EntryPlace {
    device: u8,
    /// Position in its device's trace.
    index: u32,
}

/// A trace entry left as a pickle value, read.
enum ReadEntry<'a> {
    Known(Entry),
    /// Its action, which this importer does not know: the entry is skipped.
    UnknownAction(&'a str),
}

/// Takes a trace entry that the compactor left as a value; gives its record, or the error a
/// walk reports for it.
fn read_entry<'a>(
    v: &View<'a>,
    e: ValueId,
    place: EntryPlace,
    streams: &mut LocalStreams,
    extras: &mut Extras,
    path: &impl Fn() -> String,
) -> Result<ReadEntry<'a>, ImportError> {
    let p = v.p;
    if !matches!(p.get(e), Value::Dict(_)) {
        return Err(v.err(path, format!("expected a dict, found {}", p.get(e).type_name())));
    }
    // One pass over the entry's keys (a snapshot has hundreds of thousands of entries).
    let [action_v, addr_v, size_v, stream_v, time_v, frames, pool_v, user_v, internal_v] = p.dict_pick(e, ENTRY_KEYS);
    let key_err = |key: &str, reason: String| v.err(&|| format!("{}.{key}", path()), reason);
    let action_s = match action_v.map(|x| p.get(x)) {
        Some(Value::Str(s)) => s.as_str(),
        Some(other) => return Err(key_err("action", format!("expected a string, found {}", other.type_name()))),
        None => return Err(v.err(path, "expected key 'action', which is missing")),
    };
    let Some(action) = parse_action(action_s) else {
        return Ok(ReadEntry::UnknownAction(action_s));
    };
    let int = |x: Option<ValueId>| match x.map(|x| p.get(x)) {
        Some(Value::Int(i)) => Some(*i),
        // An address or stream id of 2⁶³ or more: its bits.
        Some(v @ Value::BigInt(_)) => v.as_u64().map(|u| u as i64),
        _ => None,
    };
    let size = match entry_size(action, size_v.map(|x| p.get(x))) {
        Ok(size) => size,
        Err(Some(reason)) => return Err(key_err("size", reason)),
        Err(None) => return Err(v.err(path, "expected key 'size', which is missing")),
    };
    Ok(ReadEntry::Known(Entry {
        device: place.device,
        index: place.index,
        action,
        addr: int(addr_v).unwrap_or(0) as u64,
        size,
        stream: streams.id(int(stream_v).unwrap_or(0)).ok_or_else(|| ImportError::Snapshot {
            path: "device_traces".into(),
            reason: format!("more than {} distinct streams", u16::MAX as usize + 1),
        })?,
        time_us: int(time_v).unwrap_or(0),
        frames: PackedFrames::new(match frames {
            Some(f) if pickle::is_opaque(f) => Compactor::local_stack(f).map(Frames::Local),
            Some(f) if matches!(p.get(f), Value::List(l) if l.is_empty()) => None,
            f => f.map(Frames::Value),
        }),
        items: 0, // charged by the walk
        extra: extras.read(&p.arena, pool_v.map(FlatValue::Id), user_v.map(FlatValue::Id), internal_v.map(FlatValue::Id)),
    }))
}

/// Takes the final segments and the entries; adds a CUDA device to the trace for every index
/// up to the highest either names, and then pinned host memory's device if there is any, to
/// which the segments and entries of [`HOST_DEVICE`] move. Gives the host's device index.
fn add_devices(trace: &mut Trace, finals: &mut [FinalSeg], entries: &mut EntryBlocks) -> Option<usize> {
    let host = HOST_DEVICE as usize;
    let cuda = finals.iter().map(|f| f.device).chain(entries.iter().map(|e| e.device as usize)).filter(|&d| d != host);
    if let Some(max_device) = cuda.max() {
        for d in 0..=max_device {
            trace.device_index(Device { kind: "cuda".into(), index: d as i32, rank: None });
        }
    }
    if !finals.iter().any(|f| f.device == host) && !entries.iter().any(|e| e.device == HOST_DEVICE) {
        return None;
    }
    let index = trace.device_index(Device { kind: Device::PINNED_HOST.into(), index: -1, rank: None });
    for f in finals.iter_mut().filter(|f| f.device == host) {
        f.device = index as usize;
    }
    entries.for_each_mut(|e| {
        if e.device == HOST_DEVICE {
            e.device = index;
        }
    });
    Some(index as usize)
}

/// A segment the trace frees (or unmaps) before it allocates it.
struct PreSegment {
    device: usize,
    address: u64,
    size_bytes: u64,
    /// The snapshot's stream id.
    stream: i64,
}

/// A block the trace frees before it allocates it.
struct PreBlock {
    device: usize,
    address: u64,
    requested_bytes: u64,
    /// Its free was requested before recording began and completes during it (the first entry
    /// is `free_completed` in a trace that records requests): it takes its space, but
    /// `memory_allocated()` no longer counted it.
    pending: bool,
}

/// What the entries show existed before the first of them.
struct PreExisting {
    /// Every (device, address) a segment entry names.
    seg_seen: HashSet<(usize, u64)>,
    /// Every range a segment entry names, by device: sorted by start, overlaps merged.
    seg_ranges: HashMap<usize, Vec<(u64, u64)>>,
    pre_segments: Vec<PreSegment>,
    /// The first action on each block (device, address).
    block_first: HashMap<(usize, u64), Action>,
    pre_blocks: Vec<PreBlock>,
}

impl PreExisting {
    /// Takes the entries in time order; gives the segments and blocks they free before
    /// allocating.
    fn scan(entries: &EntryBlocks, local_streams: &LocalStreams) -> Self {
        let mut seg_seen: HashSet<(usize, u64)> = HashSet::default();
        let mut seg_ranges: HashMap<usize, Vec<(u64, u64)>> = HashMap::default();
        let mut pre_segments = Vec::new();
        let mut block_first: HashMap<(usize, u64), Action> = HashMap::default();
        let mut pre_blocks = Vec::new();
        for e in entries.iter() {
            let device = e.device as usize;
            if matches!(e.action, Action::SegmentAlloc | Action::SegmentMap | Action::SegmentFree | Action::SegmentUnmap) {
                seg_ranges.entry(device).or_default().push((e.addr, e.addr.saturating_add(e.size)));
            }
            match e.action {
                Action::SegmentAlloc | Action::SegmentMap => {
                    seg_seen.insert((device, e.addr));
                }
                Action::SegmentFree | Action::SegmentUnmap if seg_seen.insert((device, e.addr)) => {
                    pre_segments.push(PreSegment { device, address: e.addr, size_bytes: e.size, stream: local_streams.raw(e.stream) });
                }
                Action::Alloc => {
                    block_first.entry((device, e.addr)).or_insert(Action::Alloc);
                }
                Action::FreeRequested | Action::FreeCompleted | Action::Free => {
                    if let std::collections::hash_map::Entry::Vacant(slot) = block_first.entry((device, e.addr)) {
                        slot.insert(e.action);
                        let pending = e.action == Action::FreeCompleted;
                        pre_blocks.push(PreBlock { device, address: e.addr, requested_bytes: e.size, pending });
                    }
                }
                _ => {}
            }
        }
        // A trace without `free_requested` entries (as some tools write them) frees with
        // `free_completed` alone: there a first `free_completed` is an allocated block's free.
        let requests: HashSet<usize> = entries.iter().filter(|e| e.action == Action::FreeRequested).map(|e| e.device as usize).collect();
        for b in &mut pre_blocks {
            b.pending &= requests.contains(&b.device);
        }
        for ranges in seg_ranges.values_mut() {
            ranges.sort_unstable();
            let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
            for &(a, b) in ranges.iter() {
                match merged.last_mut() {
                    Some(last) if a <= last.1 => last.1 = last.1.max(b),
                    _ => merged.push((a, b)),
                }
            }
            *ranges = merged;
        }
        Self { seg_seen, seg_ranges, pre_segments, block_first, pre_blocks }
    }

    /// The parts of `[start, end)` on `device` that no segment entry names: what of a final
    /// segment existed before the entries. A segment the trace allocates (or frees and
    /// allocates again) leaves nothing; an expandable segment (`expandable_segments:True`),
    /// which grows by `segment_map` entries inside its range, leaves the part mapped before
    /// recording began.
    fn unnamed_parts(&self, device: usize, start: u64, end: u64) -> Vec<(u64, u64)> {
        let ranges = self.seg_ranges.get(&device).map_or(&[][..], Vec::as_slice);
        // The first range that ends after `start` (ranges are merged: their ends ascend too).
        let first = ranges.partition_point(|&(_, b)| b <= start);
        let mut parts = Vec::new();
        let mut at = start;
        for &(a, b) in &ranges[first..] {
            if a >= end {
                break;
            }
            if a > at {
                parts.push((at, a));
            }
            at = at.max(b);
        }
        if at < end {
            parts.push((at, end));
        }
        parts
    }
}

/// The memory that existed before the first entry.
struct StartState {
    /// Sorted by (device, address).
    initial: Vec<SegmentInfo>,
    /// Bytes of blocks alive at the start that no known segment holds, by (device, address).
    loose_allocated: HashMap<(usize, u64), u64>,
    /// Bytes of blocks pending their free at the start that no known segment holds.
    loose_pending: HashMap<(usize, u64), u64>,
}

impl StartState {
    /// Takes the final segments and what existed before the entries; gives the segments and
    /// blocks alive at the start: segments the trace never allocates and blocks it frees
    /// before allocating (or never touches, if they are alive at the end).
    fn build(
        finals: &[FinalSeg],
        pre: &PreExisting,
        config: &AllocatorConfig,
        streams: &mut Streams,
        trace: &mut Trace,
    ) -> Result<Self, ImportError> {
        let mut initial: Vec<SegmentInfo> = Vec::new();
        for f in finals {
            if pre.seg_seen.contains(&(f.device, f.address)) {
                continue;
            }
            // Each part of the segment that existed before the entries, with its blocks then.
            for (start, end) in pre.unnamed_parts(f.device, f.address, f.address.saturating_add(f.size)) {
                let blocks = f
                    .blocks
                    .iter()
                    .filter(|b| b.active && b.address >= start && b.address < end && !pre.block_first.contains_key(&(f.device, b.address)))
                    .map(|b| BlockInfo {
                        address: b.address,
                        size_bytes: b.size_bytes,
                        state: if b.pending { BlockState::PendingFree } else { BlockState::Allocated },
                    })
                    .collect();
                let stream = streams.index(trace, f.stream)?;
                let (device, size_bytes, private_pool) = (f.device as u8, end - start, f.private_pool);
                initial.push(SegmentInfo { address: start, size_bytes, device, stream, pool: f.pool, blocks, private_pool });
            }
        }
        for s in &pre.pre_segments {
            let stream = streams.index(trace, s.stream)?;
            initial.push(SegmentInfo {
                address: s.address,
                size_bytes: s.size_bytes,
                device: s.device as u8,
                stream,
                pool: pool_for_segment(s.size_bytes),
                blocks: Vec::new(),
                private_pool: None,
            });
        }
        let (loose_allocated, loose_pending) = place_pre_blocks(&mut initial, &pre.pre_blocks, config);
        let estimated: HashSet<(u8, u64)> = pre.pre_blocks.iter().map(|b| (b.device as u8, b.address)).collect();
        for s in &mut initial {
            s.blocks.sort_by_key(|b| b.address);
            s.blocks.dedup_by_key(|b| b.address);
            widen_estimated_blocks(s, &estimated, config);
        }
        initial.sort_by_key(|s| (s.device, s.address));
        Ok(Self { initial, loose_allocated, loose_pending })
    }
}

/// A block whose size was estimated from its request (freed before it was allocated) holds
/// the space up to the next block when that space could not be a free block of its own: in
/// a large segment the allocator splits off only remainders above 1 MiB and frees only blocks
/// above 1 MiB, so a gap of at most 1 MiB after a block is part of it.
fn widen_estimated_blocks(seg: &mut SegmentInfo, estimated: &HashSet<(u8, u64)>, config: &AllocatorConfig) {
    if seg.pool != Pool::Large || config.expandable_segments || config.max_split_bytes.is_some() {
        return;
    }
    let end = seg.address.saturating_add(seg.size_bytes);
    for k in 0..seg.blocks.len() {
        let b = &seg.blocks[k];
        if !estimated.contains(&(seg.device, b.address)) {
            continue;
        }
        let next = seg.blocks.get(k + 1).map_or(end, |n| n.address);
        let gap = next.saturating_sub(b.address.saturating_add(b.size_bytes));
        if gap > 0 && gap <= SMALL_REQUEST_BYTES {
            seg.blocks[k].size_bytes += gap;
        }
    }
}

/// Takes the start segments and the blocks freed before being allocated, which were alive at
/// the start; adds each block to its segment and gives the sizes of those that have none
/// (allocated, and pending their free).
type Loose = HashMap<(usize, u64), u64>;
fn place_pre_blocks(initial: &mut [SegmentInfo], pre_blocks: &[PreBlock], config: &AllocatorConfig) -> (Loose, Loose) {
    // Segments sorted by (device, address) so that each block finds its segment in O(log n):
    // the one starting nearest below it (segments do not overlap; of equal starts the first
    // wins, as a linear search would).
    let mut by_start: Vec<usize> = (0..initial.len()).collect();
    by_start.sort_by_key(|&k| (initial[k].device, initial[k].address));
    by_start.dedup_by_key(|k| (initial[*k].device, initial[*k].address));
    let mut loose_allocated: Loose = HashMap::default();
    let mut loose_pending: Loose = HashMap::default();
    for b in pre_blocks {
        let size = config.round_size(b.requested_bytes);
        let key = (b.device as u8, b.address);
        let after = by_start.partition_point(|&k| (initial[k].device, initial[k].address) <= key);
        let seg = after
            .checked_sub(1)
            .map(|i| by_start[i])
            .filter(|&k| initial[k].device == key.0 && b.address < initial[k].address.saturating_add(initial[k].size_bytes));
        match seg.map(|k| &mut initial[k]) {
            Some(seg) => {
                let state = if b.pending { BlockState::PendingFree } else { BlockState::Allocated };
                seg.blocks.push(BlockInfo { address: b.address, size_bytes: size, state });
            }
            None if b.pending => {
                loose_pending.insert((b.device, b.address), size);
            }
            None => {
                loose_allocated.insert((b.device, b.address), size);
            }
        }
    }
    (loose_allocated, loose_pending)
}

/// Takes the start state; gives one allocator model per device holding it, sets the trace's
/// base totals and initial segments, and warns of memory allocated before recording (or, when
/// nothing was `recorded`, that the snapshot is only that state).
fn allocator_states(
    trace: &mut Trace,
    initial: Vec<SegmentInfo>,
    loose_allocated: &HashMap<(usize, u64), u64>,
    config: &AllocatorConfig,
    host: Option<usize>,
    recorded: bool,
) -> Vec<AllocatorState> {
    let n_dev = trace.devices.len();
    let config_of = |d| if Some(d) == host { AllocatorConfig::pinned_host() } else { config.clone() };
    let mut states: Vec<AllocatorState> = (0..n_dev).map(config_of).map(AllocatorState::new).collect();
    for s in &initial {
        states[s.device as usize].add_segment_info(s);
    }
    for (d, state) in states.iter().enumerate() {
        let loose: u64 = loose_allocated.iter().filter(|((dev, _), _)| *dev == d).map(|(_, &s)| s).sum();
        trace
            .events
            .set_base_totals(d, Totals { allocated_bytes: state.allocated_bytes() + loose, reserved_bytes: state.reserved_bytes() });
    }
    let pre_allocated: u64 = trace.events.base_totals.iter().map(|t| t.allocated_bytes).sum();
    if !recorded {
        trace.meta.warnings.push(
            "this snapshot has no trace entries (PyTorch records them only while torch.cuda.memory._record_memory_history() is on): \
             its totals and segments are the allocator's state when it was taken"
                .to_owned(),
        );
    } else if pre_allocated > 0 {
        trace
            .meta
            .warnings
            .push(format!("{pre_allocated} bytes were allocated before recording began (recovered from the final segment state)"));
    }
    trace.initial_segments = initial;
    states
}

/// An `Optimizer.step*` scope.
struct OptimizerSpan {
    start_ns: u64,
    end_ns: u64,
    name: StrId,
}

/// An entry as a trace event: its type and the bytes the allocator counts.
struct SizedEvent {
    event_type: EventType,
    size_bytes: u64,
    /// A free in one step (a `free`, or a `free_completed` without a request): its completion
    /// follows.
    completes: bool,
}

/// Who made an event: its stack, and the phase and layer it ran in.
struct Attribution {
    stack: Option<u32>,
    phase: Phase,
    layer: StrId,
}

/// The replay of the entries in time order through one allocator model per device.
struct Replay {
    states: Vec<AllocatorState>,
    /// Blocks alive at the start that no known segment holds, until freed.
    loose_allocated: HashMap<(usize, u64), u64>,
    /// Sizes of blocks that no known segment holds whose free was requested and not yet
    /// completed.
    pending_free: HashMap<(usize, u64), u64>,
    /// The first final segment at each (device, address), as a linear search would find it.
    final_pool: HashMap<(usize, u64), Pool>,
    /// Sorted by start.
    optimizer_spans: Vec<OptimizerSpan>,
    /// Entries come in time order, so one cursor walks the optimizer spans.
    span_cursor: usize,
    interner: StackInterner,
    streams: Streams,
    /// Frees sized by rounding the requested size.
    estimated: usize,
    /// The private pool of the first final segment at each (device, address).
    final_private: HashMap<(usize, u64), u16>,
    /// Each live allocation's event and pool, by (device, address), while annotations or
    /// pools need them.
    live: HashMap<(u8, u64), (u32, Option<u16>)>,
    track_live: bool,
    /// Annotations of addresses no allocation of the trace held then.
    annotations_not_live: usize,
    /// Frees whose `pool_id` is not their allocation's.
    pool_mismatches: usize,
}

impl Replay {
    /// Takes the trace (with its scopes), the final segments and the start state.
    fn new(
        trace: &Trace,
        finals: &[FinalSeg],
        states: Vec<AllocatorState>,
        loose_allocated: HashMap<(usize, u64), u64>,
        loose_pending: HashMap<(usize, u64), u64>,
        streams: Streams,
    ) -> Self {
        let optimizer_spans = trace
            .scopes
            .iter()
            .filter(|s| trace.str(s.name).starts_with("Optimizer.step"))
            .map(|s| OptimizerSpan { start_ns: s.start_ns, end_ns: s.end_ns, name: s.name })
            .collect();
        let mut final_pool: HashMap<(usize, u64), Pool> = HashMap::default();
        let mut final_private: HashMap<(usize, u64), u16> = HashMap::default();
        for f in finals {
            final_pool.entry((f.device, f.address)).or_insert(f.pool);
            if let Some(p) = f.private_pool {
                final_private.entry((f.device, f.address)).or_insert(p);
            }
        }
        Replay {
            states,
            loose_allocated,
            pending_free: loose_pending,
            final_pool,
            optimizer_spans,
            span_cursor: 0,
            interner: StackInterner::default(),
            streams,
            estimated: 0,
            final_private,
            live: HashMap::default(),
            track_live: false,
            annotations_not_live: 0,
            pool_mismatches: 0,
        }
    }

    /// Gives the trace its pools, its notes in event order, and what could not be attached.
    fn finish(&mut self, extras: &mut Extras, trace: &mut Trace) {
        trace.pools = std::mem::take(&mut extras.pools);
        trace.event_notes.sort_by_key(|n| (n.event, n.ts_ns));
        trace.meta.warnings.extend(extras.warnings());
        if self.annotations_not_live > 0 {
            trace.meta.warnings.push(format!(
                "{} annotations name an address no allocation of the trace held then (freed, or allocated before recording began): left out",
                self.annotations_not_live
            ));
        }
        if self.pool_mismatches > 0 {
            trace.meta.warnings.push(format!(
                "{} frees name a pool other than their allocation's: they are counted in the allocation's pool",
                self.pool_mismatches
            ));
        }
    }

    /// Takes the entries in time order; gives the trace its events.
    fn run(&mut self, v: &View, entries: EntryBlocks, compactor: &mut Compactor, trace: &mut Trace) -> Result<(), ImportError> {
        // One event per entry, and a completion after each one-step free.
        let one_step_frees = entries.iter().filter(|e| matches!(e.action, Action::Free | Action::FreeCompleted)).count();
        self.track_live = entries.iter().any(|e| e.action == Action::Annotate || compactor.extras.get(e.extra).pool_given);
        trace.events.reserve_exact(entries.len() + one_step_frees);
        trace.stacks.event_stacks.reserve_exact(entries.iter().filter(|e| e.frames.get().is_some()).count());
        // Entries are taken in time order and given back as the trace's columns fill, so that
        // the two are not both held whole: a block at a time, and a single sorted block from
        // its back as it shrinks.
        for mut block in entries.blocks {
            block.reverse();
            let mut taken = 0usize;
            while let Some(e) = block.pop() {
                taken += 1;
                if taken.is_multiple_of(1 << 18) && block.capacity() > block.len() + block.len() / 4 {
                    block.shrink_to_fit();
                }
                self.replay_entry(v, &e, compactor, trace)?;
            }
        }
        Ok(())
    }

    /// Replays one entry: its event, its stack, its pool and notes, and the completion of a
    /// one-step free.
    fn replay_entry(&mut self, v: &View, e: &Entry, compactor: &mut Compactor, trace: &mut Trace) -> Result<(), ImportError> {
        if e.action == Action::Annotate {
            return self.annotate(v, e, compactor, trace);
        }
        let dev = e.device as usize;
        let extra = compactor.extras.get(e.extra);
        let segment_pool = self.states[dev].private_pool_at(e.addr);
        let sized = self.size_event(e, &compactor.streams, trace)?;
        let ts_ns = (e.time_us.max(0) as u64).saturating_mul(1000);
        let by = self.attribute(v, e, ts_ns, &mut compactor.local, trace)?;
        let stream = self.streams.index(trace, compactor.streams.raw(e.stream))?;
        let index = trace.events.len() as u32;
        let rec = EventRecord {
            ts_ns,
            event_type: sized.event_type,
            phase: by.phase,
            size_bytes: sized.size_bytes,
            address: e.addr,
            layer: by.layer,
            device: dev as u8,
            stream,
            totals: None,
        };
        trace.events.push(rec);
        if let Some(s) = by.stack {
            trace.stacks.event_stacks.push((index, s));
        }
        // An allocation's entry gives what was asked for; the event, the block.
        if e.action == Action::Alloc && e.size > 0 && e.size <= sized.size_bytes {
            trace.event_requested.push((index, e.size));
        }
        let pool = self.pool_of(e, extra, segment_pool, index);
        if let Some(p) = pool {
            trace.event_pools.push((index, p));
        }
        for (text, kind) in [(extra.user, NoteKind::UserMetadata), (extra.internal, NoteKind::Internal)] {
            if let Some(k) = text {
                let text = compactor.extras.trace_text(k, trace);
                trace.event_notes.push(EventNote { event: index, kind, text, ts_ns, stack: None });
            }
        }
        if sized.completes {
            // Older snapshots (and some tools) free in one step: record the completion too, so
            // replays of the segment state see the block released.
            trace.events.push(EventRecord { event_type: EventType::FreeCompleted, ..rec });
            if let Some(p) = pool {
                trace.event_pools.push((index + 1, p));
            }
        }
        Ok(())
    }

    /// The private pool of entry `e` (event `index`), given the pool of the segment that held
    /// its address before it: an allocation's free is in its allocation's pool; otherwise
    /// the entry's own `pool_id` (torch 2.12+) wins over its segment's (older snapshots name
    /// pools only on final segments).
    fn pool_of(&mut self, e: &Entry, extra: extras::Extra, segment_pool: Option<u16>, index: u32) -> Option<u16> {
        let dev = e.device as usize;
        let given = extra.pool_given.then_some(extra.pool);
        match e.action {
            Action::Alloc => {
                let pool = given.unwrap_or_else(|| self.states[dev].private_pool_at(e.addr));
                if self.track_live {
                    self.live.insert((e.device, e.addr), (index, pool));
                }
                pool
            }
            Action::FreeRequested | Action::Free | Action::FreeCompleted => {
                let allocated = if self.track_live { self.live.remove(&(e.device, e.addr)).map(|(_, p)| p) } else { None };
                if let (Some(a), Some(g)) = (allocated, given) {
                    if a != g {
                        self.pool_mismatches += 1;
                    }
                }
                allocated.or(given).unwrap_or(segment_pool)
            }
            Action::SegmentAlloc | Action::SegmentMap => {
                let pool = given.unwrap_or_else(|| self.final_private.get(&(dev, e.addr)).copied());
                self.states[dev].set_private_pool(e.addr, pool);
                pool
            }
            Action::SegmentFree | Action::SegmentUnmap => segment_pool.or(given.flatten()),
            Action::Snapshot | Action::Oom | Action::Annotate => given.flatten(),
        }
    }

    /// An `annotate` entry: its text becomes a note of the live allocation at its address,
    /// with the annotating call's stack.
    fn annotate(&mut self, v: &View, e: &Entry, compactor: &mut Compactor, trace: &mut Trace) -> Result<(), ImportError> {
        let Some(&(event, _)) = self.live.get(&(e.device, e.addr)) else {
            self.annotations_not_live += 1;
            return Ok(());
        };
        let Some(text) = compactor.extras.get(e.extra).user else { return Ok(()) };
        let ts_ns = (e.time_us.max(0) as u64).saturating_mul(1000);
        let stack = self.attribute(v, e, ts_ns, &mut compactor.local, trace)?.stack;
        let text = compactor.extras.trace_text(text, trace);
        trace.event_notes.push(EventNote { event, kind: NoteKind::Annotation, text, ts_ns, stack });
        Ok(())
    }

    /// Takes an entry; applies it to its device's allocator model and gives the event it makes.
    fn size_event(&mut self, e: &Entry, local_streams: &LocalStreams, trace: &mut Trace) -> Result<SizedEvent, ImportError> {
        let dev = e.device as usize;
        let state = &mut self.states[dev];
        let mut completes = false;
        let (event_type, size_bytes) = match e.action {
            Action::Alloc => (EventType::Alloc, state.alloc(e.addr, e.size)),
            Action::FreeRequested => {
                let size = match state.free_requested(e.addr) {
                    Some(s) => s,
                    None => {
                        let size = self.loose_allocated.remove(&(dev, e.addr)).unwrap_or_else(|| {
                            self.estimated += 1;
                            state.config().round_size(e.size)
                        });
                        self.pending_free.insert((dev, e.addr), size);
                        size
                    }
                };
                (EventType::Free, size)
            }
            Action::Free => {
                let size = match state.free(e.addr).or_else(|| self.loose_allocated.remove(&(dev, e.addr))) {
                    Some(s) => s,
                    None => {
                        self.estimated += 1;
                        state.config().round_size(e.size)
                    }
                };
                completes = true;
                (EventType::Free, size)
            }
            Action::FreeCompleted => {
                if let Some(size) = state.pending_block(e.addr).or_else(|| self.pending_free.remove(&(dev, e.addr))) {
                    state.free(e.addr);
                    (EventType::FreeCompleted, size)
                } else if let Some(size) = state.allocated_block(e.addr).or_else(|| self.loose_allocated.remove(&(dev, e.addr))) {
                    // No request came first: the completion is the free (memory_viz reads it so).
                    state.free(e.addr);
                    completes = true;
                    (EventType::Free, size)
                } else {
                    (EventType::FreeCompleted, state.config().round_size(e.size))
                }
            }
            Action::SegmentAlloc | Action::SegmentMap => {
                let stream = self.streams.index(trace, local_streams.raw(e.stream))?;
                let pool = self.final_pool.get(&(dev, e.addr)).copied().unwrap_or_else(|| pool_for_segment(e.size));
                self.states[dev].segment_alloc(e.addr, e.size, dev as u8, stream, pool);
                let et = if e.action == Action::SegmentAlloc { EventType::SegmentAlloc } else { EventType::SegmentMap };
                (et, e.size)
            }
            Action::SegmentFree | Action::SegmentUnmap => {
                state.segment_free(e.addr);
                let et = if e.action == Action::SegmentFree { EventType::SegmentFree } else { EventType::SegmentUnmap };
                (et, e.size)
            }
            Action::Snapshot | Action::Annotate => (EventType::Snapshot, 0),
            Action::Oom => (EventType::Oom, e.size),
        };
        Ok(SizedEvent { event_type, size_bytes, completes })
    }

    /// Takes an entry at `ts_ns`; gives its stack, and the phase and layer the stack names,
    /// unless an optimizer step was running then.
    fn attribute(
        &mut self,
        v: &View,
        e: &Entry,
        ts_ns: u64,
        local: &mut LocalFrames,
        trace: &mut Trace,
    ) -> Result<Attribution, ImportError> {
        let dev = e.device as usize;
        let mut by = match e.frames.get() {
            Some(f) => {
                let s = self.interner.stack(v, local, trace, f, &|| format!("device_traces[{dev}][{}].frames", e.index))?;
                Attribution { stack: Some(s.stack), phase: s.phase, layer: s.layer }
            }
            None => Attribution { stack: None, phase: Phase::Other, layer: StrId::NONE },
        };
        while self.span_cursor < self.optimizer_spans.len() && self.optimizer_spans[self.span_cursor].end_ns < ts_ns {
            self.span_cursor += 1;
        }
        if let Some(span) = self.optimizer_spans.get(self.span_cursor) {
            if span.start_ns <= ts_ns {
                by.phase = Phase::Optimizer;
                by.layer = span.name;
            }
        }
        Ok(by)
    }
}

/// The annotations of `ann` as scopes, within `entries_ns` (the first and last trace entries'
/// times): those wholly outside are left out, and one that crosses an end is cut there. The
/// recorder keeps as many annotations as trace entries (its annotation buffer takes the same
/// `max_entries`), and with a few annotations per iteration against hundreds of entries, a
/// snapshot whose trace buffer wrapped holds annotations from long before its first entry (a
/// window of 70 000 entries of a real run, 1.07 s, came with annotations over 69 s). Kept, they
/// stretched the timeline over time without memory data (the peak drawn at 35 s of 36, its
/// 1.07 s in the last 3 % of the chart) and counted 4 531 iterations where there were 73.
fn import_annotations(
    v: &View,
    trace: &mut Trace,
    ann: ValueId,
    entries_ns: Option<(u64, u64)>,
    budget: &mut WalkBudget,
) -> Result<(), ImportError> {
    let (from, to) = entries_ns.unwrap_or((0, u64::MAX));
    let mut outside = 0usize;
    let mut open: HashMap<String, Vec<u64>> = HashMap::default();
    for (i, &a) in v.list(ann, "external_annotations")?.iter().enumerate() {
        let path = format!("external_annotations[{i}]");
        budget.charge(v, a, &path)?;
        let (Some(stage), Some(name)) = (v.opt_str(a, "stage"), v.opt_str(a, "name")) else {
            continue;
        };
        let ts = (v.int(a, "time_us", &path)?.max(0) as u64).saturating_mul(1000);
        match stage {
            "START" => open.entry(name.to_owned()).or_default().push(ts),
            "END" => {
                if let Some(start) = open.get_mut(name).and_then(Vec::pop) {
                    if ts < from || start > to {
                        outside += 1;
                        continue;
                    }
                    let phase = if name.starts_with("Optimizer.") { Phase::Optimizer } else { Phase::Other };
                    let id = trace.strings.intern(name);
                    let (start_ns, end_ns) = (start.max(from), ts.min(to));
                    trace.scopes.push(LayerScope { name: id, start_ns, end_ns, depth: 0, phase, thread: 0 });
                }
            }
            _ => {}
        }
    }
    if outside > 0 {
        trace.meta.warnings.push(format!(
            "{outside} annotated spans outside the trace entries' time were left out (the recorder keeps as many annotations as \
             trace entries, so a wrapped trace's annotations reach further than its entries)"
        ));
    }
    trace.scopes.sort_by_key(|s| (s.start_ns, std::cmp::Reverse(s.end_ns)));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first and last entries, whatever the blocks' lengths: while streaming (full blocks),
    /// after `append` (a short block), and after a sort (one block).
    #[test]
    fn entry_blocks_ends_hold_for_blocks_of_any_length() {
        let at = |time_us: i64| Entry {
            addr: 0,
            size: 0,
            time_us,
            index: 0,
            frames: PackedFrames::new(None),
            items: 0,
            stream: 0,
            extra: 0,
            device: 0,
            action: Action::Alloc,
        };
        let mut e = EntryBlocks::default();
        assert!(e.ends().is_none());
        let n = EntryBlocks::BLOCK as i64 + 3;
        for t in 0..n {
            e.push(at(t));
        }
        let times = |e: &EntryBlocks| e.ends().map(|(a, b)| (a.time_us, b.time_us));
        assert_eq!(times(&e), Some((0, n - 1)));
        e.append(vec![at(-5), at(n + 10)]);
        assert_eq!(times(&e), Some((0, n + 10)));
        e.sort_by_key(|x| x.time_us);
        assert_eq!(times(&e), Some((-5, n + 10)));
        e.retain(|x| x.time_us != -5 && x.time_us != n + 10);
        assert_eq!(times(&e), Some((0, n - 1)));
    }

    /// Entries read ahead ([`Compactor::flat_dict`]) give the trace that building each entry
    /// and compacting it gives, on every snapshot fixture and on a pickle of odd entries.
    #[test]
    fn read_ahead_gives_the_trace_that_building_entries_gives() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data");
        let mut files: Vec<_> =
            std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "pickle")).collect();
        files.sort();
        assert!(files.len() >= 7, "{files:?}");
        for path in files {
            let data = std::fs::read(&path).unwrap();
            let fast = import_with(&data[..], None, Compactor::default());
            let slow = import_with(&data[..], None, Compactor { no_read_ahead: true, ..Compactor::default() });
            match (fast, slow) {
                (Ok(fast), Ok(slow)) => {
                    // Every fixture but the one taken without the recorder has entries.
                    assert_eq!(fast.events.is_empty(), path.ends_with("no_history.pickle"), "{path:?}");
                    assert_eq!(serde_json::to_value(&fast).unwrap(), serde_json::to_value(&slow).unwrap(), "{path:?}");
                }
                (fast, slow) => assert_eq!(fast.err().map(|e| e.to_string()), slow.err().map(|e| e.to_string()), "{path:?}"),
            }
        }
    }
}
