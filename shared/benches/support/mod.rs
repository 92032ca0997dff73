//! What the benchmarks share (the collector's benches include it by path).

use shared::model::{EventRecord, Trace};

/// `copies` back-to-back copies of `base`'s memory events (shifted in time).
pub fn replicate(base: &Trace, copies: usize) -> Trace {
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
            t.events.push(EventRecord { ts_ns: rec.ts_ns + c * span, ..rec });
        }
    }
    t.finish();
    t
}
