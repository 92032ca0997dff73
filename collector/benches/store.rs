//! The trace store on disk against the store in a bucket (SeaweedFS on loopback, started here):
//! what an upload (a 466 KB snapshot, and a 20 MB trace sent as a multipart upload), a listing
//! of the store, a download (warm on the server that stored it; cold on a second replica, which
//! reads it from the bucket) and a delete cost through `collector serve`'s API. Each round
//! starts fresh servers; the table gives, per operation, the median of the rounds' medians and
//! the range of the rounds' medians.
//!
//! `cargo bench -p collector --bench store` (env: MEMORY_TRACER_STORE_BENCH_ROUNDS=5,
//! MEMORY_TRACER_STORE_BENCH_TRACES=20). Needs SeaweedFS's `weed` (as `tests/bucket.rs` does).
//! Writes `target/bench/store.json`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // benches fail loudly by design

#[path = "../tests/seaweed/mod.rs"]
mod seaweed;
#[path = "../tests/server/mod.rs"]
mod server;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Milliseconds of `f`.
fn timed(f: impl FnOnce()) -> f64 {
    let t0 = Instant::now();
    f();
    t0.elapsed().as_secs_f64() * 1e3
}

/// One round on one backend: each operation's per-request milliseconds.
fn round(backend: &str, dir: &Path, round: usize, traces: usize, small: &[u8], big: &[u8]) -> BTreeMap<&'static str, Vec<f64>> {
    let mut ms: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
    let (a, b) = if backend == "disk" {
        (server::Server::start(&dir.join(format!("disk-{round}")), &[]), None)
    } else {
        let bucket = seaweed::bucket(&format!("bench-{round}"));
        let env = seaweed::env_for(&seaweed::weed().s3);
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let url = format!("s3://{bucket}/traces");
        let start = |name: &str| {
            server::Server::start_env(env!("CARGO_BIN_EXE_collector"), &dir.join(format!("{name}-{round}")), &["--store", &url], &env)
        };
        (start("a"), Some(start("b")))
    };
    let mut ids = Vec::new();
    for _ in 0..traces {
        let mut id = String::new();
        ms.entry("upload 466 KB").or_default().push(timed(|| {
            let (code, t) = a.post_bytes("/api/trace/upload?filename=resnet18.pickle", small);
            assert_eq!(code, 200, "{t}");
            id = t["trace_id"].as_str().unwrap().to_owned();
        }));
        ids.push(id);
    }
    for _ in 0..3 {
        ms.entry("upload 20 MB").or_default().push(timed(|| {
            let (code, t) = a.post_bytes("/api/trace/upload?filename=big.mtrace.json", big);
            assert_eq!(code, 200, "{t}");
        }));
    }
    for _ in 0..traces {
        ms.entry("list").or_default().push(timed(|| assert_eq!(a.get("/api/trace/list").0, 200)));
    }
    for id in &ids {
        ms.entry("download, warm").or_default().push(timed(|| assert_eq!(a.get(&format!("/api/trace/{id}")).0, 200)));
        if let Some(b) = &b {
            ms.entry("download, other replica (cold)").or_default().push(timed(|| assert_eq!(b.get(&format!("/api/trace/{id}")).0, 200)));
        }
    }
    for id in &ids {
        ms.entry("delete").or_default().push(timed(|| assert_eq!(a.delete(&format!("/api/trace/{id}")).0, 200)));
    }
    ms
}

fn main() {
    let rounds = env_usize("MEMORY_TRACER_STORE_BENCH_ROUNDS", 5);
    let traces = env_usize("MEMORY_TRACER_STORE_BENCH_TRACES", 20);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("store-bench");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data");
    let small = std::fs::read(data.join("resnet18_sgd_2steps.pickle")).unwrap();
    // The MLP snapshot in the own format, padded to 20 MB (trailing whitespace is valid JSON).
    let native = dir.join("mlp.mtrace.json");
    let st = std::process::Command::new(env!("CARGO_BIN_EXE_collector"))
        .arg("convert")
        .arg(data.join("mlp_adam_3steps.pickle"))
        .arg("-o")
        .arg(&native)
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    let mut big = std::fs::read(&native).unwrap();
    big.resize(20 << 20, b' ');
    // backend → operation → each round's median.
    let mut medians: BTreeMap<&str, BTreeMap<&'static str, Vec<f64>>> = BTreeMap::new();
    for r in 0..rounds {
        for backend in ["disk", "bucket"] {
            for (op, mut v) in round(backend, &dir, r, traces, &small, &big) {
                medians.entry(backend).or_default().entry(op).or_default().push(median(&mut v));
            }
        }
    }
    println!("store: {rounds} rounds, {traces} traces each; ms per request: median of the rounds' medians [their range]");
    println!("{:<34} {:>26} {:>26}", "operation", "disk (--data-dir)", "bucket (SeaweedFS)");
    let ops: Vec<&'static str> =
        medians.values().flat_map(|m| m.keys().copied()).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    let mut json = BTreeMap::new();
    for op in ops {
        let cell = |backend: &str| -> (String, Option<[f64; 3]>) {
            match medians.get(backend).and_then(|m| m.get(op)) {
                Some(v) => {
                    let mut v = v.clone();
                    let (lo, hi) = (v.iter().copied().fold(f64::MAX, f64::min), v.iter().copied().fold(0.0, f64::max));
                    let m = median(&mut v);
                    (format!("{m:.1} [{lo:.1}–{hi:.1}]"), Some([m, lo, hi]))
                }
                None => ("—".into(), None),
            }
        };
        let ((d, dj), (b, bj)) = (cell("disk"), cell("bucket"));
        println!("{op:<34} {d:>26} {b:>26}");
        json.insert(op, serde_json::json!({"disk": dj, "bucket": bj}));
    }
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(
        out.join("store.json"),
        serde_json::to_string_pretty(&serde_json::json!({"rounds": rounds, "traces": traces, "ms": json})).unwrap(),
    )
    .unwrap();
}
