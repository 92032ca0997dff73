//! The Active Memory Timeline's zoom and pan frames in headless Chromium (Debian's, through
//! chromedriver), on both drawing paths: WebGL2 (SwiftShader: `--disable-gpu` plus
//! `--enable-unsafe-swiftshader` and `?render=webgl2`, since the page takes a CPU-drawn WebGL2
//! only when asked) and the 2D canvas (`?render=canvas`, what a browser without WebGL2 or
//! without a GPU gets). For each file and path, `MEMORY_TRACER_BENCH_RUNS` runs (3),
//! each in a fresh browser: the file opened, then 15 wheel zooms around the middle and 15 drags
//! of 60 pixels, each input waiting for the worker's answer to be drawn before the next. A
//! frame is the time from the input to its pixels (on the GPU path the bands already on the
//! GPU moved by a uniform, until a pixel read back shows it drawn; on the canvas path the worker's answer
//! drawn); "refined" is input to the worker's answer drawn, on both. Also: the bands drawn in
//! the whole window.
//!
//! The files: the ResNet-18 snapshot sample and a 1 M-allocation snapshot made from it by
//! `tests/bench/scale_snapshot.py` (1,421 copies, written once to `target/active-1m.pickle`),
//! or those named in `MEMORY_TRACER_ACTIVE_BENCH_FILES` (comma-separated); one path only with
//! `MEMORY_TRACER_ACTIVE_BENCH_PATHS=webgl2` (or `canvas`).
//!
//!     cargo bench -p collector --bench active
//!
//! Needs `dist/` (the viewer built by `cargo xtask viewer`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/webdriver/mod.rs"]
mod webdriver;

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Copies of the ResNet-18 sample's 704 allocations: 1,000,384 allocations.
const COPIES: u32 = 1421;

fn main() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let dist = repo.join("dist");
    assert!(dist.join("index.html").exists(), "build the viewer first: cargo xtask viewer");
    let sample = repo.join("tests/data/resnet18_sgd_2steps.pickle");
    let files: Vec<PathBuf> = match std::env::var("MEMORY_TRACER_ACTIVE_BENCH_FILES") {
        Ok(v) => v.split(',').map(PathBuf::from).collect(),
        Err(_) => vec![sample.clone(), million(&repo, &sample)],
    };
    let runs: usize = std::env::var("MEMORY_TRACER_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let paths: Vec<String> = std::env::var("MEMORY_TRACER_ACTIVE_BENCH_PATHS")
        .map_or_else(|_| vec!["webgl2".into(), "canvas".into()], |v| v.split(',').map(str::to_owned).collect());
    let (_server, url) = webdriver::static_server(&dist);
    let mut rows = Vec::new();
    for file in &files {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        for path in paths.iter().map(String::as_str) {
            for run in 0..runs {
                let r = zoom_and_pan(&url, file, path);
                println!("{name} {path} run {run}: {r}");
                rows.push(json!({"file": name, "path": path, "run": run, "result": r}));
            }
        }
    }
    print_table(&rows);
}

/// The 1 M-allocation snapshot, written once.
fn million(repo: &Path, sample: &Path) -> PathBuf {
    let out = repo.join("target/active-1m.pickle");
    if !out.exists() {
        let python = std::env::var("MEMORY_TRACER_PYTHON").unwrap_or_else(|_| "python3".into());
        let status = Command::new(python)
            .arg(repo.join("tests/bench/scale_snapshot.py"))
            .arg(sample)
            .arg(COPIES.to_string())
            .arg(&out)
            .arg("--shared-frame-lists")
            .status()
            .expect("python3 runs tests/bench/scale_snapshot.py");
        assert!(status.success(), "scale_snapshot.py failed");
    }
    out
}

