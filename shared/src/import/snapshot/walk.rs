//! The walk of the trace entries (`device_traces`, `host_traces`): compacted entries placed
//! where the walk finds them, entries left as values read, all merged by time; and the
//! devices the entries and final segments name.

use super::budget::WalkBudget;
use super::compactor::Compactor;
use super::entries::{entry_size, parse_action, Entry, EntryBlocks, Frames, LocalStreams, PackedFrames, ENTRY_KEYS, UNPLACED};
use super::extras::Extras;
use super::finals::FinalSeg;
use super::view::View;
use super::HOST_DEVICE;
use crate::hash::FastMap as HashMap;
use crate::import::pickle::{self, FlatValue, Value, ValueId};
use crate::import::ImportError;
use crate::model::{Device, Trace};

/// Takes `device_traces` and the compacted entries; gives the trace entries of every device,
/// merged by time. Compacted entries are placed where the walk finds them: the first time in
/// place, again as a copy; any the walk never finds are dropped. Unknown actions are counted
/// in the trace's warnings.
pub(super) fn walk_device_traces(
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
pub(super) struct Traces {
    pub(super) device: ValueId,
    pub(super) host: Option<ValueId>,
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
pub(super) fn add_devices(trace: &mut Trace, finals: &mut [FinalSeg], entries: &mut EntryBlocks) -> Option<usize> {
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
