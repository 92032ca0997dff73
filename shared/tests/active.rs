//! The Active Memory Timeline (`shared::analysis::active`) on the real samples, against
//! independent oracles: each column's bands are exactly the allocations live at its moment
//! (`analysis::live_allocations_at`), stacked without gaps or overlaps on the memory from
//! before the trace (and only that is grey); the top of every column is the device's allocated
//! total, and the highest is PyTorch's peak (facts.json); every allocation live in a window is
//! a band or counted as between two moments; the band found under a point is the one drawn
//! there; the explorer answers with operators and an allocation's stack.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use shared::analysis::active::{active_timeline, ActiveOptions, ActiveTimeline, HoverIndex, Labels, Pairs};
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

fn whole(trace: &Trace, pairs: &Pairs, columns: usize) -> ActiveTimeline {
    let end_s = (trace.end_ns() - trace.start_ns()) as f64 * 1e-9;
    window(trace, pairs, (0.0, end_s), columns)
}

fn window(trace: &Trace, pairs: &Pairs, (start_s, end_s): (f64, f64), columns: usize) -> ActiveTimeline {
    active_timeline(trace, pairs, None, &Labels::default(), &ActiveOptions { start_s, end_s, columns })
}

/// Band indices drawn in column `c`, bottom first.
fn column(a: &ActiveTimeline, c: usize) -> Vec<usize> {
    let bands = &a.bands;
    let mut live: Vec<usize> = (0..bands.len()).filter(|&b| bands.bottom_at(b, c).is_some()).collect();
    live.sort_by_key(|&b| bands.bottom_at(b, c));
    live
}

/// Windows at several scales: the whole trace, a half, a tenth, a hundredth.
fn windows(trace: &Trace) -> Vec<(f64, f64)> {
    let end_s = (trace.end_ns() - trace.start_ns()) as f64 * 1e-9;
    vec![(0.0, end_s), (end_s * 0.25, end_s * 0.75), (end_s * 0.4, end_s * 0.5), (end_s * 0.61, end_s * 0.62)]
}

#[test]
fn every_column_stacks_exactly_what_is_live_at_its_moment() {
    for sample in SAMPLES {
        let trace = import(&data(sample), &ImportOptions::default()).unwrap();
        let device = 0;
        let pairs = Pairs::of(&trace, device);
        let start = trace.start_ns();
        let mut checked = 0;
        for (w, columns) in windows(&trace).into_iter().zip([300, 97, 1000, 40]) {
            let a = window(&trace, &pairs, w, columns);
            assert!(a.bands.is_consistent(columns), "{sample} {w:?}");
            for c in 0..a.totals.len() {
                let Some(at) = a.moment_events[c] else { continue };
                let at = at as usize;
                assert_eq!(trace.events.device[at], device);
                let t = a.moments_s[c].unwrap();
                assert!((t - trace.events.ts_ns[at].saturating_sub(start) as f64 * 1e-9).abs() < 1e-9);
                let live = column(&a, c);
                // Stacked on the memory from before the trace without gaps or overlaps, topped
                // by the total.
                let mut bottom = a.before_trace[c];
                for &b in &live {
                    assert_eq!(a.bands.bottom_at(b, c), Some(bottom), "{sample} column {c}");
                    bottom += a.bands.size_bytes[b];
                }
                assert_eq!(bottom, a.totals[c], "{sample} column {c}: the top is the allocated total");
                assert_eq!(a.totals[c], trace.events.totals_at(at).allocated_bytes, "{sample} column {c}");
                // Every allocation an independent walk finds live then (made in the trace) has
                // its own band; the grey band holds only what no allocation event made.
                let drawn: BTreeSet<usize> = live.iter().map(|&b| a.bands.event_index[b] as usize).collect();
                let oracle: BTreeSet<usize> =
                    live_allocations_at(&trace, at).into_iter().filter(|&i| trace.events.device[i] == device).collect();
                assert!(drawn == oracle, "{sample} column {c}: drawn {} allocations, {} live", drawn.len(), oracle.len());
                let oracle_bytes: u64 = oracle.iter().map(|&i| trace.events.size_bytes[i]).sum();
                assert_eq!(a.before_trace[c], a.totals[c] - oracle_bytes, "{sample} column {c}");
                checked += 1;
            }
        }
        assert!(checked > 400, "{sample}: {checked} columns checked");
    }
}

