//! The check that ends an import: on a CUDA device allocated memory lies within reserved
//! memory, else the device's reserved memory is marked unknown, with a warning.

use crate::hash::FastSet as HashSet;
use crate::import::ImportError;
use crate::model::Trace;

/// Most devices a snapshot may name (device indices are stored in a byte).
const MAX_DEVICES: usize = 256;

/// On a CUDA device every allocated block lies in a reserved segment: a replay where
/// allocated exceeds reserved misread the entries (frees it did not see, sizes it got wrong),
/// or the snapshot's segments cannot hold its allocations (some tools write such files). Its
/// allocated timeline is still what the entries say, so the device is opened with it and its
/// reserved memory marked unknown (`TraceMeta::reserved_unknown`), with a warning that says
/// where the two first disagree. A device the snapshot names no segment of (trace entries
/// alone, as some tools write them) has no reserved memory to compare with: it is marked
/// unknown too. Pinned host memory keeps its replayed totals, with a warning.
pub(super) fn check_allocated_within_reserved(
    trace: &mut Trace,
    with_segments: &HashSet<usize>,
    host: Option<usize>,
) -> Result<(), ImportError> {
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
