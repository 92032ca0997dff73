//! Import and analysis benchmarks on real samples (and leaks, merging, one rank out, diff and
//! advice at a million events) (run with `cargo bench -p collector` or
//! `cargo xtask bench`). Prints throughput, bytes held per event and the process's peak memory.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches fail loudly by design

use shared::analysis::{summary, timeline, TimelineOptions};
use shared::{import, ImportOptions};
use std::path::Path;
use std::time::{Duration, Instant};

#[path = "../../shared/benches/support/mod.rs"]
mod support;
use support::replicate;

fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Runs `f` until at least `min` has passed; returns the mean time per run.
fn time<T>(min: Duration, mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut runs = 0u32;
    let start = Instant::now();
    let mut last = f();
    runs += 1;
    while start.elapsed() < min {
        last = f();
        runs += 1;
    }
    (start.elapsed() / runs, last)
}

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data");
    let rss_start = peak_rss_bytes().unwrap_or(0);
    println!("sample                          size      import      MB/s    events/s   B/event(cols)  B/event(all)");
    for name in ["resnet18_sgd_2steps.pickle", "mlp_adam_3steps.pickle", "convnet_profiler_trace.json", "dftracer_sample.pfw.gz"] {
        let raw = std::fs::read(dir.join(name)).expect("sample exists");
        let (dt, trace) = time(Duration::from_secs(1), || import(&raw, &ImportOptions::default()).expect("imports"));
        let fp = trace.memory_footprint();
        let secs = dt.as_secs_f64();
        println!(
            "{name:<30} {:>7.1} KB {:>8.2} ms {:>8.1} {:>11.0} {:>14.1} {:>13.1}",
            raw.len() as f64 / 1e3,
            secs * 1e3,
            raw.len() as f64 / 1e6 / secs,
            trace.events.len() as f64 / secs,
            fp.event_bytes_per_event(),
            fp.total_bytes_per_event(),
        );
    }
    println!("peak RSS while importing the samples: {:.1} MiB", peak_rss_bytes().unwrap_or(0) as f64 / (1 << 20) as f64);

    // Scale: one million events (the resnet18 snapshot's events repeated), analysed.
    let raw = std::fs::read(dir.join("resnet18_sgd_2steps.pickle")).expect("sample exists");
    let base = import(&raw, &ImportOptions::default()).expect("imports");
    let copies = 1_000_000usize.div_ceil(base.events.len());
    let before = peak_rss_bytes().unwrap_or(0);
    let big = replicate(&base, copies);
    let fp = big.memory_footprint();
    println!(
        "\n{} events: columns {:.1} B/event, columns + totals index {:.2} B/event, whole trace {:.1} B/event",
        big.events.len(),
        fp.event_columns as f64 / fp.events as f64,
        fp.event_bytes_per_event(),
        fp.total_bytes_per_event()
    );
    let (dt, s) = time(Duration::from_secs(1), || summary(&big));
    println!("summary over {} events: {:.1} ms (peak {} B)", big.events.len(), dt.as_secs_f64() * 1e3, s.peak_allocated_bytes);
    let (dt, tl) = time(Duration::from_secs(1), || timeline(&big, &TimelineOptions::default()));
    println!("timeline decimated to {} points: {:.1} ms", tl.len(), dt.as_secs_f64() * 1e3);
    let (dt, t) = time(Duration::from_secs(1), || big.events.totals_at(big.events.len() / 2 + 17));
    println!("random access to one event's totals: {:.2} µs ({} B allocated)", dt.as_secs_f64() * 1e6, t.allocated_bytes);
    let mut out = Vec::new();
    let (dt, _) = time(Duration::from_secs(1), || {
        out.clear();
        shared::export::export(&big, shared::export::ExportFormat::Native, &mut out).expect("exports")
    });
    let (dt2, back) = time(Duration::from_secs(1), || import(&out, &ImportOptions::default()).expect("imports"));
    println!(
        "native format: {:.1} MB written in {:.0} ms, read back in {:.0} ms ({:.0} events/s)",
        out.len() as f64 / 1e6,
        dt.as_secs_f64() * 1e3,
        dt2.as_secs_f64() * 1e3,
        back.events.len() as f64 / dt2.as_secs_f64()
    );
    // Leaks and merging at scale: the million events as 8 iterations, and as 4 ranks.
    let mut iterated = big.clone();
    let span = iterated.events.ts_ns.last().copied().unwrap_or(0) + 1;
    iterated.iterations = (0..8u32)
        .map(|k| shared::model::IterationSpan { index: k, start_ns: span * u64::from(k) / 8, end_ns: span * u64::from(k + 1) / 8 })
        .collect();
    let (dt, r) = time(Duration::from_secs(1), || shared::analysis::leaks::leaks(&iterated, 10));
    println!(
        "leaks over {} events and {} iterations: {:.1} ms ({})",
        iterated.events.len(),
        r.iterations,
        dt.as_secs_f64() * 1e3,
        r.verdict
    );
    let (dt, merged) = time(Duration::from_secs(1), || {
        let inputs =
            (0..4u32).map(|rank| shared::ranks::merge::MergeInput { trace: big.clone(), rank, label: format!("rank{rank}") }).collect();
        shared::ranks::merge::merge(inputs).expect("merges")
    });
    println!(
        "merge of 4 ranks × {} events: {:.0} ms including 4 clones ({:.1} B/event held)",
        big.events.len(),
        dt.as_secs_f64() * 1e3,
        merged.memory_footprint().total_bytes_per_event()
    );
    let (dt, spans) = time(Duration::from_secs(1), || shared::analysis::iterations::repeating_spans(&big));
    println!(
        "iterations from repeating allocation sizes over {} events: {:.1} ms ({} found)",
        big.events.len(),
        dt.as_secs_f64() * 1e3,
        spans.len()
    );
    let (dt, one) = time(Duration::from_secs(1), || shared::ranks::rank_trace(&merged, 2).expect("rank 2"));
    println!("one rank out of the 4-rank merge: {:.0} ms ({} events)", dt.as_secs_f64() * 1e3, one.events.len());
    let (dt, d) = time(Duration::from_secs(1), || shared::analysis::diff::diff(&big, &iterated));
    println!(
        "diff of two {}-event traces: {:.0} ms ({} layers, {} + {} curve points)",
        big.events.len(),
        dt.as_secs_f64() * 1e3,
        d.layers.len(),
        d.curves.a.len(),
        d.curves.b.len()
    );
    let (dt, a) =
        time(Duration::from_secs(1), || shared::analysis::advice::advise(&iterated, &shared::analysis::advice::AdviceOptions::default()));
    println!(
        "advice on {} events (a snapshot: no operators): {:.0} ms ({} suggestions)",
        iterated.events.len(),
        dt.as_secs_f64() * 1e3,
        a.suggestions.len()
    );
    let oom_raw = std::fs::read(dir.join("oom_mlp.pickle")).expect("sample exists");
    let oom_trace = import(&oom_raw, &ImportOptions::default()).expect("imports");
    let (dt, o) = time(Duration::from_secs(1), || shared::analysis::oom::oom(&oom_trace, 10));
    println!(
        "out-of-memory explanation of oom_mlp.pickle: {:.2} ms ({} B asked)",
        dt.as_secs_f64() * 1e3,
        o.map_or(0, |o| o.requested_bytes)
    );
    println!(
        "peak RSS: {:.1} MiB at start, {:.1} MiB before the 1M-event test, {:.1} MiB at end",
        rss_start as f64 / (1 << 20) as f64,
        before as f64 / (1 << 20) as f64,
        peak_rss_bytes().unwrap_or(0) as f64 / (1 << 20) as f64
    );
}
