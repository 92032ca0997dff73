//! The pickle hook of the snapshot importer ([`Compactor`]): each trace entry becomes a
//! compact record the moment it is appended, its frames and stacks interned in
//! [`LocalFrames`], so that a streaming snapshot is never held as values.

use super::entries::{entry_size, parse_action, Entry, EntryBlocks, Frames, LocalStreams, PackedFrames, ENTRY_KEYS, UNPLACED};
use super::extras::Extras;
use crate::hash::FastMap as HashMap;
use crate::import::pickle::{self, FlatDict, FlatTaken, FlatValue, Value, ValueId};
use crate::import::ImportError;

/// A frame as the snapshot wrote it, before it enters the trace's tables.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(super) struct LocalFrame {
    pub(super) name: Box<str>,
    pub(super) filename: Box<str>,
    pub(super) line: u32,
}

/// Frames and stacks interned while the pickle streams, so that an entry keeps a stack id and
/// not its frame list. They enter the trace's tables later, in time order (see
/// [`StackInterner`](super::stacks::StackInterner)), so that the trace's ids are what a walk
/// of the whole pickle gives.
#[derive(Default)]
pub(super) struct LocalFrames {
    pub(super) frames: Vec<LocalFrame>,
    frame_index: HashMap<LocalFrame, u32>,
    pub(super) stacks: Vec<Box<[u32]>>,
    stack_index: HashMap<Box<[u32]>, u32>,
    /// Frame dicts already converted, by slot; only slots that are never reused (memoized or
    /// shared ones) are cached.
    frame_cache: HashMap<ValueId, u32>,
}

impl LocalFrames {
    /// The frame dict `f`, or `None` if it lacks a string `name` or `filename`.
    #[inline]
    pub(super) fn frame(&mut self, a: &pickle::Arena, f: ValueId) -> Option<u32> {
        // Once met, a frame's memo key names its opaque id: the common case, kept inline.
        if pickle::is_opaque(f) {
            return (f & TAGS == FRAME_TAG).then_some(f & !(pickle::OPAQUE | TAGS));
        }
        self.frame_dict(a, f)
    }

