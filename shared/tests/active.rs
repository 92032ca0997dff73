//! The Active Memory Timeline (`shared::analysis::active`) on the real samples, against
//! independent oracles: each column's bands are exactly the allocations live at its moment
//! (`analysis::live_allocations_at`), stacked without gaps or overlaps on the summary band; the
//! top of every column is the device's allocated total, and the highest is PyTorch's peak
//! (facts.json); the drawn bands are the largest ones; the explorer answers with operators and
//! an allocation's stack.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use shared::analysis::active::{active_timeline, ActiveOptions, ActiveTimeline, Pairs};
use shared::analysis::live_allocations_at;
use shared::explore::{Opened, Request, Response, Session};
use shared::{import, ImportOptions, Trace};
use std::collections::BTreeSet;
use std::path::PathBuf;

fn data(name: &str) -> Vec<u8> {
    std::fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data").join(name)).unwrap()
}

fn fact(sample: &str, key: &str) -> u64 {
    let facts: serde_json::Value = serde_json::from_slice(&data("facts.json")).unwrap();
    facts["samples"][sample][key].as_u64().unwrap()
}

const SAMPLES: [&str; 2] = ["mlp_adam_3steps.pickle", "resnet18_sgd_2steps.pickle"];

fn whole(trace: &Trace, pairs: &Pairs, columns: usize, detail: usize) -> ActiveTimeline {
    let end_s = (trace.end_ns() - trace.start_ns()) as f64 * 1e-9;
    active_timeline(trace, pairs, None, &ActiveOptions { start_s: 0.0, end_s, columns, detail })
}

/// Band indices live in column `c`, bottom first.
fn column(a: &ActiveTimeline, c: usize) -> Vec<usize> {
    let mut live: Vec<usize> = (0..a.bands.len())
        .filter(|&b| {
            let band = &a.bands[b];
            c >= band.first_column as usize && c < band.first_column as usize + band.bottoms.len()
        })
        .collect();
    live.sort_by_key(|&b| a.bands[b].bottoms[c - a.bands[b].first_column as usize]);
    live
}

#[test]
fn every_column_stacks_exactly_what_is_live_at_its_moment() {
    for sample in SAMPLES {
        let trace = import(&data(sample), &ImportOptions::default()).unwrap();
        let device = 0;
        let pairs = Pairs::of(&trace, device);
        let a = whole(&trace, &pairs, 300, usize::MAX);
        assert_eq!(a.summarized, 0, "{sample}: every allocation drawn");
        let start = trace.start_ns();
        let mut checked = 0;
        for c in 0..a.totals.len() {
            let Some(at) = a.moment_events[c] else { continue };
            let at = at as usize;
            assert_eq!(trace.events.device[at], device);
            let t = a.moments_s[c].unwrap();
            assert!((t - trace.events.ts_ns[at].saturating_sub(start) as f64 * 1e-9).abs() < 1e-9);
            let live = column(&a, c);
            // Stacked on the summary without gaps or overlaps, topped by the total.
            let mut bottom = a.summary[c];
            for &b in &live {
                let band = &a.bands[b];
                assert_eq!(band.bottoms[c - band.first_column as usize], bottom, "{sample} column {c}");
                bottom += band.size_bytes;
            }
            assert_eq!(bottom, a.totals[c], "{sample} column {c}: the top is the allocated total");
            assert_eq!(a.totals[c], trace.events.totals_at(at).allocated_bytes, "{sample} column {c}");
            // The same allocations as an independent walk finds live then (made in the trace).
            let drawn: BTreeSet<usize> = live.iter().map(|&b| a.bands[b].event_index as usize).collect();
            let oracle: BTreeSet<usize> =
                live_allocations_at(&trace, at).into_iter().filter(|&i| trace.events.device[i] == device).collect();
            if drawn == oracle {
                checked += 1;
            } else {
                panic!("{sample} column {c}: drawn {} allocations, {} live", drawn.len(), oracle.len());
            }
        }
        assert!(checked > 100, "{sample}: {checked} columns checked");
    }
}

#[test]
fn the_highest_column_is_pytorchs_peak() {
    for sample in SAMPLES {
        let trace = import(&data(sample), &ImportOptions::default()).unwrap();
        let pairs = Pairs::of(&trace, 0);
        for (columns, detail) in [(50, 10), (800, 2000), (1, 1)] {
            let a = whole(&trace, &pairs, columns, detail);
            assert_eq!(a.totals.iter().max().copied(), Some(fact(sample, "max_allocated")), "{sample} {columns} columns");
        }
    }
}