/// Opens `file` on drawing path `path`, then zooms and pans, each input's answer drawn before
/// the next.
fn zoom_and_pan(url: &str, file: &Path, path: &str) -> Value {
    let (flags, query): (&[&str], &str) =
        if path == "webgl2" { (&["--enable-unsafe-swiftshader"], "?render=webgl2") } else { (&[], "?render=canvas") };
    let b = webdriver::Browser::start_with(1400, 1000, flags);
    b.goto(&format!("{url}/index.html{query}"));
    b.wait_for("return document.querySelector('#trace-file')", 30, "the page");
    b.upload("#trace-file", file);
    b.wait_for("return document.body.dataset.drawnMs", 600, "the file drawn");
    let c = "document.getElementById('active-canvas')";
    let render = b.exec(&format!("return {c}.dataset.render"), json!([]));
    assert!(render.as_str().unwrap_or("").starts_with(path), "asked for {path}, drawn by {render}");
    let bands = b.exec(&format!("return +{c}.dataset.bands"), json!([]));
    b.exec(&format!("{c}.scrollIntoView(); window.__mtActiveFrames = []; window.__mtActiveRefined = [];"), json!([]));
    for i in 0..30 {
        let script = if i < 15 {
            "const c = document.getElementById('active-canvas'); const r = c.getBoundingClientRect();
             c.dispatchEvent(new WheelEvent('wheel', {deltaY: -100, clientX: r.left + r.width * 0.55, clientY: r.top + r.height / 2, bubbles: true, cancelable: true}));"
        } else {
            "const c = document.getElementById('active-canvas'); const r = c.getBoundingClientRect();
             const at = x => ({clientX: r.left + x, clientY: r.top + r.height / 2, buttons: 1, bubbles: true});
             c.dispatchEvent(new MouseEvent('mousedown', at(r.width * 0.6)));
             c.dispatchEvent(new MouseEvent('mousemove', at(r.width * 0.6 - 60)));
             c.dispatchEvent(new MouseEvent('mouseup', at(r.width * 0.6 - 60)));
             c.dispatchEvent(new MouseEvent('click', at(r.width * 0.6 - 60)));"
        };
        b.exec(script, json!([]));
        b.wait_for(
            &format!("return window.__mtActiveRefined.length > {i} && window.__mtActiveFrames.length > {i}"),
            120,
            "a refined frame",
        );
    }
    let list = |key: &str| -> Vec<f64> { serde_json::from_value(b.exec(&format!("return window.{key}"), json!([]))).unwrap() };
    json!({"bands": bands, "frame_ms": stats(list("__mtActiveFrames")), "refined_ms": stats(list("__mtActiveRefined"))})
}

fn stats(mut v: Vec<f64>) -> Value {
    v.sort_by(f64::total_cmp);
    let at = |q: usize| v[(v.len() * q / 100).min(v.len() - 1)];
    json!({"median": at(50), "p95": at(95), "max": v[v.len() - 1], "n": v.len()})
}

/// Per file and path: the runs' medians of frame median and p95 and of refined median, with
/// their ranges.
fn print_table(rows: &[Value]) {
    println!("\n| file | path | bands | frame median ms | frame p95 ms | refined median ms |");
    println!("|---|---|---:|---:|---:|---:|");
    let mut keys: Vec<(String, String)> =
        rows.iter().map(|r| (r["file"].as_str().unwrap().to_owned(), r["path"].as_str().unwrap().to_owned())).collect();
    keys.dedup();
    for (file, path) in keys {
        let of = |a: &str, b: &str| -> Vec<f64> {
            let mut v: Vec<f64> = rows
                .iter()
                .filter(|r| r["file"] == file.as_str() && r["path"] == path.as_str())
                .filter_map(|r| r["result"][a][b].as_f64())
                .collect();
            v.sort_by(f64::total_cmp);
            v
        };
        let cell = |v: Vec<f64>| format!("{:.1} ({:.1}–{:.1})", v[v.len() / 2], v[0], v[v.len() - 1]);
        let bands = rows.iter().find(|r| r["file"] == file.as_str()).map_or(json!(null), |r| r["result"]["bands"].clone());
        println!(
            "| {file} | {path} | {bands} | {} | {} | {} |",
            cell(of("frame_ms", "median")),
            cell(of("frame_ms", "p95")),
            cell(of("refined_ms", "median"))
        );
    }
}
