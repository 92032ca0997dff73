//! The viewer in headless Chromium (Debian's, through chromedriver), on the files named in
//! `MEMORY_TRACER_VIEWER_BENCH_FILES` (comma-separated; default: the ResNet-18 snapshot
//! sample). For each file: when the page was warm (its hidden warm-up report drawn, ms after
//! it started), time from choosing it in the file input (1 s after the page is ready, as
//! issue 51 measures, for memory_viz alike) to every chart drawn, time
//! to the worker's overview, the worker's peak wasm memory, the renderer process's peak
//! memory, and the frame time of 30 timeline zooms and pans (input to redrawn pixels, worker
//! round trip included).
//!
//!     MEMORY_TRACER_VIEWER_BENCH_FILES=big.pickle cargo bench -p collector --bench viewer
//!
//! Side by side with pytorch.org/memory_viz: set `MEMORY_TRACER_MEMORY_VIZ` to its page's
//! script, `torch/utils/viz/MemoryViz.js` of a pytorch checkout (it is not vendored here; the
//! script imports d3 5 from a CDN, and the harness serves d3 5.16 from npm instead, installed
//! once under `~/.cache/memory-tracer/d3`). Each file is then opened `MEMORY_TRACER_BENCH_RUNS`
//! times (3) in each page, runs interleaved, each in a fresh browser: file chosen → the Active
//! Memory Timeline's polygons built and the next frame painted (memory_viz) or every chart
//! drawn (ours), the renderer process's peak memory, and whether it finished within
//! `MEMORY_TRACER_BENCH_TIMEOUT_S` (600). A table closes the output, then, per file, where our
//! page's load went, stage by stage (the worker's stages on its own clock, then the page's
//! until each chart is drawn: docs/benchmarks.md, "Where a load's time goes (issue 51)").
//! `MEMORY_TRACER_VIEWER_BENCH_ALSO=NAME=DIR,...` measures other builds of the viewer (a
//! `dist/` kept from before a change) in the same runs, interleaved; `NAME=plain:DIR` serves one
//! as a plain static host does, not cross-origin isolated (`dist/` itself is served with the
//! headers `collector serve` sends: the page reads the file into shared memory for its worker).
//!
//! Needs `dist/` (the viewer built by `cargo xtask viewer`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/webdriver/mod.rs"]
mod webdriver;

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const D3_VERSION: &str = "5.16.0";

fn main() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let dist = repo.join("dist");
    assert!(dist.join("index.html").exists(), "build the viewer first: cargo xtask check");
    let files: Vec<PathBuf> = std::env::var("MEMORY_TRACER_VIEWER_BENCH_FILES")
        // Cargo runs a benchmark in its package's folder: a relative path is the repository's.
        .map(|v| v.split(',').map(|f| repo.join(f)).collect())
        .unwrap_or_else(|_| vec![repo.join("tests/data/resnet18_sgd_2steps.pickle")]);
    let runs: usize = std::env::var("MEMORY_TRACER_BENCH_RUNS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let timeout_s: u64 = std::env::var("MEMORY_TRACER_BENCH_TIMEOUT_S").ok().and_then(|v| v.parse().ok()).unwrap_or(600);
    let memory_viz = std::env::var("MEMORY_TRACER_MEMORY_VIZ").ok().map(|p| memory_viz_page(Path::new(&p)));

    // Served as `collector serve` serves it: cross-origin isolated.
    let (_server, url) = webdriver::isolated_static_server(&dist);
    // Other builds of the viewer measured in the same runs, interleaved: `NAME=DIST,...`; a
    // `plain:DIST` served without the isolation headers (the page where the worker reads the file).
    let others: Vec<(String, (webdriver::Guard, String))> = std::env::var("MEMORY_TRACER_VIEWER_BENCH_ALSO")
        .map(|v| {
            v.split(',')
                .filter_map(|p| p.split_once('='))
                .map(|(name, dir)| {
                    let server = match dir.strip_prefix("plain:") {
                        Some(dir) => webdriver::static_server(&repo.join(dir)),
                        None => webdriver::isolated_static_server(&repo.join(dir)),
                    };
                    (format!("viewer {name}"), server)
                })
                .collect()
        })
        .unwrap_or_default();
    let mv_server = memory_viz.as_ref().map(|dir| webdriver::static_server(dir));
    let runs = if memory_viz.is_some() { runs.max(1) } else { runs };
    let mut rows = Vec::new();
    for file in &files {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let size = std::fs::metadata(file).unwrap().len();
        for run in 0..runs {
            if let Some((_, mv_url)) = &mv_server {
                let r = open_in_memory_viz(mv_url, file, timeout_s);
                println!("{name} run {run}: memory_viz {}", describe(&r));
                rows.push(json!({"file": name, "bytes": size, "page": "memory_viz", "run": run, "result": r}));
            }
            let r = open_in_viewer(&url, file, timeout_s);
            println!("{name} run {run}: viewer {}", describe(&r));
            rows.push(json!({"file": name, "bytes": size, "page": "viewer", "run": run, "result": r}));
            for (page, (_, other_url)) in &others {
                let r = open_in_viewer(other_url, file, timeout_s);
                println!("{name} run {run}: {page} {}", describe(&r));
                rows.push(json!({"file": name, "bytes": size, "page": page, "run": run, "result": r}));
            }
        }
    }
    println!("{}", serde_json::to_string_pretty(&rows).unwrap());
    print_table(&rows);
    print_stages(&rows);
}