#[test]
fn the_drawn_bands_are_the_largest_and_the_rest_are_summarized() {
    let trace = import(&data("resnet18_sgd_2steps.pickle"), &ImportOptions::default()).unwrap();
    let pairs = Pairs::of(&trace, 0);
    let all = whole(&trace, &pairs, 400, usize::MAX);
    let a = whole(&trace, &pairs, 400, 40);
    assert!(a.bands.len() <= 40 && a.bands.len() >= 30, "{} bands", a.bands.len());
    assert_eq!((a.live, all.live, all.summarized), (all.live, a.summarized + 40, 0));
    let smallest_drawn = a.bands.iter().map(|b| b.size_bytes).min().unwrap();
    let drawn: BTreeSet<u32> = a.bands.iter().map(|b| b.event_index).collect();
    let largest_left = all.bands.iter().filter(|b| !drawn.contains(&b.event_index)).map(|b| b.size_bytes).max().unwrap();
    assert!(smallest_drawn >= largest_left, "{smallest_drawn} < {largest_left}");
    // Folding bands into the summary moves bytes, never the total.
    assert_eq!(a.totals, all.totals);
    for c in 0..a.totals.len() {
        assert!(a.summary[c] >= all.summary[c]);
    }
    // A zoomed window: only what is live in it, the same totals where the columns coincide.
    let end_s = (trace.end_ns() - trace.start_ns()) as f64 * 1e-9;
    let z = active_timeline(&trace, &pairs, None, &ActiveOptions { start_s: end_s * 0.25, end_s: end_s * 0.5, columns: 200, detail: 1000 });
    assert!(z.bands.iter().all(|b| b.alloc_s < end_s * 0.5 && b.free_s.is_none_or(|f| f >= end_s * 0.25)));
    assert!(z.totals.iter().max() <= all.totals.iter().max());
}

#[test]
fn the_explorer_answers_bands_with_operators_and_an_allocation_with_its_stack() {
    let name = "resnet18_sgd_2steps.pickle";
    let (mut session, overview) = match Session::open(name, &data(name), |_| {}).unwrap() {
        Opened::Trace(s, o) => (*s, *o),
        Opened::Sweep(_) => panic!("a sweep"),
    };
    let r = session.answer(&Request::Active { start_s: 0.0, end_s: overview.duration_s, columns: 500, detail: 100 });
    let Response::Active(a) = r else { panic!("{r:?}") };
    assert_eq!(a.totals.iter().max().copied(), Some(overview.summary.peak_allocated_bytes));
    assert!(a.bands.iter().any(|b| b.stack.is_some()), "snapshots record stacks");
    let biggest = a.bands.iter().max_by_key(|b| b.size_bytes).unwrap();
    let r = session.answer(&Request::Allocation { event_index: biggest.event_index as usize });
    let Response::Allocations { allocations, .. } = r else { panic!("{r:?}") };
    assert_eq!(allocations.len(), 1);
    let one = &allocations[0];
    assert_eq!((one.size_bytes, one.free_s.is_some()), (biggest.size_bytes, biggest.free_s.is_some()));
    assert!(!one.stack.is_empty());
    // Not an allocation: a clear error, no panic.
    let r = session.answer(&Request::Allocation { event_index: usize::MAX });
    assert!(matches!(r, Response::Error { .. }), "{r:?}");
}

#[test]
fn any_window_a_request_names_is_answered_without_panic() {
    let trace = import(&data("mlp_adam_3steps.pickle"), &ImportOptions::default()).unwrap();
    let pairs = Pairs::of(&trace, 0);
    for (start_s, end_s) in [(1e300, 1e300), (f64::NAN, f64::NAN), (-5.0, -1.0), (10.0, 2.0), (0.0, f64::MAX), (1e6, 1e7)] {
        let a = active_timeline(&trace, &pairs, None, &ActiveOptions { start_s, end_s, columns: 7, detail: 10 });
        assert_eq!(a.totals.len(), 7, "{start_s}..{end_s}");
        assert!(a.totals.iter().all(|&t| t <= fact("mlp_adam_3steps.pickle", "max_allocated")));
    }
    // A device without events: nothing to pair, nothing drawn.
    let a = active_timeline(&trace, &Pairs::of(&trace, 200), None, &ActiveOptions { start_s: 0.0, end_s: 1.0, columns: 3, detail: 10 });
    assert!(a.bands.is_empty() && a.moments_s.iter().all(Option::is_none));
}

