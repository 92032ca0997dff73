//! The timeline at 4 million events: the full scan against the multi-resolution index, for the
//! whole trace and for zoomed and panned windows as the viewer asks them (2 000 buckets).
//! Both must give the same points; prints per-window time (median, p95, max) and the index's
//! build time and size. Then the Active Memory Timeline over the same windows (1 500 columns,
//! every allocation live at a column's moment as a band): pairing once, then time per window, its columns'
//! moments walked over the window's events and from the index (both must give the same view).
//!
//!     cargo bench -p shared --bench timeline

#![allow(clippy::unwrap_used, clippy::expect_used)] // benches fail loudly by design

use shared::analysis::timeline_index::TimelineIndex;
use shared::analysis::{timeline, TimelineOptions};
use shared::{import, ImportOptions};
use std::path::Path;
use std::time::Instant;

mod support;
use support::replicate;

fn stats(mut ms: Vec<f64>) -> String {
    ms.sort_by(f64::total_cmp);
    let p = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
    format!("median {:.2} ms, p95 {:.2} ms, max {:.2} ms", p(0.5), p(0.95), p(1.0))
}

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data");
    let base = import(&std::fs::read(dir.join("resnet18_sgd_2steps.pickle")).unwrap(), &ImportOptions::default()).unwrap();
    let big = replicate(&base, 4_000_000usize.div_ceil(base.events.len()));
    let started = Instant::now();
    let index = TimelineIndex::new(&big);
    println!(
        "{} events: index built in {:.0} ms, {:.1} MiB ({:.2} B/event)",
        big.events.len(),
        started.elapsed().as_secs_f64() * 1e3,
        index.heap_bytes() as f64 / (1 << 20) as f64,
        index.heap_bytes() as f64 / big.events.len() as f64
    );
    let span_s = (big.events.ts_ns.last().unwrap() - big.start_ns()) as f64 * 1e-9;
    // The viewer's gestures: the whole trace, then zooming in by halves around a point and
    // panning at each zoom level.
    let mut windows = vec![(0.0, span_s)];
    let mut width = span_s;
    while width > span_s / 4096.0 {
        width /= 2.0;
        for k in 0..3 {
            let a = (span_s * 0.37 - width / 2.0 + k as f64 * width / 5.0).max(0.0);
            windows.push((a, a + width));
        }
    }
    let (mut scan_ms, mut index_ms) = (Vec::new(), Vec::new());
    for &(a, b) in &windows {
        let mut options = TimelineOptions::default().with_buckets(2000).with_window(a, b);
        options.device = Some(0); // as the viewer asks: its peak device, found once
        let t = Instant::now();
        let slow = timeline(&big, &options);
        scan_ms.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let fast = index.timeline(&big, &options);
        index_ms.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(fast, slow, "window {a}..{b}");
    }
    println!("{} windows of 2000 buckets, same points from both:", windows.len());
    println!("  full scan:  {} (whole trace {:.1} ms)", stats(scan_ms.clone()), scan_ms[0]);
    println!("  index:      {} (whole trace {:.2} ms)", stats(index_ms.clone()), index_ms[0]);
    active(&big, &index, &windows);
}

fn active(big: &shared::Trace, index: &TimelineIndex, windows: &[(f64, f64)]) {
    use shared::analysis::active::{active_timeline, ActiveOptions, Labels, Pairs};
    let t = Instant::now();
    let pairs = Pairs::of(big, 0);
    println!("active memory: {} allocations paired in {:.0} ms", pairs.spans.len(), t.elapsed().as_secs_f64() * 1e3);
    let (mut scan_ms, mut ms) = (Vec::new(), Vec::new());
    let mut bands = 0;
    for &(a, b) in windows {
        let options = ActiveOptions { start_s: a, end_s: b, columns: 1500 };
        let t = Instant::now();
        let scanned = active_timeline(big, &pairs, None, &Labels::default(), &options);
        scan_ms.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let view = active_timeline(big, &pairs, Some(index), &Labels::default(), &options);
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(view, scanned, "window {a}..{b}: the index's column moments are the walk's");
        bands = bands.max(view.bands.len());
    }
    println!("  {} windows, up to {bands} bands, the same from both:", windows.len());
    println!("    moments walked:   {} (whole trace {:.1} ms)", stats(scan_ms.clone()), scan_ms[0]);
    println!("    moments indexed:  {} (whole trace {:.1} ms)", stats(ms.clone()), ms[0]);
}
