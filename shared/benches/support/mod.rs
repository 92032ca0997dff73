//! What the benchmarks share (the collector's benches include it by path).

use shared::model::{EventRecord, Trace};

/// `copies` back-to-back copies of `base`'s memory events (shifted in time).
#[allow(dead_code)] // each bench uses one of the two
pub fn replicate(base: &Trace, copies: usize) -> Trace {
    replicate_mapped(base, copies, |_, rec| rec)
}

/// [`replicate`], copy `c`'s addresses moved up by `c` TiB so that no block of one copy is
/// taken for another's, and the totals derived (the allocator what-if replays the copies).
#[allow(dead_code)] // each bench uses one of the two
pub fn replicate_apart(base: &Trace, copies: usize) -> Trace {
    replicate_mapped(base, copies, |c, rec| EventRecord {
        address: if rec.address == 0 { 0 } else { rec.address + (c << 40) },
        totals: None,
        ..rec
    })
}

/// The copies, each event of copy `c` as `map(c, event)` makes it.
fn replicate_mapped(base: &Trace, copies: usize, map: impl Fn(u64, EventRecord) -> EventRecord) -> Trace {
    let mut t = Trace::new(base.meta.clone());
    t.strings = base.strings.clone();
    t.devices = base.devices.clone();
    t.streams = base.streams.clone();
    for (d, b) in base.events.base_totals.iter().enumerate() {
        t.events.set_base_totals(d, *b);
    }
    let ev = &base.events;
    let span = ev.ts_ns.last().copied().unwrap_or(0) - ev.ts_ns.first().copied().unwrap_or(0) + 1;
    for c in 0..copies as u64 {
        for i in 0..ev.len() {
            let rec = ev.record(i);
            t.events.push(map(c, EventRecord { ts_ns: rec.ts_ns + c * span, ..rec }));
        }
    }
    t.finish();
    t
}