/// The allocations live in a window, by their definition: made before its end, freed at or
/// after its start (or never).
fn live_by_definition(trace: &Trace, pairs: &Pairs, lo: u64, hi: u64) -> Vec<u32> {
    let ts = &trace.events.ts_ns;
    (0..pairs.spans.len() as u32)
        .filter(|&k| {
            let (a, f) = pairs.spans[k as usize];
            ts[a as usize] < hi && (f == u32::MAX || ts[f as usize] >= lo)
        })
        .collect()
}

#[test]
fn the_allocations_live_in_a_window_are_found_without_reading_every_event() {
    for sample in SAMPLES {
        let mut trace = import(&data(sample), &ImportOptions::default()).unwrap();
        for shuffled in [false, true] {
            if shuffled {
                // Allocations out of time order (a trace merged oddly): no binary search then.
                let spans = Pairs::of(&trace, 0).spans;
                let (a, b) = (spans[spans.len() / 3].0 as usize, spans[2 * spans.len() / 3].0 as usize);
                assert!(trace.events.ts_ns[a] < trace.events.ts_ns[b]);
                trace.events.ts_ns.swap(a, b);
            }
            let pairs = Pairs::of(&trace, 0);
            assert!(pairs.spans.len() > 100, "{sample}: {} allocations", pairs.spans.len());
            let ts = &trace.events.ts_ns;
            let (first, last) = (trace.start_ns(), trace.end_ns());
            // Windows at event times (edges exact), between them, empty, and past both ends.
            let mut edges: Vec<u64> = (0..ts.len()).step_by(ts.len() / 40 + 1).map(|i| ts[i]).collect();
            edges.extend([0, first, first + 1, last - 1, last, last + 1, u64::MAX]);
            for &lo in &edges {
                for &hi in &edges {
                    let hi = hi.max(lo);
                    assert_eq!(
                        pairs.live_in(lo, hi),
                        live_by_definition(&trace, &pairs, lo, hi),
                        "{sample} {lo}..{hi} shuffled={shuffled}"
                    );
                }
            }
        }
    }
}

/// The columns' moments from the timeline index are the ones a walk over every event of the
/// window finds, on both samples and on the two merged as ranks (two devices interleaved),
/// for windows at every scale, past the ends, and for 1 to 1 500 columns.
#[test]
fn the_index_finds_the_moments_a_walk_over_the_window_finds() {
    use shared::analysis::active::column_moments;
    use shared::analysis::timeline_index::TimelineIndex;
    use shared::merge::{merge_with, MergeInput, MergeOptions};
    let samples: Vec<Trace> = SAMPLES.iter().map(|s| import(&data(s), &ImportOptions::default()).unwrap()).collect();
    let inputs = samples.iter().enumerate().map(|(k, t)| MergeInput { trace: t.clone(), rank: k as u32, label: SAMPLES[k].into() });
    let merged = merge_with(inputs.collect(), &MergeOptions { allow_disjoint: true, ..MergeOptions::default() }).unwrap();
    assert!(merged.events.device.iter().collect::<BTreeSet<_>>().len() >= 2, "two devices interleaved");
    let mut compared = 0;
    for trace in samples.iter().chain([&merged]) {
        let index = TimelineIndex::new(trace);
        let (start, end) = (trace.start_ns(), trace.end_ns());
        let span = end - start;
        let mut windows = vec![(start, end + 1), (0, u64::MAX), (end + 10, end + 20), (start, start + 1)];
        for k in 1..40u64 {
            let width = span / (k * k) + 1;
            let a = start + (span / 41) * k;
            windows.push((a, a.saturating_add(width)));
            windows.push((a.saturating_sub(width / 3), a + width / 7 + 1));
        }
        let devices: BTreeSet<u8> = trace.events.device.iter().copied().collect();
        for &device in &devices {
            for &window in &windows {
                for columns in [1, 7, 300, 1500] {
                    let walked = column_moments(trace, device, window, columns);
                    assert_eq!(
                        index.column_moments(trace, device, window, columns).as_ref(),
                        Some(&walked),
                        "device {device} {window:?} {columns}"
                    );
                    compared += 1;
                }
            }
        }
    }
    assert!(compared > 900, "{compared} windows compared");
}