/// Where one load's time went: (stage, ms) in order, from the page's marks
/// (`window.__mtMarks`): the worker's stages (`worker: STAGE`, each timed on the worker's clock
/// until the next), the overview's message arriving and read, then each chart drawn; the
/// parse split into the worker's reads of the file (`read_ms`) and the rest.
fn stages(marks: &Value, read_ms: f64) -> Vec<(String, f64)> {
    let marks: Vec<(String, f64)> = marks
        .as_array()
        .map(|m| m.iter().filter_map(|p| Some((p.get(0)?.as_str()?.to_owned(), p.get(1)?.as_f64()?))).collect())
        .unwrap_or_default();
    let at = |label: &str| marks.iter().find(|(l, _)| l == label).map(|p| p.1);
    // (where a stage ends, the name of the stage that begins there)
    let mut points: Vec<(f64, String)> = marks.iter().filter_map(|(l, t)| Some((*t, l.strip_prefix("worker: ")?.to_owned()))).collect();
    if let Some(received) = at("overview received") {
        // The last message before the overview was read is the overview's.
        if let Some(arrived) = marks.iter().filter(|(l, t)| l.starts_with("message of ") && *t <= received).map(|p| p.1).reduce(f64::max) {
            points.push((arrived, "page: read the overview's message (JSON)".into()));
        }
        points.push((received, "page: render the report".into()));
    }
    let mut drawn: Vec<(f64, String)> = marks
        .iter()
        .filter_map(|(l, t)| match l.as_str() {
            "first screen painted" => Some((*t, "first screen (summary and timeline) painted: the".to_owned())),
            l => Some((*t, l.strip_prefix("drawn ")?.to_owned())),
        })
        .collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    drawn.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut out = Vec::new();
    let (mut from, mut label) = (0.0, "page → worker: the file handed over".to_owned());
    for (t, next) in points {
        if label == "opening" {
            // Opening reads the file's first slice: it is the parse's.
            (from, label) = (from, "parsing".to_owned());
            continue;
        }
        if label == "parsing" {
            out.push(("read the file (the worker's reads of its slices, or its waits for the page's)".to_owned(), read_ms));
            out.push(("unpickle (the parse, less the reads)".to_owned(), t - from - read_ms));
        } else {
            out.push((label, t - from));
        }
        (from, label) = (t, next);
    }
    // After the overview: the page renders, each chart's row ends when it is drawn.
    let overview_at = from;
    for (t, chart) in drawn.into_iter().filter(|(t, _)| *t >= overview_at) {
        out.push((format!("{label}, until the {chart} chart is drawn"), t - from));
        (from, label) = (t, "page".to_owned());
    }
    out
}