#[test]
fn every_allocation_live_in_the_window_is_a_band_or_between_two_moments() {
    for sample in SAMPLES {
        let trace = import(&data(sample), &ImportOptions::default()).unwrap();
        let pairs = Pairs::of(&trace, 0);
        let start = trace.start_ns();
        for (w, columns) in windows(&trace).into_iter().zip([50, 800, 20_000, 3]) {
            let a = window(&trace, &pairs, w, columns);
            // The bands are exactly the allocations live at some column's moment, once each.
            let mut at_moments = BTreeSet::new();
            for m in a.moment_events.iter().flatten() {
                at_moments.extend(live_allocations_at(&trace, *m as usize).into_iter().filter(|&i| trace.events.device[i] == 0));
            }
            let drawn: BTreeSet<usize> = a.bands.event_index.iter().map(|&e| e as usize).collect();
            assert_eq!(drawn.len(), a.bands.len(), "{sample} {w:?}: one band per allocation");
            assert!(drawn == at_moments, "{sample} {w:?}: {} drawn, {} live at the moments", drawn.len(), at_moments.len());
            // The others live in the window are counted as between two moments.
            let to_ns = |s: f64| start + (s * 1e9) as u64;
            let live: BTreeSet<usize> = pairs.live_in(to_ns(w.0), to_ns(w.1)).iter().map(|&k| pairs.spans[k as usize].0 as usize).collect();
            assert_eq!(a.live, live.len(), "{sample} {w:?}");
            assert_eq!(a.between, live.difference(&drawn).count(), "{sample} {w:?}");
            // A band's runs are its longest stretches at one bottom.
            for b in 0..a.bands.len() {
                let runs: Vec<usize> = a.bands.runs(b).collect();
                assert!(runs.windows(2).all(|r| a.bands.run_bottom[r[0]] != a.bands.run_bottom[r[1]]), "{sample} band {b}");
            }
        }
        // Enough columns show every allocation of the trace.
        let a = whole(&trace, &pairs, 20_000);
        let wide = whole(&trace, &pairs, 200);
        assert!(a.bands.len() > wide.bands.len() && a.bands.len() + a.between == pairs.spans.len(), "{sample}");
    }
}

#[test]
fn the_highest_column_is_pytorchs_peak() {
    for sample in SAMPLES {
        let trace = import(&data(sample), &ImportOptions::default()).unwrap();
        let pairs = Pairs::of(&trace, 0);
        for columns in [50, 800, 1] {
            let a = whole(&trace, &pairs, columns);
            assert_eq!(a.totals.iter().max().copied(), Some(fact(sample, "max_allocated")), "{sample} {columns} columns");
        }
    }
}

#[test]
fn the_band_under_a_point_is_the_one_drawn_there() {
    let trace = import(&data("resnet18_sgd_2steps.pickle"), &ImportOptions::default()).unwrap();
    let pairs = Pairs::of(&trace, 0);
    for (w, columns) in windows(&trace).into_iter().zip([700, 300, 120, 60]) {
        let a = window(&trace, &pairs, w, columns);
        let index = HoverIndex::new(&a.bands);
        let top = a.totals.iter().copied().max().unwrap_or(0) as f64;
        let mut hits = 0;
        for c in (0..columns).step_by(3) {
            for k in 0..60 {
                let bytes = top * k as f64 / 59.0;
                let brute = (0..a.bands.len()).find(|&b| {
                    a.bands.bottom_at(b, c).is_some_and(|bottom| bytes >= bottom as f64 && bytes < (bottom + a.bands.size_bytes[b]) as f64)
                });
                assert_eq!(index.band_at(&a.bands, c, bytes), brute, "column {c}, {bytes} bytes");
                hits += usize::from(brute.is_some());
            }
        }
        assert!(hits > 100, "{w:?}: {hits} points over a band");
    }
}

#[test]
fn the_explorer_answers_bands_with_operators_and_an_allocation_with_its_stack() {
    let name = "resnet18_sgd_2steps.pickle";
    let (mut session, overview) = match Session::open(name, &data(name), |_| {}).unwrap() {
        Opened::Trace(s, o) => (*s, *o),
        Opened::Sweep(_) => panic!("a sweep"),
    };
    let r = session.answer(&Request::Active { start_s: 0.0, end_s: overview.duration_s, columns: 500 });
    let Response::Active(a) = r else { panic!("{r:?}") };
    assert_eq!(a.totals.iter().max().copied(), Some(overview.summary.peak_allocated_bytes));
    let bands = &a.bands;
    assert!((0..bands.len()).any(|b| bands.band(b).stack.is_some()), "snapshots record stacks");
    assert!((0..bands.len()).any(|b| bands.band(b).category.is_some()), "categorised");
    let biggest = (0..bands.len()).max_by_key(|&b| bands.size_bytes[b]).unwrap();
    let band = bands.band(biggest);
    let r = session.answer(&Request::Allocation { event_index: band.event_index as usize });
    let Response::Allocations { allocations, .. } = r else { panic!("{r:?}") };
    assert_eq!(allocations.len(), 1);
    let one = &allocations[0];
    assert_eq!((one.size_bytes, one.free_s.is_some(), one.layer.as_deref()), (band.size_bytes, band.free_s.is_some(), band.layer));
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
        let a = window(&trace, &pairs, (start_s, end_s), 7);
        assert_eq!(a.totals.len(), 7, "{start_s}..{end_s}");
        assert!(a.totals.iter().all(|&t| t <= fact("mlp_adam_3steps.pickle", "max_allocated")));
    }
    // A device without events: nothing to pair, nothing drawn.
    let a = window(&trace, &Pairs::of(&trace, 200), (0.0, 1.0), 3);
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
    use shared::ranks::merge::{merge_with, MergeInput, MergeOptions};
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
