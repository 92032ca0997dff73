//! Memory per iteration, on the peak's device: each iteration's peak allocated and reserved
//! bytes, the fragmentation at its peak, its peak in each phase, what is allocated at its end
//! and the growth from the previous end. The iterations are [`super::spans`]; a trace without
//! any is one iteration. What TensorBoard plots per step ([`crate::export::tensorboard`]) and the
//! `MemoryTracer` API hands a `SummaryWriter`.

use crate::model::Trace;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One iteration's memory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IterationMemory {
    /// 0, 1, … in time order.
    pub index: u32,
    /// Seconds since the trace's start.
    pub start_s: f64,
    pub end_s: f64,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// `(reserved − allocated) / reserved` at the allocated peak; 0 with nothing reserved.
    pub fragmentation: f64,
    /// The highest allocated bytes while each phase (`forward`, `backward`, `optimizer`,
    /// `other`) allocated or freed, for the phases that did.
    pub phase_peaks_bytes: BTreeMap<String, u64>,
    /// Allocated bytes at the iteration's end.
    pub allocated_at_end_bytes: u64,
    /// `allocated_at_end_bytes` less the previous iteration's (0 for the first): steady growth
    /// is a leak.
    pub growth_bytes: i64,
}

/// Every iteration, and where they came from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IterationsReport {
    /// `iteration marks`, `optimizer steps`, `repeating allocation sizes`, or `whole trace`.
    pub from: String,
    /// The device measured (the peak's).
    pub device: String,
    pub iterations: Vec<IterationMemory>,
}

/// Memory per iteration of `trace`, on the device whose allocated bytes peak highest.
pub fn per_iteration(trace: &Trace) -> IterationsReport {
    let device = crate::analysis::peak_device(trace);
    let start = trace.start_ns();
    let found = super::spans(trace);
    let mut spans = found.bounds();
    let mut from = found.from.describe().to_owned();
    let ev = &trace.events;
    if spans.is_empty() {
        let end = ev.ts_ns.last().copied().unwrap_or(start);
        spans = vec![(start, end)];
        from = "whole trace".to_owned();
    }
    let mut cursor = ev.cursor();
    let mut totals = ev.base_totals.get(usize::from(device)).copied().unwrap_or_default();
    let mut next = 0usize;
    let mut iterations = Vec::with_capacity(spans.len());
    let mut previous_end: Option<u64> = None;
    for (k, &(span_start, span_end)) in spans.iter().enumerate() {
        // Events before the span move the totals but belong to no iteration.
        while next < ev.len() && ev.ts_ns[next] < span_start {
            let t = cursor.advance();
            if ev.device[next] == device {
                totals = t;
            }
            next += 1;
        }
        let mut peak = totals;
        let mut peak_reserved = totals.reserved_bytes;
        let mut phases: BTreeMap<String, u64> = BTreeMap::new();
        while next < ev.len() && ev.ts_ns[next] <= span_end {
            let t = cursor.advance();
            if ev.device[next] == device {
                totals = t;
                if t.allocated_bytes > peak.allocated_bytes {
                    peak = t;
                }
                peak_reserved = peak_reserved.max(t.reserved_bytes);
                let p = phases.entry(ev.phase(next).as_str().to_owned()).or_default();
                *p = (*p).max(t.allocated_bytes);
            }
            next += 1;
        }
        let end = totals.allocated_bytes;
        let seconds = |ns: u64| ns.saturating_sub(start) as f64 / 1e9;
        iterations.push(IterationMemory {
            index: k as u32,
            start_s: seconds(span_start),
            end_s: seconds(span_end),
            peak_allocated_bytes: peak.allocated_bytes,
            peak_reserved_bytes: peak_reserved,
            fragmentation: if peak.reserved_bytes == 0 {
                0.0
            } else {
                peak.reserved_bytes.saturating_sub(peak.allocated_bytes) as f64 / peak.reserved_bytes as f64
            },
            phase_peaks_bytes: phases,
            allocated_at_end_bytes: end,
            growth_bytes: previous_end.map_or(0, |p| end as i64 - p as i64),
        });
        previous_end = Some(end);
    }
    let device = trace.devices.get(usize::from(device)).map(ToString::to_string).unwrap_or_default();
    IterationsReport { from, device, iterations }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Device, EventRecord, EventType, IterationSpan, Phase, SourceFormat, TraceMeta};

    /// Two iterations: the first allocates 100 (forward) and 50 (backward) and frees the 50;
    /// the second allocates 30 more and keeps it.
    fn two_iterations() -> Trace {
        let mut t = Trace::new(TraceMeta::new(SourceFormat::MemoryTracer));
        t.device_index(Device { kind: "cuda".into(), index: 0, rank: None });
        t.events.base_totals = vec![Default::default()];
        let layer = t.strings.intern("m");
        let ev = |ts, event_type, size_bytes, address, phase| EventRecord {
            ts_ns: ts,
            event_type,
            phase,
            size_bytes,
            address,
            layer,
            device: 0,
            stream: 0,
            totals: None,
        };
        for e in [
            ev(10, EventType::Alloc, 100, 1, Phase::Forward),
            ev(20, EventType::Alloc, 50, 2, Phase::Backward),
            ev(30, EventType::Free, 50, 2, Phase::Backward),
            ev(60, EventType::Alloc, 30, 3, Phase::Forward),
        ] {
            t.events.push(e);
        }
        t.iterations = vec![IterationSpan { index: 0, start_ns: 5, end_ns: 40 }, IterationSpan { index: 1, start_ns: 50, end_ns: 70 }];
        t.finish();
        t
    }

    #[test]
    fn each_iteration_has_its_peaks_phases_and_growth() {
        let r = per_iteration(&two_iterations());
        assert_eq!(r.from, "iteration marks");
        assert_eq!(r.iterations.len(), 2);
        let (a, b) = (&r.iterations[0], &r.iterations[1]);
        assert_eq!((a.peak_allocated_bytes, a.allocated_at_end_bytes, a.growth_bytes), (150, 100, 0));
        assert_eq!(a.phase_peaks_bytes.get("forward"), Some(&100));
        assert_eq!(a.phase_peaks_bytes.get("backward"), Some(&150));
        assert_eq!((b.peak_allocated_bytes, b.allocated_at_end_bytes, b.growth_bytes), (130, 130, 30));
        assert_eq!(b.phase_peaks_bytes.keys().collect::<Vec<_>>(), ["forward"]);
    }

    #[test]
    fn a_trace_without_iterations_is_one() {
        let mut t = two_iterations();
        t.iterations.clear();
        let r = per_iteration(&t);
        // No optimizer steps; four allocations do not repeat three times.
        assert_eq!(r.from, "whole trace");
        assert_eq!(r.iterations.len(), 1);
        assert_eq!(r.iterations[0].peak_allocated_bytes, 150);
        assert_eq!(r.iterations[0].allocated_at_end_bytes, 130);
    }
}