/// Markdown, per file: each stage of our page's load, median and range over the runs, and its
/// share of the median file chosen → drawn.
fn print_stages(rows: &[Value]) {
    let mut files: Vec<&str> = Vec::new();
    let mut pages: Vec<&str> = Vec::new();
    for r in rows.iter().filter(|r| r["page"].as_str().is_some_and(|p| p.starts_with("viewer"))) {
        let f = r["file"].as_str().unwrap();
        if !files.contains(&f) {
            files.push(f);
        }
        let p = r["page"].as_str().unwrap();
        if !pages.contains(&p) {
            pages.push(p);
        }
    }
    for (file, page) in files.iter().flat_map(|f| pages.iter().map(move |p| (*f, *p))) {
        let runs: Vec<(Vec<(String, f64)>, f64)> = rows
            .iter()
            .filter(|r| r["file"] == file && r["page"] == page && r["result"]["drawn_ms"].is_f64())
            .map(|r| {
                (
                    stages(&r["result"]["marks"], r["result"]["worker_read_ms"].as_f64().unwrap_or(0.0)),
                    r["result"]["drawn_ms"].as_f64().unwrap(),
                )
            })
            .collect();
        if runs.is_empty() {
            continue;
        }
        let mut labels: Vec<&str> = Vec::new();
        for (s, _) in &runs {
            for (l, _) in s {
                if !labels.contains(&l.as_str()) {
                    labels.push(l);
                }
            }
        }
        let drawn = median(runs.iter().map(|r| r.1).collect());
        println!("\n{file}: where the {page}'s load goes ({} runs; file chosen → drawn, median {drawn:.0} ms)\n", runs.len());
        println!("| stage | ms, median | range | share |");
        println!("|---|---|---|---|");
        for l in labels {
            let ms: Vec<f64> = runs.iter().map(|(s, _)| s.iter().filter(|(k, _)| k == l).map(|p| p.1).sum()).collect();
            let (lo, hi) = (ms.iter().copied().fold(f64::INFINITY, f64::min), ms.iter().copied().fold(0.0, f64::max));
            let m = median(ms);
            println!("| {l} | {m:.1} | {lo:.1}–{hi:.1} | {:.0} % |", m / drawn * 100.0);
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn describe(r: &Value) -> String {
    match r["error"].as_str() {
        Some(e) => format!("did not finish: {e}"),
        None => format!(
            "first screen painted {:.0} ms, drawn {:.0} ms, renderer peak {:.0} MiB{}{}",
            r["first_screen_ms"].as_f64().unwrap_or(f64::NAN),
            r["drawn_ms"].as_f64().unwrap_or(f64::NAN),
            r["renderer_peak_bytes"].as_f64().unwrap_or(f64::NAN) / 1048576.0,
            r.get("worker_memory_bytes").map_or(String::new(), |m| format!(
                ", worker memory {:.0} MiB, overview {:.0} ms, page warm {:.0} ms after it started",
                m.as_f64().unwrap_or(f64::NAN) / 1048576.0,
                r["load_ms"].as_f64().unwrap_or(f64::NAN),
                r["warm_ms"].as_f64().unwrap_or(f64::NAN)
            )),
            r.get("frame_ms").map_or(String::new(), |f| format!(
                ", {} events, zoom/pan frame median {:.1} ms, p95 {:.1} ms, max {:.1} ms",
                r["events"].as_str().unwrap_or("?"),
                f["median"].as_f64().unwrap_or(f64::NAN),
                f["p95"].as_f64().unwrap_or(f64::NAN),
                f["max"].as_f64().unwrap_or(f64::NAN)
            )),
        ),
    }
}

/// Markdown: per file and page, file chosen → first screen painted in every run (or why it did
/// not finish), the median time to every chart drawn, the largest renderer peak, and
/// memory_viz's time over ours (medians of the first screen: memory_viz's page is one view, its
/// first screen all it draws).
fn print_table(rows: &[Value]) {
    let mut files: Vec<(&str, u64)> = Vec::new();
    for r in rows {
        let f = (r["file"].as_str().unwrap(), r["bytes"].as_u64().unwrap());
        if !files.contains(&f) {
            files.push(f);
        }
    }
    println!("\n| file | MB | page | file chosen → first screen painted, ms (each run) | every chart drawn, ms (median) | renderer peak MiB | memory_viz / ours |");
    println!("|---|---|---|---|---|---|---|");
    for (file, bytes) in files {
        let median_of = |page: &str, key: &str| {
            let t: Vec<f64> =
                rows.iter().filter(|r| r["file"] == file && r["page"] == page).filter_map(|r| r["result"][key].as_f64()).collect();
            (!t.is_empty()).then(|| median(t))
        };
        let mut pages: Vec<&str> = vec!["memory_viz", "viewer"];
        for r in rows.iter().filter(|r| r["file"] == file) {
            let p = r["page"].as_str().unwrap();
            if !pages.contains(&p) {
                pages.push(p);
            }
        }
        for page in pages {
            let of_page: Vec<&Value> = rows.iter().filter(|r| r["file"] == file && r["page"] == page).collect();
            if of_page.is_empty() {
                continue;
            }
            let runs: Vec<String> = of_page
                .iter()
                .map(|r| match r["result"]["first_screen_ms"].as_f64() {
                    Some(ms) => format!("{ms:.0}"),
                    None => format!("failed ({})", r["result"]["error"].as_str().unwrap_or("no first screen")),
                })
                .collect();
            let all = median_of(page, "drawn_ms").map_or(String::new(), |ms| format!("{ms:.0}"));
            let peak = of_page.iter().filter_map(|r| r["result"]["renderer_peak_bytes"].as_f64()).fold(0.0, f64::max);
            let ratio = match (median_of("memory_viz", "first_screen_ms"), median_of(page, "first_screen_ms")) {
                (Some(mv), Some(ours)) if page != "memory_viz" => format!("{:.1}×", mv / ours),
                _ => String::new(),
            };
            println!("| {file} | {:.1} | {page} | {} | {all} | {:.0} | {ratio} |", bytes as f64 / 1e6, runs.join(", "), peak / 1048576.0);
        }
    }
}

/// The parent of process `pid` (from `/proc/PID/stat`: the field after the command's `)`).
fn parent_pid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
}

/// Whether `pid` descends from `root`.
fn descends_from(mut pid: u32, root: u32) -> bool {
    for _ in 0..64 {
        match parent_pid(pid) {
            Some(p) if p == root => return true,
            Some(p) if p > 1 => pid = p,
            _ => return false,
        }
    }
    false
}

/// Peak resident memory (VmHWM) of `browser`'s renderer processes, the largest: the page's
/// process, which holds a dedicated worker too. Only this browser's (descendants of its
/// chromedriver): a renderer of another browser, still exiting or started by something else
/// on the machine, is not the page's.
fn renderer_peak_bytes(browser: &webdriver::Browser) -> Option<u64> {
    let root = browser.driver_pid();
    let mut peak = None;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        if !cmdline.contains("--type=renderer") || cmdline.contains("--extension-process") || !descends_from(pid, root) {
            continue;
        }
        let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
        let kb = status.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok());
        if let Some(kb) = kb {
            peak = peak.max(Some(kb * 1024));
        }
    }
    peak
}

