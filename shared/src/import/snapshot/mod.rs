//! Importer of PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot` pickles).
//!
//! Trace entries record requested sizes; the allocator counts blocks. The importer therefore
//! replays segments and blocks ([`crate::allocator`]) starting from the memory that existed
//! before recording began, recovered from the final `segments` state, so that every event's
//! `allocated_bytes` is what `torch.cuda.memory_allocated()` said at that moment.
//!
//! In order of the import: `view.rs` (typed reads of the pickle), `interning.rs` (frames and
//! stacks kept once while it is read), `entries.rs` (each entry packed), `segments.rs` (the
//! final state and the walk over each device's entries), `start.rs` (the memory before
//! recording), `replay.rs` (the events), `extras.rs` (pools and notes). This file holds the
//! entry points and the checks on the result.

mod entries;
mod extras;
mod interning;
mod replay;
mod segments;
mod start;
mod view;

use entries::*;
use interning::*;
use replay::*;
use segments::*;
use start::*;
use view::*;

use super::pickle::{self, FlatDict, FlatTaken, FlatValue, Pickle, Value, ValueId};
use super::ImportError;
use crate::allocator::{AllocatorConfig, AllocatorState, SMALL_REQUEST_BYTES, SMALL_SEGMENT_BYTES};
use crate::hash::{FastMap as HashMap, FastSet as HashSet};
use crate::model::{
    BlockInfo, BlockState, Device, EventNote, EventRecord, EventType, Frame, LayerScope, NoteKind, Phase, Pool, SegmentInfo, SourceFormat,
    StrId, Totals, Trace, TraceMeta,
};
use extras::Extras;

/// Most devices a snapshot may name (device indices are stored in a byte).
const MAX_DEVICES: usize = 256;
/// The device index pinned host memory's entries and segments take while the importer reads
/// them (CUDA devices are below it); it becomes the device after the last CUDA one.
const HOST_DEVICE: u8 = 255;

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
