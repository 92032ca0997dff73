//! A snapshot's trace entries as compact records: the 40-byte [`Entry`], the blocks that hold
//! them ([`EntryBlocks`]), their actions, and the stacks and streams they name packed into a
//! few bytes ([`PackedFrames`], [`LocalStreams`]; [`Streams`] for the trace's own indices).

use crate::hash::FastMap as HashMap;
use crate::import::pickle::{Value, ValueId};
use crate::import::ImportError;
use crate::model::Trace;

/// An entry's `size`: what it says, read the same way by the
/// [`Compactor`](super::compactor::Compactor) and the walk.
/// `Err(Some(reason))` for a value that is not a size, `Err(None)` when it is missing (a
/// `snapshot` entry needs none).
pub(super) fn entry_size(action: Action, size: Option<&Value>) -> Result<u64, Option<String>> {
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

/// The fields of a trace entry's dict that its record keeps, in
/// [`Compactor::entry`](super::compactor::Compactor::entry)'s order.
pub(super) const ENTRY_KEYS: [&str; 9] =
    ["action", "addr", "size", "stream", "time_us", "frames", "pool_id", "user_metadata", "internal_metadata"];

/// One trace entry, decoded. 40 bytes: a snapshot's entries are held until they are sorted by
/// time.
#[derive(Clone)]
pub(super) struct Entry {
    pub(super) addr: u64,
    pub(super) size: u64,
    pub(super) time_us: i64,
    /// Position in its device's trace (for error paths; entries are then sorted by time);
    /// [`UNPLACED`] while a compacted entry has not been found in `device_traces` yet.
    pub(super) index: u32,
    pub(super) frames: PackedFrames,
    /// Items of the entry's dict, for the [`WalkBudget`](super::budget::WalkBudget).
    pub(super) items: u16,
    /// In [`LocalStreams`].
    pub(super) stream: u16,
    /// Its pool and metadata, in [`Extras`](super::extras::Extras) (0: none).
    pub(super) extra: u16,
    pub(super) device: u8,
    pub(super) action: Action,
}

const _: () = assert!(std::mem::size_of::<Entry>() == 40);

/// A snapshot's entries, in blocks of at most [`EntryBlocks::BLOCK`] while it streams: a `Vec`
/// doubles as it grows, and in a browser's worker (whose memory never shrinks) a 19.2 M-entry
/// snapshot rose from 1.29 to 2.54 GiB at one doubling of 0.67 to 1.34 GB of entries, 570 MB
/// of it never used. Blocks grow the memory one block at a time, and the replay gives each
/// block back as it is done, while the trace's columns grow.
#[derive(Default)]
pub(super) struct EntryBlocks {
    pub(super) blocks: Vec<Vec<Entry>>,
    len: usize,
}

impl EntryBlocks {
    /// Entries per block while streaming (2.5 MiB).
    const BLOCK: usize = 1 << 16;

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn push(&mut self, e: Entry) {
        match self.blocks.last_mut() {
            Some(b) if b.len() < Self::BLOCK => b.push(e),
            // Each block grows from empty (to exactly `BLOCK`, a power of two), so a small
            // snapshot holds what its entries need, not a whole block.
            _ => self.blocks.push(vec![e]),
        }
        self.len += 1;
    }

    pub(super) fn get(&self, k: usize) -> &Entry {
        &self.blocks[k / Self::BLOCK][k % Self::BLOCK]
    }

    pub(super) fn get_mut(&mut self, k: usize) -> &mut Entry {
        &mut self.blocks[k / Self::BLOCK][k % Self::BLOCK]
    }

    /// Adds `more` after these entries, as a block of its own (indices past it no longer hold).
    pub(super) fn append(&mut self, more: Vec<Entry>) {
        self.len += more.len();
        if !more.is_empty() {
            self.blocks.push(more);
        }
    }

    /// Keeps the entries `keep` takes, in place.
    pub(super) fn retain(&mut self, keep: impl Fn(&Entry) -> bool) {
        for b in &mut self.blocks {
            b.retain(&keep);
        }
        self.blocks.retain(|b| !b.is_empty());
        self.len = self.blocks.iter().map(Vec::len).sum();
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Entry> {
        self.blocks.iter().flatten()
    }

    pub(super) fn for_each_mut(&mut self, f: impl FnMut(&mut Entry)) {
        self.blocks.iter_mut().flatten().for_each(f);
    }

    /// The first and the last entry (blocks may differ in length: not through [`Self::get`]).
    pub(super) fn ends(&self) -> Option<(&Entry, &Entry)> {
        Some((self.blocks.first()?.first()?, self.blocks.last()?.last()?))
    }

    /// Sorted by `key`, stably; entries already in order are left where they are (checking
    /// costs a pass, sorting far more); blocks out of order only inside stay blocks, others
    /// become one block.
    pub(super) fn sort_by_key<K: Ord>(&mut self, key: impl Fn(&Entry) -> K) {
        if self.iter().is_sorted_by_key(&key) {
            return;
        }
        // Entries read ahead are kept as they are read, the others when their batch is
        // appended (Python appends up to 1,000 at a time), so most files are out of order
        // only within a batch: each block sorted where it is is then enough, with no copy of
        // every entry (a thirtieth of a summary's time).
        for b in &mut self.blocks {
            if !b.is_sorted_by_key(&key) {
                b.sort_by_key(&key);
            }
        }
        // A batch across two blocks: the entries on each side of the boundary that belong on
        // the other side are sorted together and put back, as many on each side as before.
        for k in 1..self.blocks.len() {
            let (left, right) = self.blocks.split_at_mut(k);
            let (a, b) = (&mut left[k - 1], &mut right[0]);
            let (Some(last), Some(first)) = (a.last().map(&key), b.first().map(&key)) else { continue };
            if last <= first {
                continue;
            }
            let tail = a.len() - a.partition_point(|x| key(x) <= first);
            let head = b.partition_point(|x| key(x) < last);
            let mut both: Vec<Entry> = a.drain(a.len() - tail..).chain(b.drain(..head)).collect();
            both.sort_by_key(&key);
            let rest = both.split_off(tail);
            a.extend(both);
            b.splice(0..0, rest);
        }
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
pub(super) struct PackedFrames(u32);

impl PackedFrames {
    const NONE: PackedFrames = PackedFrames(u32::MAX);

    pub(super) fn new(frames: Option<Frames>) -> Self {
        match frames {
            None => Self::NONE,
            Some(Frames::Local(sid)) => PackedFrames(sid),
            Some(Frames::Value(id)) => PackedFrames(id | (1 << 31)),
        }
    }

    pub(super) fn get(self) -> Option<Frames> {
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
pub(super) struct LocalStreams {
    raw: Vec<i64>,
    ids: HashMap<i64, u16>,
}

impl LocalStreams {
    pub(super) fn id(&mut self, raw: i64) -> Option<u16> {
        if let Some(&i) = self.ids.get(&raw) {
            return Some(i);
        }
        let i = u16::try_from(self.raw.len()).ok()?;
        self.raw.push(raw);
        self.ids.insert(raw, i);
        Some(i)
    }

    pub(super) fn raw(&self, id: u16) -> i64 {
        self.raw[id as usize]
    }
}

/// [`Entry::index`] of an entry the walk has not placed.
pub(super) const UNPLACED: u32 = u32::MAX;

/// An entry's stack: still a pickle value, or already a
/// [`LocalFrames`](super::compactor::LocalFrames) stack.
#[derive(Clone, Copy)]
pub(super) enum Frames {
    Value(ValueId),
    Local(u32),
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Action {
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

pub(super) fn parse_action(s: &str) -> Option<Action> {
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
pub(super) struct Streams {
    ids: HashMap<i64, u16>,
}

impl Streams {
    pub(super) fn index(&mut self, trace: &mut Trace, stream: i64) -> Result<u16, ImportError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An allocation's entry at `time_us`, `index` in the walk.
    fn entry(time_us: i64, index: u32) -> Entry {
        Entry {
            addr: 0,
            size: 0,
            time_us,
            index,
            frames: PackedFrames::new(None),
            items: 0,
            stream: 0,
            extra: 0,
            device: 0,
            action: Action::Alloc,
        }
    }

    /// The first and last entries, whatever the blocks' lengths: while streaming (full blocks),
    /// after `append` (a short block), and after a sort (one block).
    #[test]
    fn entry_blocks_ends_hold_for_blocks_of_any_length() {
        let at = |time_us: i64| entry(time_us, 0);
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

    /// Entries out of order within their blocks or across a boundary (a pickle's batch of
    /// appends) are sorted where they are; an entry far from its place makes one sorted
    /// block; either way the order is the key's, and equal keys keep their order.
    #[test]
    fn entry_blocks_sort_in_place_or_whole() {
        let at = entry;
        // Three blocks, batches of 1,000 across both boundaries.
        let n = 133_000;
        // Each run of 1,000 reversed, as when a batch's entries come after those read ahead;
        // two entries of time 7 in their order.
        let times: Vec<i64> = (0..n).map(|t| (t / 1000) * 1000 + 999 - t % 1000).filter(|&t| t < n).collect();
        let sorted = |e: &EntryBlocks| e.iter().map(|x| (x.time_us, x.index)).collect::<Vec<_>>();
        for misplaced in [false, true] {
            let mut e = EntryBlocks::default();
            for (k, &t) in times.iter().enumerate() {
                e.push(at(if t == 8 { 7 } else { t }, k as u32));
            }
            if misplaced {
                e.push(at(-1, u32::MAX));
            }
            let blocks = e.blocks.len();
            e.sort_by_key(|x| x.time_us);
            let got = sorted(&e);
            assert!(got.windows(2).all(|w| w[0].0 <= w[1].0), "misplaced {misplaced}");
            let sevens: Vec<u32> = got.iter().filter(|x| x.0 == 7).map(|x| x.1).collect();
            assert!(sevens.len() == 2 && sevens[0] < sevens[1], "{sevens:?}");
            assert_eq!(e.len(), times.len() + usize::from(misplaced));
            assert_eq!(e.blocks.len(), if misplaced { 1 } else { blocks });
        }
    }
}
