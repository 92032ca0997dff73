//! The viewer in headless Chromium (Debian's, through chromedriver), on the files named in
//! `MEMORY_TRACER_VIEWER_BENCH_FILES` (comma-separated; default: the ResNet-18 snapshot
//! sample). For each file: time from choosing it in the file input to every chart drawn, time
//! to the worker's overview, the worker's peak wasm memory, and the frame time of 30 timeline
//! zooms and pans (input to redrawn pixels, worker round trip included).
//!
//!     MEMORY_TRACER_VIEWER_BENCH_FILES=big.pickle cargo bench -p collector --bench viewer
//!
//! Needs `dist/` (the viewer built by `cargo xtask check`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/webdriver/mod.rs"]
mod webdriver;

use serde_json::json;
use std::path::PathBuf;

fn main() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let dist = repo.join("dist");
    assert!(dist.join("index.html").exists(), "build the viewer first: cargo xtask check");
    let files: Vec<PathBuf> = std::env::var("MEMORY_TRACER_VIEWER_BENCH_FILES")
        .map(|v| v.split(',').map(PathBuf::from).collect())
        .unwrap_or_else(|_| vec![repo.join("tests/data/resnet18_sgd_2steps.pickle")]);
    let (_server, url) = webdriver::static_server(&dist);
    let mut rows = Vec::new();
    for file in files {
        // A fresh browser per file: memory and caches start from nothing.
        let b = webdriver::Browser::start(1400, 1000);
        b.goto(&format!("{url}/index.html"));
        b.wait_for("return document.querySelector('#trace-file')", 30, "the page");
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let size = std::fs::metadata(&file).unwrap().len();
        b.upload("#trace-file", &file);
        let outcome = b.wait_for(
            "return document.body.dataset.drawnMs || document.querySelector('#error-panel')?.innerText",
            600,
            "the file to open",
        );
        let drawn_ms: f64 = match outcome.as_str().unwrap_or("").parse() {
            Ok(v) => v,
            Err(_) => {
                println!("{name}: did not open: {outcome}");
                rows.push(json!({"file": name, "bytes": size, "error": outcome}));
                continue;
            }
        };
        let load_ms: f64 = b.exec("return document.body.dataset.loadMs", json!([])).as_str().unwrap().parse().unwrap();
        let memory: u64 = b.exec("return document.body.dataset.workerMemory", json!([])).as_str().unwrap().parse().unwrap();
        let events = b.exec(
            "return [...document.querySelectorAll('#summary dt')].find(d => d.textContent === 'Events')?.nextSibling?.textContent",
            json!([]),
        );
        // Zoom in around the middle, then pan, waiting for each frame.
        b.exec("document.getElementById('timeline').scrollIntoView(); window.__mtFrames = []", json!([]));
        for i in 0..30 {
            let script = if i < 15 {
                "const c = document.querySelector('#timeline-canvas'); const r = c.getBoundingClientRect();
                 c.dispatchEvent(new WheelEvent('wheel', {deltaY: -100, clientX: r.left + r.width * 0.55, clientY: r.top + r.height / 2, bubbles: true, cancelable: true}));"
            } else {
                "window.dispatchEvent(new KeyboardEvent('keydown', {key: 'ArrowLeft', bubbles: true}));"
            };
            b.exec(script, json!([]));
            b.wait_for(&format!("return window.__mtFrames.length > {i}"), 30, "a frame");
        }
        let mut frames: Vec<f64> = serde_json::from_value(b.exec("return window.__mtFrames", json!([]))).unwrap();
        frames.sort_by(f64::total_cmp);
        let median = frames[frames.len() / 2];
        let p95 = frames[(frames.len() * 95 / 100).min(frames.len() - 1)];
        let max = frames[frames.len() - 1];
        println!(
            "{name}: {:.1} MB, {} events: overview {load_ms:.0} ms, all views drawn {drawn_ms:.0} ms, worker memory {:.0} MiB, zoom/pan frame median {median:.1} ms, p95 {p95:.1} ms, max {max:.1} ms",
            size as f64 / 1e6,
            events.as_str().unwrap_or("?"),
            memory as f64 / 1048576.0
        );
        rows.push(json!({"file": name, "bytes": size, "events": events, "load_ms": load_ms, "drawn_ms": drawn_ms,
            "worker_memory_bytes": memory, "frame_ms": {"median": median, "p95": p95, "max": max, "n": frames.len()}}));
    }
    println!("{}", serde_json::to_string_pretty(&rows).unwrap());
}