    /// [`LocalFrames::frame`] of a frame dict still in the arena.
    #[inline(never)]
    fn frame_dict(&mut self, a: &pickle::Arena, f: ValueId) -> Option<u32> {
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

    pub(super) fn stack(&mut self, ids: &[u32]) -> u32 {
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
pub(super) struct Compactor {
    pub(super) entries: EntryBlocks,
    pub(super) local: LocalFrames,
    pub(super) streams: LocalStreams,
    /// Entries held in several places, by slot, while a holder remains.
    shared_entries: HashMap<ValueId, u32>,
    keys: EntryKeys,
    /// Leaves every entry to [`Compactor::compact`] (the tests compare both ways).
    pub(super) no_read_ahead: bool,
    /// [`Compactor::frames`]'s frame ids, kept to save an allocation per entry.
    frame_ids: Vec<u32>,
    /// The entries' pools and metadata.
    pub(super) extras: Extras,
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
    pub(super) fn entry_index(id: ValueId) -> Option<usize> {
        (pickle::is_opaque(id) && id & TAGS == 0).then_some((id & !pickle::OPAQUE) as usize)
    }

    pub(super) fn local_stack(id: ValueId) -> Option<u32> {
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

#[cfg(test)]
mod tests {
    use super::super::import_with;
    use super::*;

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

    /// Writes pickle opcodes by hand, counting memo keys.
    #[derive(Default)]
    struct Writer {
        b: Vec<u8>,
        memo: u32,
    }

    impl Writer {
        fn op(&mut self, bytes: &[u8]) -> &mut Self {
            self.b.extend_from_slice(bytes);
            self
        }

        fn memoize(&mut self) -> u32 {
            self.b.push(0x94);
            self.memo += 1;
            self.memo - 1
        }

        fn text(&mut self, t: &str) -> u32 {
            self.op(&[0x8c, t.len() as u8]).op(t.as_bytes());
            self.memoize()
        }

        fn get(&mut self, key: u32) -> &mut Self {
            self.op(b"j").op(&key.to_le_bytes())
        }

        fn int(&mut self, v: u32) -> &mut Self {
            self.op(b"J").op(&v.to_le_bytes())
        }

        /// The snapshot dict's start, then the list (under key `pool`) whose items the test
        /// memoizes for its entries to name; [`Writer::traces`] closes it.
        fn pool(&mut self, pool: &str) -> &mut Self {
            self.op(&[0x80, 4, b'}']);
            self.memoize();
            self.op(b"(");
            self.text(pool);
            self.op(b"]");
            self.memoize();
            self.op(b"(")
        }

        /// Closes the pool, writes empty `segments` and opens `device_traces` and its one
        /// device's list for the entries (closed by `eeu.`).
        fn traces(&mut self) -> &mut Self {
            self.op(b"e");
            self.text("segments");
            self.op(b"]");
            self.memoize();
            self.text("device_traces");
            self.op(b"]");
            self.memoize();
            self.op(b"(]");
            self.memoize();
            self.op(b"(")
        }

        /// An entry's dict up to its last key: an `alloc` at `addr` at `time`, 512 bytes,
        /// stream 0; `keys` the memo keys of action, addr, size, stream and time_us.
        fn alloc_entry(&mut self, keys: &[u32], alloc: u32, addr: u32, time: u32) -> &mut Self {
            self.op(b"}");
            self.memoize();
            self.op(b"(").get(keys[0]).get(alloc).get(keys[1]).int(addr).get(keys[2]).int(512);
            self.get(keys[3]).int(0).get(keys[4]).int(time)
        }

        /// A frame dict `{name, filename, line}` (keys as memo keys), memoized.
        fn frame(&mut self, keys: [u32; 3], name: &str) -> u32 {
            self.op(b"}");
            let k = self.memoize();
            self.op(b"(").get(keys[0]);
            self.text(name);
            self.get(keys[1]);
            self.text("train.py");
            self.get(keys[2]).int(7).op(b"u");
            k
        }
    }

    /// A list whose opcodes repeat those of a list read before stands for what its memo keys
    /// name now: a key bound again in between (a PUT of a used index, which Python never
    /// writes but a file may) gives the later entry its new frame, as building it would.
    #[test]
    fn a_list_of_the_same_bytes_after_a_memo_key_is_bound_again_reads_what_the_key_names_now() {
        let mut w = Writer::default();
        w.pool("frames_pool");
        let (name, filename, line) = (w.text("name"), w.text("filename"), w.text("line"));
        let (a, b) = (w.frame([name, filename, line], "first"), w.frame([name, filename, line], "second"));
        let keys = ["action", "addr", "size", "stream", "time_us", "frames"].map(|k| w.text(k));
        let alloc = w.text("alloc");
        w.traces();
        // Three entries with one list of frames byte for byte; the key of the second frame
        // names a new frame before the third.
        for i in 0..3u32 {
            if i == 2 {
                w.frame([name, filename, line], "rebound");
                w.op(b"r").op(&b.to_le_bytes()).op(b"0");
            }
            w.alloc_entry(&keys, alloc, 4096 * (i + 1), 10 + i).get(keys[5]).op(b"]");
            w.memoize();
            w.op(b"(").get(a).get(b).op(b"eu");
        }
        w.op(b"eeu.");
        let fast = import_with(&w.b[..], None, Compactor::default()).unwrap();
        let slow = import_with(&w.b[..], None, Compactor { no_read_ahead: true, ..Compactor::default() }).unwrap();
        assert_eq!(serde_json::to_value(&fast).unwrap(), serde_json::to_value(&slow).unwrap());
        let names = |e: usize| -> Vec<String> {
            let id = fast.stacks.stack_of_event(e).unwrap();
            fast.stacks.stack(id).map(|f| fast.strings.get(f.name).unwrap_or_default().to_owned()).collect()
        };
        assert_eq!(fast.events.len(), 3);
        assert_eq!(names(0), names(1));
        assert_eq!(names(2), ["first", "rebound"]);
    }

    /// Fresh strings of read-ahead entries, the same text again and again (a snapshot's
    /// `compile_context`), others between, and the empty one: each memo key names its own
    /// text, as building each entry would have it, whether the text was met just before or
    /// not.
    #[test]
    fn fresh_strings_read_ahead_name_their_own_text_in_the_memo() {
        let mut w = Writer::default();
        w.pool("strings_pool");
        let keys = ["action", "addr", "size", "stream", "time_us", "user_metadata"].map(|k| w.text(k));
        let alloc = w.text("alloc");
        w.traces();
        let texts = ["x", "x", "", "y", "x", "x", "y"];
        let mut memo_of = Vec::new();
        for (i, text) in texts.iter().enumerate() {
            w.alloc_entry(&keys, alloc, 4096 * (i as u32 + 1), 10 + i as u32).get(keys[5]);
            memo_of.push(w.text(text));
            w.op(b"u");
        }
        // Two more entries whose texts are memo references to the strings read ahead above.
        for (i, &k) in [memo_of[4], memo_of[3]].iter().enumerate() {
            w.alloc_entry(&keys, alloc, (1 << 20) * (i as u32 + 1), 100 + i as u32).get(keys[5]).get(k).op(b"u");
        }
        w.op(b"eeu.");
        let fast = import_with(&w.b[..], None, Compactor::default()).unwrap();
        let slow = import_with(&w.b[..], None, Compactor { no_read_ahead: true, ..Compactor::default() }).unwrap();
        assert_eq!(serde_json::to_value(&fast).unwrap(), serde_json::to_value(&slow).unwrap());
        let notes: Vec<(u32, &str)> = fast.event_notes.iter().map(|n| (n.event, fast.strings.get(n.text).unwrap_or_default())).collect();
        assert_eq!(notes, [(0, "x"), (1, "x"), (3, "y"), (4, "x"), (5, "x"), (6, "y"), (7, "x"), (8, "y")]);
    }
}
