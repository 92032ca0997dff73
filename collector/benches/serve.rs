//! Load on `collector serve` over loopback: 16 concurrent trace requests of a small model (CPU)
//! while readers hammer the list, a download and health, bounded in count and time.
//! Reports throughput, latency percentiles per route, errors and the server's memory.
//!
//! `cargo bench -p collector --bench serve` (env: MEMORY_TRACER_SERVE_BENCH_TRACES=16,
//! MEMORY_TRACER_SERVE_BENCH_READERS=8, MEMORY_TRACER_SERVE_BENCH_JOBS=1 jobs per device).
//! Writes `target/bench/serve.json`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches fail loudly by design

#[path = "../tests/server/mod.rs"]
mod server;

use serde_json::json;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[derive(Default)]
struct Samples {
    ms: Vec<f64>,
    errors: u64,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let traces = env_usize("MEMORY_TRACER_SERVE_BENCH_TRACES", 16);
    let readers = env_usize("MEMORY_TRACER_SERVE_BENCH_READERS", 8);
    let jobs = env_usize("MEMORY_TRACER_SERVE_BENCH_JOBS", 1).to_string();
    let max_reads = 200_000u64;
    let time_limit = Duration::from_secs(300);

    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("serve-bench");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let s = server::Server::start(&dir, &["--jobs-per-device", &jobs, "--max-queue", "64"]);
    let snapshot =
        std::fs::read(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/resnet18_sgd_2steps.pickle")).unwrap();
    let (code, up) = s.post_bytes("/api/trace/upload?filename=resnet18.pickle", &snapshot);
    assert_eq!(code, 200, "{up}");
    let (code, e) = s.post_json("/api/trace/export", &json!({"trace_id": up["trace_id"], "format": "speedscope"}));
    assert_eq!(code, 200, "{e}");
    let download = e["download_url"].as_str().unwrap().to_owned();
    let download_bytes = e["file_size_bytes"].as_u64().unwrap();
    let (rss_idle, _) = s.memory_kib();

    let samples: Mutex<BTreeMap<&'static str, Samples>> = Mutex::new(BTreeMap::new());
    let record = |route: &'static str, ms: f64, ok: bool| {
        let mut m = samples.lock().unwrap();
        let e = m.entry(route).or_default();
        e.ms.push(ms);
        if !ok {
            e.errors += 1;
        }
    };
    let writers_done = AtomicBool::new(false);
    let reads = AtomicU64::new(0);
    let rss_peak = AtomicU64::new(rss_idle);
    let started = Instant::now();
    let mut trace_wall = 0.0;
    std::thread::scope(|sc| {
        sc.spawn(|| {
            while !writers_done.load(Ordering::Relaxed) {
                rss_peak.fetch_max(s.memory_kib().0, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        for r in 0..readers {
            let (s, record, writers_done, reads, download) = (&s, &record, &writers_done, &reads, &download);
            sc.spawn(move || {
                let agent = server::agent();
                let mut i = r;
                while !writers_done.load(Ordering::Relaxed)
                    && reads.fetch_add(1, Ordering::Relaxed) < max_reads
                    && started.elapsed() < time_limit
                {
                    let (route, path): (&'static str, &str) = match i % 3 {
                        0 => ("GET /api/trace/list", "/api/trace/list"),
                        1 => ("GET /api/trace/download", download.as_str()),
                        _ => ("GET /api/health", "/api/health"),
                    };
                    i += 1;
                    let t0 = Instant::now();
                    let ok = match agent.get(s.url(path)).call() {
                        Ok(resp) => {
                            let status = resp.status().as_u16();
                            let (_, body) = server::text(resp);
                            status == 200 && (route != "GET /api/trace/download" || body.len() as u64 == download_bytes)
                        }
                        Err(_) => false,
                    };
                    record(route, t0.elapsed().as_secs_f64() * 1e3, ok);
                }
            });
        }
        let writers: Vec<_> = (0..traces)
            .map(|_| {
                let (s, record) = (&s, &record);
                sc.spawn(move || {
                    let t0 = Instant::now();
                    let (code, r) = s.post_json(
                        "/api/trace/memory",
                        &json!({"model_name": "mlp", "input_shape": [16, 784], "batch_size": 16, "iterations": 2}),
                    );
                    let ok = code == 200 && r["trace_id"].is_string();
                    if !ok {
                        eprintln!("trace request failed: {code} {r}");
                    }
                    record("POST /api/trace/memory", t0.elapsed().as_secs_f64() * 1e3, ok);
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        trace_wall = started.elapsed().as_secs_f64();
        writers_done.store(true, Ordering::Relaxed);
    });
    let (_, hwm) = s.memory_kib();
    let (code, list) = s.get_json("/api/trace/list");
    assert_eq!(code, 200);
    let stored = list["count"].as_u64().unwrap();

    let run = Run { traces, readers, jobs, wall_s: trace_wall, rss_idle, rss_peak: rss_peak.load(Ordering::Relaxed), hwm, stored };
    let total_errors = report(samples.into_inner().unwrap(), &run);
    assert_eq!(total_errors, 0, "requests failed under load");
    assert_eq!(stored, traces as u64 + 1);
}

/// What one load run measured besides the per-route samples.
struct Run {
    traces: usize,
    readers: usize,
    jobs: String,
    wall_s: f64,
    rss_idle: u64,
    rss_peak: u64,
    hwm: u64,
    stored: u64,
}

/// Prints the table and the server's memory, writes `target/bench/serve.json`; the errors.
fn report(samples: BTreeMap<&'static str, Samples>, run: &Run) -> u64 {
    let mut out = serde_json::Map::new();
    println!(
        "collector serve under load: {} trace requests (mlp, CPU, {} job(s) at a time) + {} readers, {:.1} s",
        run.traces, run.jobs, run.readers, run.wall_s
    );
    println!("{:<26} {:>8} {:>10} {:>9} {:>9} {:>9} {:>7}", "route", "requests", "req/s", "p50 ms", "p99 ms", "max ms", "errors");
    let mut total_errors = 0;
    for (route, mut s) in samples {
        s.ms.sort_by(f64::total_cmp);
        let (p50, p99, max) = (percentile(&s.ms, 0.5), percentile(&s.ms, 0.99), s.ms.last().copied().unwrap_or(f64::NAN));
        let rate = s.ms.len() as f64 / run.wall_s;
        println!("{route:<26} {:>8} {rate:>10.1} {p50:>9.2} {p99:>9.2} {max:>9.2} {:>7}", s.ms.len(), s.errors);
        total_errors += s.errors;
        out.insert(
            route.into(),
            json!({"requests": s.ms.len(), "per_s": rate, "p50_ms": p50, "p99_ms": p99, "max_ms": max, "errors": s.errors}),
        );
    }
    println!("traces stored: {} (expected {}); errors: {total_errors}", run.stored, run.traces + 1);
    println!(
        "server memory: {:.1} MiB idle, {:.1} MiB highest sampled, {:.1} MiB VmHWM",
        run.rss_idle as f64 / 1024.0,
        run.rss_peak as f64 / 1024.0,
        run.hwm as f64 / 1024.0
    );
    out.insert("traces".into(), json!(run.traces));
    out.insert("readers".into(), json!(run.readers));
    out.insert("jobs_per_device".into(), json!(run.jobs));
    out.insert("wall_s".into(), json!(run.wall_s));
    out.insert("traces_per_s".into(), json!(run.traces as f64 / run.wall_s));
    out.insert("errors".into(), json!(total_errors));
    out.insert("server_rss_idle_kib".into(), json!(run.rss_idle));
    out.insert("server_rss_peak_kib".into(), json!(run.rss_peak));
    out.insert("server_vmhwm_kib".into(), json!(run.hwm));
    let dest = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    std::fs::create_dir_all(&dest).unwrap();
    std::fs::write(dest.join("serve.json"), serde_json::to_string_pretty(&out).unwrap()).unwrap();
    total_errors
}
