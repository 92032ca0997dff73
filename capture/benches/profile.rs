//! Graph-profile benchmark (`cargo bench -p collector --bench profile`, or `cargo xtask bench`):
//! traces a ResNet-50 training run on the CPU, or reads the trace named by
//! `MEMORY_TRACER_BENCH_TRACE`, then times `graph_profile`, `advise` and `collector analyze` (CSV, JSON
//! and charts) and prints the process's peak memory.

#![allow(clippy::unwrap_used, clippy::expect_used)] // benches fail loudly by design

use shared::analysis::profile::graph_profile;
use std::time::{Duration, Instant};

fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb: u64 = status.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()).unwrap_or(0);
    kb * 1024
}

fn main() {
    let trace = match std::env::var_os("MEMORY_TRACER_BENCH_TRACE") {
        Some(path) => traceio::files::load_trace(path.as_ref(), &shared::ImportOptions::default()).unwrap(),
        None => trace_resnet50(),
    };
    println!("trace: {} ops, {} tensor refs, {} memory events", trace.ops.len(), trace.tensors.len(), trace.events.len());
    let rss_before = peak_rss_bytes();
    let mut runs = 0u32;
    let start = Instant::now();
    let mut profile = graph_profile(&trace).unwrap();
    runs += 1;
    while start.elapsed() < Duration::from_secs(2) {
        profile = graph_profile(&trace).unwrap();
        runs += 1;
    }
    let per = start.elapsed() / runs;
    println!(
        "graph_profile: {:.2} ms per run ({runs} runs), {} nodes per iteration, {} activations, {:.0} ns per op",
        per.as_secs_f64() * 1e3,
        profile.nodes.len(),
        profile.activations.len(),
        per.as_nanos() as f64 / trace.ops.len().max(1) as f64
    );
    let start = Instant::now();
    let advice =
        shared::analysis::advice::advise(&trace, &shared::analysis::advice::AdviceOptions { budget_bytes: Some(1), ..Default::default() });
    println!(
        "advise (budget out of reach: every checkpoint candidate replayed): {:.1} ms, {} suggestions, {} candidates",
        start.elapsed().as_secs_f64() * 1e3,
        advice.suggestions.len(),
        advice.checkpoint_candidates.len()
    );
    let dir = std::env::temp_dir().join(format!("mt-bench-profile-{}", std::process::id()));
    let start = Instant::now();
    let a = traceio::folders::analyze(&trace, &dir, "bench").unwrap();
    println!("analyze (profile, 5 files, 2 charts as PNG and SVG): {:.1} ms, {} files", start.elapsed().as_secs_f64() * 1e3, a.files.len());
    let _ = std::fs::remove_dir_all(&dir);
    println!(
        "peak RSS: {:.1} MiB (after loading the trace: {:.1} MiB)",
        peak_rss_bytes() as f64 / 1048576.0,
        rss_before as f64 / 1048576.0
    );
}

fn trace_resnet50() -> shared::Trace {
    let mut o = capture::run::RunOptions::new("resnet50");
    o.device = capture::run::DeviceChoice::Cpu;
    o.input_shape = Some(vec![2, 3, 64, 64]);
    o.iterations = 3;
    let start = Instant::now();
    let t = capture::run::trace_model(&o, &mut |_| {}).unwrap();
    println!("traced resnet50 (2x3x64x64, 3 iterations, CPU) in {:.1} s", start.elapsed().as_secs_f64());
    t
}
