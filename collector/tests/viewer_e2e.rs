//! End to end in Debian's headless Chromium through chromedriver: the viewer Trunk built
//! (`dist/`, which `cargo xtask test` builds first) served by a plain static server opens
//! every sample format through its file input, draws every chart (non-blank canvas pixels),
//! shows table rows equal to what `shared` computes natively, answers clicks and zooms, and
//! shows the error panel for a bad file while keeping the trace it had. `collector report`
//! folders and single files open from a static host. Screenshots of every view go to
//! `target/e2e-screenshots/` to be looked at. Served by `collector serve` (with a token), the
//! page traces a model through its form, draws it live from the server's events, then opens
//! the stored trace.
#![cfg(feature = "tracing")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod server;
mod webdriver;

use serde_json::{json, Value};
use shared::analysis::{layer_stats, summary, LayerMemoryStats};
use shared::units::format_bytes;
use std::path::{Path, PathBuf};
use std::process::Command;
use webdriver::{static_server, Browser};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn dist() -> PathBuf {
    let d = repo().join("dist");
    assert!(
        d.join("index.html").exists() && d.join("worker_loader.js").exists(),
        "{} has no built viewer: run `cargo xtask check` (Trunk) before this test",
        d.display()
    );
    d
}

fn sample(name: &str) -> PathBuf {
    repo().join("tests/data").join(name)
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mt-e2e-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn screenshots() -> PathBuf {
    let d = repo().join("target/e2e-screenshots");
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn collector(args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_collector")).args(args).output().unwrap();
    assert!(out.status.success(), "collector {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A small CPU training trace with operators, tensors and layers (every view has data).
fn native_trace(dir: &Path) -> PathBuf {
    let out = dir.join("mlp.mtrace.json");
    collector(&["trace", "--model", "mlp", "--layers", "2", "--width", "64", "--device", "cpu", "--iterations", "3", "-q", "-o", out.to_str().unwrap()]);
    out
}

/// Non-background pixels of each canvas, by id.
const PAINTED: &str = r#"
const out = {};
for (const c of document.querySelectorAll('canvas.chart')) {
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let n = 0;
  for (let i = 0; i < d.length; i += 4) if (d[i] !== d[0] || d[i+1] !== d[1] || d[i+2] !== d[2]) n++;
  out[c.id] = n;
}
return out;"#;

fn column(b: &Browser, table: &str, col: usize) -> Vec<String> {
    let v = b.exec(
        &format!("return [...document.querySelectorAll('{table} tbody tr')].map(r => r.cells[{col}].textContent)"),
        json!([]),
    );
    serde_json::from_value(v).unwrap()
}

/// Waits until `file_name` is loaded and every chart drawn.
fn wait_drawn(b: &Browser, file_name: &str) {
    b.wait_for(
        &format!(
            "const h = document.querySelector('#summary h2'); return document.body.dataset.drawnMs && h && h.textContent === {} && !document.querySelector('#progress')",
            json!(file_name)
        ),
        90,
        &format!("{file_name} to be drawn"),
    );
}

/// The layer table's default order: peak allocated, highest first; ties in name order.
fn native_layer_order(trace: &shared::Trace) -> Vec<LayerMemoryStats> {
    let mut rows: Vec<LayerMemoryStats> = layer_stats(trace).into_values().collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.peak_allocated));
    rows
}

/// Checks every view against what `shared` computes natively for the same file. Which charts
/// must be drawn follows from the data: memory events give the timeline, flame graph and
/// fragmentation; operators the rank chart; allocator segments the segment view.
fn check_views(b: &Browser, path: &Path) {
    let bytes = std::fs::read(path).unwrap();
    let trace = shared::import(&bytes, &shared::ImportOptions::default()).unwrap();
    let name = path.file_name().unwrap().to_str().unwrap();
    let mut expect = Vec::new();
    if !trace.events.is_empty() {
        expect.extend(["timeline-canvas", "flame-canvas", "fragmentation-canvas"]);
    }
    if shared::analysis::profile::graph_profile(&trace).is_ok() {
        expect.push("rank-canvas");
    }
    if shared::analysis::has_segments(&trace) {
        expect.push("segments-canvas");
    }
    assert!(!expect.is_empty(), "{name} has nothing to draw");
    // Charts are drawn, and only those.
    let painted = b.exec(PAINTED, json!([]));
    assert_eq!(painted.as_object().unwrap().len(), expect.len(), "{name}: charts on the page: {painted}");
    for id in &expect {
        let n = painted[id].as_u64().unwrap_or(0);
        assert!(n > 2000, "{name}: canvas {id} is blank ({n} painted pixels): {painted}");
    }
    // The summary's peak is the native one.
    let s = summary(&trace);
    let text = b.exec("return document.querySelector('#summary').innerText", json!([]));
    assert!(text.as_str().unwrap().contains(&format_bytes(s.peak_allocated_bytes)), "{name}: summary lacks the peak: {text}");
    // The leak verdict is the native one.
    let leaks = shared::analysis::leaks::leaks(&trace, 8);
    let shown = b.exec("return document.querySelector('#leaks').innerText", json!([]));
    assert!(shown.as_str().unwrap().contains(&leaks.verdict), "{name}: leaks section says {shown}, expected {}", leaks.verdict);
    // The layer table has exactly the native rows, in the native order, with the native peaks.
    let want = native_layer_order(&trace);
    let names = column(b, "#layer-table", 0);
    assert_eq!(names, want.iter().map(|l| l.layer_name.clone()).collect::<Vec<_>>(), "{name}: layer rows");
    let peaks = column(b, "#layer-table", 1);
    assert_eq!(peaks, want.iter().map(|l| format_bytes(l.peak_allocated)).collect::<Vec<_>>(), "{name}: layer peaks");
    let allocs = column(b, "#layer-table", 3);
    assert_eq!(allocs, want.iter().map(|l| l.total_allocations.to_string()).collect::<Vec<_>>(), "{name}: layer allocations");
}

/// One screenshot per view, scrolled into place.
fn screenshot_sections(b: &Browser, dir: &Path, name: &str) {
    for id in ["summary", "timeline", "flame", "rank", "tables", "fragmentation", "segments"] {
        let there = b.exec(&format!("const e = document.getElementById('{id}'); if (e) e.scrollIntoView(); return !!e"), json!([]));
        if there == json!(true) {
            b.screenshot(&dir.join(format!("{name}-{id}.png")));
        }
    }
    b.exec("window.scrollTo(0, 0)", json!([]));
}

#[test]
fn every_format_opens_and_every_view_draws() {
    let dir = tmpdir("formats");
    let native = native_trace(&dir);
    let sweep_dir = dir.join("sweep");
    collector(&["sweep", "--model", "mlp", "--layers", "1", "--width", "32", "--device", "cpu", "--iterations", "2", "--batch-sizes", "4,8,16", "-o", sweep_dir.to_str().unwrap()]);
    let (_server, url) = static_server(&dist());
    let b = Browser::start(1400, 1000);
    b.goto(&format!("{url}/index.html"));
    b.wait_for("return document.querySelector('#trace-file')", 30, "the page");
    let shots = screenshots();
    let cases = [sample("resnet18_sgd_2steps.pickle"), sample("convnet_profiler_trace.json"), sample("dftracer_sample.pfw.gz"), native.clone()];
    for path in &cases {
        b.upload("#trace-file", path);
        let name = path.file_name().unwrap().to_str().unwrap();
        wait_drawn(&b, name);
        check_views(&b, path);
        screenshot_sections(&b, &shots, name);
    }

    // The native trace: activation rows equal the native profile's.
    b.upload("#trace-file", &native);
    wait_drawn(&b, "mlp.mtrace.json");
    let trace = collector::commands::load_trace(&native, &shared::ImportOptions::default()).unwrap();
    let profile = shared::analysis::profile::graph_profile(&trace).unwrap();
    let mut acts: Vec<_> = profile.activations.iter().collect();
    acts.sort_by_key(|a| a.creation_rank);
    assert!(!acts.is_empty());
    assert_eq!(column(&b, "#activation-table", 0), acts.iter().map(|a| a.activation_name.clone()).collect::<Vec<_>>());
    // Sorting by a header click: size, descending then ascending.
    b.click("#activation-table th:nth-child(6)");
    let sizes: Vec<u64> = {
        let mut s: Vec<u64> = acts.iter().map(|a| a.median_mem_size_bytes).collect();
        s.sort_unstable_by(|a, b| b.cmp(a));
        s
    };
    assert_eq!(column(&b, "#activation-table", 5), sizes.iter().map(|&s| format_bytes(s)).collect::<Vec<_>>());
    // Filtering the layer table.
    let first = column(&b, "#layer-table", 0)[0].clone();
    b.exec(
        "const i = document.querySelector('#layer-filter'); i.value = arguments[0]; i.dispatchEvent(new Event('input', {bubbles: true}));",
        json!([first]),
    );
    let filtered = column(&b, "#layer-table", 0);
    assert!(filtered.iter().all(|n| n.to_lowercase().contains(&first.to_lowercase())) && filtered.contains(&first));

    // A sweep overlays one curve per batch size on the rank chart.
    b.upload("#trace-file", &sweep_dir.join("sweep.json"));
    b.wait_for("return document.body.dataset.drawnMs && document.querySelector('#summary h2')?.textContent === 'sweep.json'", 60, "the sweep");
    let painted = b.exec(PAINTED, json!([]));
    assert!(painted["rank-canvas"].as_u64().unwrap() > 2000, "{painted}");
    b.screenshot(&shots.join("sweep.png"));
}

#[test]
fn click_zoom_and_bad_files() {
    let path = sample("resnet18_sgd_2steps.pickle");
    let trace = shared::import(&std::fs::read(&path).unwrap(), &shared::ImportOptions::default()).unwrap();
    let s = summary(&trace);
    let (_server, url) = static_server(&dist());
    let b = Browser::start(1400, 1000);
    b.goto(&format!("{url}/index.html"));
    b.wait_for("return document.querySelector('#trace-file')", 30, "the page");
    b.upload("#trace-file", &path);
    wait_drawn(&b, "resnet18_sgd_2steps.pickle");

    // Click the timeline at the peak: the largest live allocation is listed first.
    b.click("#timeline .card-head button:nth-of-type(1)"); // zoom to peak
    b.wait_for("return (window.__mtFrames || []).length >= 1", 20, "a zoom frame");
    let clicked = b.exec(
        r#"const c = document.querySelector('#timeline-canvas'); const r = c.getBoundingClientRect();
           const x = r.left + r.width * 0.55; const y = r.top + r.height * 0.6;
           for (const type of ['mousedown', 'mouseup']) c.dispatchEvent(new MouseEvent(type, {clientX: x, clientY: y, bubbles: true, buttons: type === 'mousedown' ? 1 : 0}));
           return true;"#,
        json!([]),
    );
    assert_eq!(clicked, json!(true));
    b.wait_for("return document.querySelectorAll('#live-list tbody tr').length", 20, "the live allocations list");
    let first_size = column(&b, "#live-list", 0)[0].clone();
    // Whatever moment the click landed on, its largest live allocation is a real one of the trace.
    let sizes: std::collections::HashSet<String> = (0..trace.events.len())
        .filter(|&i| trace.events.event_type(i) == shared::EventType::Alloc)
        .map(|i| format_bytes(trace.events.size_bytes[i]))
        .collect();
    assert!(sizes.contains(&first_size), "{first_size} is not an allocation size of the trace");

    // Wheel zoom redraws and records a frame time.
    let frames_before = b.exec("return window.__mtFrames.length", json!([])).as_u64().unwrap();
    b.exec(
        r#"const c = document.querySelector('#timeline-canvas'); const r = c.getBoundingClientRect();
           c.dispatchEvent(new WheelEvent('wheel', {deltaY: -100, clientX: r.left + r.width / 2, clientY: r.top + r.height / 2, bubbles: true, cancelable: true}));"#,
        json!([]),
    );
    b.wait_for(&format!("return window.__mtFrames.length > {frames_before}"), 20, "a wheel frame");
    b.screenshot(&screenshots().join("timeline-zoomed-click.png"));

    // Hover shows the totals at the pointer.
    b.exec(
        r#"const c = document.querySelector('#timeline-canvas'); const r = c.getBoundingClientRect();
           c.dispatchEvent(new MouseEvent('mousemove', {clientX: r.left + r.width * 0.5, clientY: r.top + r.height * 0.5, bubbles: true}));"#,
        json!([]),
    );
    let tip = b.wait_for("return document.querySelector('#timeline .tooltip')?.innerText", 20, "the hover tooltip");
    assert!(tip.as_str().unwrap().contains("allocated"), "{tip}");

    // A bad file: the error panel says what was expected; the loaded trace stays.
    let dir = tmpdir("bad");
    let bad = dir.join("notes.txt");
    std::fs::write(&bad, "these are not the bytes you are looking for").unwrap();
    b.upload("#trace-file", &bad);
    let msg = b.wait_for("return document.querySelector('#error-panel')?.innerText", 30, "the error panel");
    let msg = msg.as_str().unwrap();
    assert!(msg.contains("notes.txt") && msg.contains("expected a PyTorch memory snapshot pickle"), "{msg}");
    assert!(msg.contains("Still showing resnet18_sgd_2steps.pickle"), "{msg}");
    let h2 = b.exec("return document.querySelector('#summary h2').textContent", json!([]));
    assert_eq!(h2, json!("resnet18_sgd_2steps.pickle"));
    b.screenshot(&screenshots().join("error-panel.png"));
    // A truncated snapshot names where it broke.
    let cut = dir.join("cut.pickle");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    b.upload("#trace-file", &cut);
    b.wait_for("return (document.querySelector('#error-panel')?.innerText || '').includes('cut.pickle')", 30, "the truncated file's error");
    let msg = b.exec("return document.querySelector('#error-panel').innerText", json!([]));
    assert!(msg.as_str().unwrap().contains("byte"), "{msg}");
    assert_eq!(s.peak_allocated_bytes, summary(&trace).peak_allocated_bytes);
}

#[test]
fn reports_open_from_a_static_host() {
    let dir = tmpdir("report");
    let path = sample("mlp_adam_3steps.pickle");
    let folder = dir.join("site");
    collector(&["report", path.to_str().unwrap(), "-o", folder.to_str().unwrap()]);
    let single = dir.join("mail.html");
    collector(&["report", path.to_str().unwrap(), "--single-file", "-o", single.to_str().unwrap()]);
    let (_server, url) = static_server(&dir);
    let b = Browser::start(1400, 1000);
    for page in ["site/index.html", "mail.html"] {
        b.goto(&format!("{url}/{page}"));
        wait_drawn(&b, "mlp_adam_3steps.pickle");
        check_views(&b, &path);
        b.screenshot(&screenshots().join(format!("report-{}.png", page.replace('/', "-"))));
    }
    // The single file needs nothing beside it.
    let html = std::fs::read_to_string(&single).unwrap();
    assert!(!html.contains("src=\"") && !html.contains("worker_loader.js\")"), "the single file refers to other files");
    let v: Value = json!(std::fs::metadata(&single).unwrap().len());
    assert!(v.as_u64().unwrap() > 1_000_000);
}

/// Pixels of `canvas#id` that differ from its first pixel.
fn painted(b: &Browser, id: &str) -> u64 {
    let script = format!(
        "const c = document.getElementById('{id}'); if (!c) return 0; const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let n = 0; for (let i = 0; i < d.length; i += 4) if (d[i] !== d[0] || d[i+1] !== d[1] || d[i+2] !== d[2]) n++; return n;"
    );
    b.exec(&script, json!([])).as_u64().unwrap_or(0)
}

#[test]
fn the_served_viewer_follows_a_live_trace() {
    let _ = dist();
    let s = server::Server::start(&tmpdir("serve"), &["--token", "e2e-token"]);
    let b = Browser::start(1400, 1000);
    b.goto(&format!("{}/?token=e2e-token", s.base));
    b.wait_for("return document.querySelector('#srv-trace') && document.querySelector('#server .hint')?.textContent.includes('default device cpu')", 30, "the server panel");
    // Trace through the page's form.
    b.exec(
        "document.getElementById('srv-model').value = 'resnet18';
         document.getElementById('srv-shape').value = '2,3,64,64';
         document.getElementById('srv-batch').value = '2';
         document.getElementById('srv-iterations').value = '8';",
        json!([]),
    );
    b.click("#srv-trace");
    // Drawn while it runs.
    b.wait_for(
        "const d = document.body.dataset; return d.liveState === 'running' && +d.liveBatches >= 2 && +d.liveDrawn > 0",
        120,
        "live memory while the trace runs",
    );
    let live_pixels = painted(&b, "live-canvas");
    let running_text = b.exec("return document.getElementById('live').innerText", json!([]));
    b.screenshot(&screenshots().join("serve-live.png"));
    assert!(live_pixels > 2000, "the live chart is blank ({live_pixels} painted pixels)");
    assert!(running_text.as_str().unwrap().contains("running"), "{running_text}");
    // Then the stored trace opens in every view.
    b.wait_for("return document.body.dataset.liveState === 'done'", 300, "the trace to finish");
    let (_, list) = s.get_json("/api/trace/list");
    let row = &list["traces"][0];
    let id = row["trace_id"].as_str().unwrap();
    wait_drawn(&b, id);
    let text = b.exec("return document.querySelector('#summary').innerText", json!([]));
    let peak = format_bytes(row["peak_allocated_bytes"].as_u64().unwrap());
    assert!(text.as_str().unwrap().contains(&peak), "the summary lacks the server's peak {peak}: {text}");
    let charts = b.exec(PAINTED, json!([]));
    for id in ["timeline-canvas", "flame-canvas", "rank-canvas"] {
        assert!(charts[id].as_u64().unwrap_or(0) > 2000, "{id} blank: {charts}");
    }
    b.wait_for(&format!("return document.querySelector('#server-traces')?.innerText.includes({})", json!(id)), 30, "the stored trace in the list");
    b.screenshot(&screenshots().join("serve-done.png"));
    // The API docs render from the binary alone (the browser has no network).
    b.goto(&format!("{}/api/docs?token=e2e-token", s.base));
    b.wait_for("return document.querySelectorAll('.swagger-ui .opblock').length >= 10", 60, "Swagger UI's operations");
    b.screenshot(&screenshots().join("serve-docs.png"));
    b.goto(&format!("{}/api/redoc", s.base));
    b.wait_for("return document.body.innerText.includes('Trace a model now')", 60, "ReDoc's reference");
    b.screenshot(&screenshots().join("serve-redoc.png"));
}