/// Polls `script` until it returns something truthy, the page fails (a crashed tab) or
/// `timeout_s` passes.
fn poll(b: &webdriver::Browser, script: &str, timeout_s: u64) -> Result<Value, String> {
    let deadline = Instant::now() + Duration::from_secs(timeout_s);
    loop {
        // A page busy for longer than WebDriver's script timeout (or the client's) is still
        // working, not failed.
        match b.try_exec(script, json!([])) {
            Ok(v) if !(v.is_null() || v == json!(false) || v == json!("")) => return Ok(v),
            Ok(_) => {}
            Err(e) if e.contains("timeout") || e.contains("timed out") => {}
            Err(e) => return Err(e),
        }
        if Instant::now() > deadline {
            return Err(format!("not drawn after {timeout_s} s"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How long each page stands idle between being ready (its file input there) and the file
/// being chosen: issue 51's measure ("1 s after the page is ready"), for both pages alike. The
/// file used to be chosen the moment our page was warm, 0.9-1.0 s after it started, while V8
/// was still optimising the warm-up's wasm on a background thread (a core's worth, until
/// ~1.1 s after the warm-up began: `perf record -a` of the benchmark), beside the open.
const IDLE_AFTER_READY: Duration = Duration::from_secs(1);

fn idle_after_ready(ready: Instant) {
    std::thread::sleep(IDLE_AFTER_READY.saturating_sub(ready.elapsed()));
}

fn open_in_viewer(url: &str, file: &Path, timeout_s: u64) -> Value {
    // A fresh browser per file: memory and caches start from nothing.
    let b = webdriver::Browser::start(1400, 1000);
    b.goto(&format!("{url}/index.html"));
    b.wait_for("return document.querySelector('#trace-file')", 30, "the page");
    let ready = Instant::now();
    // A user chooses a file a second or more after the page appears: by then the page has
    // warmed up (`data-warm`).
    let warm_ms = poll(&b, "return document.body.dataset.warm", 10).ok().and_then(|v| v.as_str()?.parse::<f64>().ok());
    idle_after_ready(ready);
    b.upload("#trace-file", file);
    let outcome = match poll(&b, "return document.body.dataset.drawnMs || document.querySelector('#error-panel')?.innerText", timeout_s) {
        Ok(v) => v,
        Err(e) => return json!({"error": e, "renderer_peak_bytes": renderer_peak_bytes(&b)}),
    };
    let Ok(drawn_ms) = outcome.as_str().unwrap_or("").parse::<f64>() else {
        return json!({"error": outcome, "renderer_peak_bytes": renderer_peak_bytes(&b)});
    };
    let load_ms: f64 = b.exec("return document.body.dataset.loadMs", json!([])).as_str().unwrap().parse().unwrap();
    let first_screen_ms = b.exec("return document.body.dataset.firstScreenMs", json!([])).as_str().and_then(|v| v.parse::<f64>().ok());
    let memory: u64 = b.exec("return document.body.dataset.workerMemory", json!([])).as_str().unwrap().parse().unwrap();
    let read_ms = b.exec("return document.body.dataset.workerReadMs", json!([])).as_str().and_then(|v| v.parse::<f64>().ok());
    let renderer_peak = renderer_peak_bytes(&b);
    let each = b.exec(
        "return Object.fromEntries(Object.entries(document.body.dataset).filter(([k]) => /^drawn.+Ms$/.test(k)).map(([k, v]) => [k, Number(v)]))",
        json!([]),
    );
    let marks = b.exec("return (window.__mtMarks || []).concat([['elements', document.getElementsByTagName('*').length]])", json!([]));
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
    json!({"events": events, "warm_ms": warm_ms, "load_ms": load_ms, "first_screen_ms": first_screen_ms, "drawn_ms": drawn_ms, "worker_memory_bytes": memory,
        "renderer_peak_bytes": renderer_peak, "drawn_each_ms": each, "marks": marks, "worker_read_ms": read_ms, "frame_ms": {"median": median, "p95": p95, "max": max, "n": frames.len()}})
}

/// memory_viz's page as pytorch.org serves it (its script, a `<select>` per snapshot, view and
/// device, the Active Memory Timeline first), plus a file input that hands the chosen file to
/// the page's own drop handler, and marks for the harness.
const MEMORY_VIZ_PAGE: &str = r#"<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>memory_viz (benchmark copy)</title>
<script src="d3.min.js"></script>
<script>
addEventListener('error', e => { document.documentElement.dataset.mvError = String(e.message || e.error); });
addEventListener('unhandledrejection', e => { document.documentElement.dataset.mvError = String(e.reason); });
</script>
<script type="module" src="MemoryViz.js"></script>
</head><body>
<input type="file" id="trace-file" style="position: fixed; right: 0; top: 0">
<script type="module">
const input = document.getElementById('trace-file');
input.addEventListener('change', () => {
  const t0 = performance.now();
  const done = () => requestAnimationFrame(() => setTimeout(() => {
    document.documentElement.dataset.drawnMs = (performance.now() - t0).toFixed(1);
  }, 0));
  const observer = new MutationObserver(() => {
    if (document.querySelector('svg polygon')) { observer.disconnect(); done(); }
  });
  observer.observe(document.body, {childList: true, subtree: true});
  const files = new DataTransfer();
  files.items.add(input.files[0]);
  document.body.dispatchEvent(new DragEvent('drop', {dataTransfer: files, bubbles: true, cancelable: true}));
});
</script>
</body></html>
"#;

/// A folder serving memory_viz: the page above, `MemoryViz.js` with its CDN imports of d3
/// pointed at the d3 5 bundle (`window.d3`, which has every name it imports), and that bundle.
fn memory_viz_page(script: &Path) -> PathBuf {
    let source = std::fs::read_to_string(script).unwrap_or_else(|e| panic!("MEMORY_TRACER_MEMORY_VIZ={}: {e}", script.display()));
    let mut rewritten = String::with_capacity(source.len());
    for line in source.lines() {
        let t = line.trim();
        if t.starts_with("import ") && t.contains("cdn.skypack.dev/d3") {
            // `import * as d3 from ".../d3@5";` / `import {axisLeft} from ".../d3-axis@1";`
            let what = t.trim_start_matches("import ").split(" from ").next().unwrap_or("").trim();
            match what.strip_prefix("* as ") {
                Some(name) => rewritten.push_str(&format!("const {name} = window.d3;\n")),
                None => rewritten.push_str(&format!("const {what} = window.d3;\n")),
            }
        } else {
            rewritten.push_str(line);
            rewritten.push('\n');
        }
    }
    assert!(!rewritten.contains("cdn.skypack.dev"), "{}: an import the harness does not know", script.display());
    let cache = PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/memory-tracer/d3");
    let d3 = cache.join("node_modules/d3/dist/d3.min.js");
    let installed = std::fs::read_to_string(cache.join("node_modules/d3/package.json")).unwrap_or_default();
    if !installed.contains(&format!("\"version\": \"{D3_VERSION}\"")) {
        std::fs::create_dir_all(&cache).unwrap();
        let status = Command::new("npm")
            .args(["install", "--no-fund", "--no-audit", &format!("d3@{D3_VERSION}")])
            .current_dir(&cache)
            .status()
            .expect("npm (to install d3 for memory_viz)");
        assert!(status.success(), "npm install d3@{D3_VERSION} failed");
    }
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("memory-viz-bench");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("index.html"), MEMORY_VIZ_PAGE).unwrap();
    std::fs::write(dir.join("MemoryViz.js"), rewritten).unwrap();
    std::fs::copy(&d3, dir.join("d3.min.js")).unwrap();
    dir
}

fn open_in_memory_viz(url: &str, file: &Path, timeout_s: u64) -> Value {
    let b = webdriver::Browser::start(1400, 1000);
    b.goto(&format!("{url}/index.html"));
    b.wait_for("return document.querySelector('select') && document.querySelector('#trace-file')", 30, "memory_viz's page");
    idle_after_ready(Instant::now());
    b.upload("#trace-file", file);
    let outcome = poll(&b, "return document.documentElement.dataset.drawnMs || document.documentElement.dataset.mvError", timeout_s);
    let renderer_peak = renderer_peak_bytes(&b);
    let outcome = match outcome {
        Ok(v) => v,
        Err(e) => return json!({"error": e, "renderer_peak_bytes": renderer_peak}),
    };
    match outcome.as_str().unwrap_or("").parse::<f64>() {
        Ok(drawn_ms) => {
            let polygons = b.try_exec("return document.querySelectorAll('svg polygon').length", json!([])).unwrap_or_default();
            // Its page is one view: its first screen is all it draws.
            json!({"first_screen_ms": drawn_ms, "drawn_ms": drawn_ms, "renderer_peak_bytes": renderer_peak, "polygons": polygons})
        }
        Err(_) => json!({"error": outcome, "renderer_peak_bytes": renderer_peak}),
    }
}
