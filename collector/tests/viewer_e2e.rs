//! End to end in Debian's headless Chromium through chromedriver: the viewer `cargo xtask viewer` built
//! (`dist/`, which `cargo xtask test` builds first) served by a plain static server opens
//! every sample format through its file input, draws every chart (non-blank canvas pixels),
//! shows table rows equal to what `shared` computes natively, answers clicks and zooms, and
//! shows the error panel for a bad file while keeping the trace it had. `collector report`
//! folders and single files open from a static host. Screenshots of every view go to
//! `target/e2e-screenshots/` to be looked at. Served by `collector serve` (with a token), the
//! page traces a model through its form, draws it live from the server's events, then opens
//! the stored trace. Two snapshots chosen together merge as ranks 0 and 1 (Ranks view, rank
//! selector, the two most different ranks compared), and the Compare view compares two traces.
//! A live job of several ranks posted through the API gets a small chart per rank as each
//! rank's points come, and a rank picker.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod server;
mod webdriver;

use serde_json::{json, Value};
use shared::analysis::{layer_stats, summary, LayerMemoryStats};
use shared::units::{format_bytes, format_seconds};
use std::path::{Path, PathBuf};
use std::process::Command;
use webdriver::viewer::{dist, goto_viewer, repo, sample, screenshots, wait_drawn};
use webdriver::{static_server, Browser};

fn tmpdir(name: &str) -> PathBuf {
    server::scratch(&format!("e2e-{name}"))
}

fn collector(args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_collector")).args(args).output().unwrap();
    assert!(out.status.success(), "collector {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A small CPU training trace with operators, tensors and layers (every view has data).
fn native_trace(dir: &Path) -> PathBuf {
    let out = dir.join("mlp.mtrace.json");
    collector(&[
        "trace",
        "--model",
        "mlp",
        "--layers",
        "2",
        "--width",
        "64",
        "--device",
        "cpu",
        "--iterations",
        "3",
        "-q",
        "-o",
        out.to_str().unwrap(),
    ]);
    out
}

/// Non-background pixels of each canvas, by id.
const PAINTED: &str = r#"
const out = {};
for (const c of document.querySelectorAll('canvas.chart')) {
  if (c.offsetParent === null) continue;  // not shown (the simulated segments before a setting is picked)
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let n = 0;
  for (let i = 0; i < d.length; i += 4) if (d[i] !== d[0] || d[i+1] !== d[1] || d[i+2] !== d[2]) n++;
  out[c.id] = n;
}
return out;"#;

fn column(b: &Browser, table: &str, col: usize) -> Vec<String> {
    let v = b.exec(&format!("return [...document.querySelectorAll('{table} tbody tr')].map(r => r.cells[{col}].textContent)"), json!([]));
    serde_json::from_value(v).unwrap()
}

/// The viewer served from `dist/` by a static server, open in a fresh headless browser and
/// ready for a file (the server lives as long as the guard).
fn static_page() -> (webdriver::Guard, Browser) {
    let (server, b, _) = static_page_at(false);
    (server, b)
}

/// The same, served with the headers `collector serve` sends (cross-origin isolated: the page
/// reads a chosen file into shared memory for its worker) when `isolated`; the server's URL too.
fn static_page_at(isolated: bool) -> (webdriver::Guard, Browser, String) {
    let (server, url) = if isolated { webdriver::isolated_static_server(&dist()) } else { static_server(&dist()) };
    let b = Browser::start(1400, 1000);
    goto_viewer(&b, &format!("{url}/index.html"));
    (server, b, url)
}

/// The report's first screen (summary and timeline) was painted before any view below it was
/// drawn, and after its own timeline: those views are built only once it is painted.
fn check_first_screen_first(b: &Browser, file_name: &str) {
    let marks = b.exec(
        "const d = document.body.dataset; return [d.firstScreenMs, d.drawnTimelineMs, d.drawnActiveMs, d.drawnFlameMs, d.drawnFragmentationMs, d.drawnSegmentsMs, d.drawnPoolsMs].map(v => v === undefined || v === '' ? null : Number(v))",
        json!([]),
    );
    let ms: Vec<Option<f64>> = serde_json::from_value(marks).unwrap();
    let first = ms[0].unwrap_or_else(|| panic!("{file_name}: no data-first-screen-ms"));
    if let Some(timeline) = ms[1] {
        assert!(timeline <= first, "{file_name}: first screen painted at {first} ms, before its timeline ({timeline} ms)");
    }
    for (below, name) in ms[2..].iter().zip(["active", "flame", "fragmentation", "segments", "pools"]) {
        if let Some(at) = below {
            assert!(first <= *at, "{file_name}: the {name} chart drawn at {at} ms, before the first screen was painted ({first} ms)");
        }
    }
    // The timeline's answer comes with the overview: it is there when the chart asks, and the
    // page neither waits for it nor asks the worker.
    if ms[1].is_some() {
        let marks =
            b.exec("return (window.__mtMarks || []).filter(m => /^(prefetched|awaits|ask|draw|drawn) timeline/.test(m[0]))", json!([]));
        let marks: Vec<(String, f64)> = serde_json::from_value(marks).unwrap();
        let before: Vec<&str> = marks.iter().filter(|(_, at)| *at <= first).map(|(l, _)| l.as_str()).collect();
        assert!(
            before.first() == Some(&"prefetched timeline"),
            "{file_name}: the timeline's answer did not come with the overview: {marks:?}"
        );
    }
    // The worker makes the answers below the first screen after the page has painted it (so
    // as not to take a core from that paint): they arrive after it.
    let marks = b.exec("return (window.__mtMarks || []).filter(m => /^prefetched (active|flame|segments|pools)/.test(m[0]))", json!([]));
    let marks: Vec<(String, f64)> = serde_json::from_value(marks).unwrap();
    if ms[2].is_some() {
        assert!(
            marks.iter().any(|(l, _)| l.starts_with("prefetched active")),
            "{file_name}: no prefetched Active Memory answer: {marks:?}"
        );
    }
    for (label, at) in marks {
        assert!(first <= at, "{file_name}: {label} at {at} ms, before the first screen was painted ({first} ms)");
    }
}

/// The layer table's default order: peak allocated, highest first; ties in name order.
fn native_layer_order(trace: &shared::Trace) -> Vec<LayerMemoryStats> {
    let mut rows: Vec<LayerMemoryStats> = layer_stats(trace).into_values().collect();
    rows.sort_by_key(|r| std::cmp::Reverse(r.peak_allocated));
    rows
}

/// Checks every view against what `shared` computes natively for the same file. Which charts
/// must be drawn follows from the data: memory events give the timeline, active memory and
/// flame graph, and reserved memory the fragmentation chart; operators the rank chart;
/// allocator segments the segment view.
fn check_views(b: &Browser, path: &Path) {
    let bytes = std::fs::read(path).unwrap();
    let trace = shared::import(&bytes, &shared::ImportOptions::default()).unwrap();
    let name = path.file_name().unwrap().to_str().unwrap();
    let mut expect = Vec::new();
    let s = summary(&trace);
    if !trace.events.is_empty() {
        expect.extend(["timeline-canvas", "active-canvas", "flame-canvas"]);
        if s.peak_reserved_bytes > 0 {
            expect.push("fragmentation-canvas");
        } else {
            // Nothing reserved (a CPU trace): a line says why there is no chart.
            let text = b.exec("return document.querySelector('#fragmentation').innerText", json!([]));
            assert!(text.as_str().unwrap().contains("Nothing was reserved"), "{name}: fragmentation section: {text}");
        }
    }
    if shared::analysis::profile::graph_profile(&trace).is_ok() {
        expect.push("rank-canvas");
    }
    if shared::analysis::has_segments(&trace) {
        expect.extend(["segments-canvas", "pools-canvas"]);
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
    let text = b.exec("return document.querySelector('#summary').innerText", json!([]));
    assert!(text.as_str().unwrap().contains(&format_bytes(s.peak_allocated_bytes)), "{name}: summary lacks the peak: {text}");
    // The importer's notes, as `collector summary` prints them.
    let notes = b.exec("return [...document.querySelectorAll('#import-notes li')].map(l => l.textContent)", json!([]));
    assert_eq!(notes, json!(trace.meta.warnings), "{name}: the importer's notes");
    if shared::analysis::has_segments(&trace) {
        // The segments at the peak (or before any event) as the native replay gives them.
        let segments = match s.peak_event_index {
            Some(i) => shared::analysis::segments_at(&trace, i, 0),
            None => shared::analysis::segments_before_events(&trace, 0),
        };
        let largest_free = segments
            .iter()
            .flat_map(|g| &g.blocks)
            .filter(|b| b.state == shared::model::BlockState::Free)
            .map(|b| b.size_bytes)
            .max()
            .unwrap_or(0);
        let stats = b.exec("return document.querySelector('#segments-stats').innerText", json!([]));
        let want = format!("(largest free block {}).", format_bytes(largest_free));
        assert!(stats.as_str().unwrap().ends_with(&want), "{name}: segments: {stats}, expected {want}");
        // A setting picked: the segments the caching allocator would have had under it are
        // drawn beside the recorded ones, with their own line; cleared, they go.
        let pick = |v: &str| {
            b.exec(
                "const i = document.querySelector('#segments-setting'); i.value = arguments[0]; i.dispatchEvent(new Event('change')); return null",
                json!([v]),
            )
        };
        pick("expandable_segments:True");
        b.wait_for(
            "const c = document.querySelector('#segments-simulated'); const l = document.querySelector('#segments-simulated-stats');
             return c && c.offsetParent !== null && l && l.innerText.startsWith('Under expandable_segments:True: ')",
            30,
            "the simulated segments",
        );
        let painted = b.exec(PAINTED, json!([]));
        assert!(painted["segments-simulated"].as_u64().unwrap_or(0) > 2000, "{name}: the simulated segments are blank: {painted}");
        pick("expandable_segment:True");
        let error =
            b.wait_for("const e = document.querySelector('#segments-setting-error'); return e && e.innerText", 30, "the setting's error");
        assert!(error.as_str().unwrap_or("").contains("expandable_segment"), "{name}: {error}");
        pick("");
        b.wait_for("return document.querySelector('#segments-simulated').offsetParent === null", 30, "the simulated segments gone");
    }
    if trace.events.is_empty() {
        // Nothing to call a leak.
        let shown = b.exec("return document.querySelector('#leaks') === null", json!([]));
        assert_eq!(shown, json!(true), "{name}: a leaks section without events");
        return;
    }
    // The leak verdict is the native one.
    let leaks = shared::analysis::leaks::leaks(&trace, 8);
    let shown = b.exec("return document.querySelector('#leaks').innerText", json!([]));
    assert!(shown.as_str().unwrap().contains(&leaks.verdict), "{name}: leaks section says {shown}, expected {}", leaks.verdict);
    // Too few iterations: the verdict says how many and from what, once.
    let found = format!("{} found from", leaks.iterations);
    let iterations = format!("{} iterations from", leaks.iterations);
    let said = shown.as_str().unwrap();
    let counts = said.matches(&found).count() + said.matches(&iterations).count();
    assert_eq!(counts, 1, "{name}: the leaks section gives the iteration count {counts} times: {said}");
    // The peak's time, with its layer when it has one.
    let at = match &s.peak_layer {
        Some(layer) => format!("{} ({layer})", format_seconds(s.peak_time_s)),
        None => format_seconds(s.peak_time_s),
    };
    let shown_at = b.exec(
        "return [...document.querySelectorAll('#summary dt')].find(d => d.textContent === 'at')?.nextSibling?.textContent",
        json!([]),
    );
    assert_eq!(shown_at.as_str(), Some(at.as_str()), "{name}: the peak's time");
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
    for id in ["summary", "timeline", "active", "flame", "rank", "tables", "fragmentation", "segments", "pools"] {
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
    collector(&[
        "sweep",
        "--model",
        "mlp",
        "--layers",
        "1",
        "--width",
        "32",
        "--device",
        "cpu",
        "--iterations",
        "2",
        "--batch-sizes",
        "4,8,16",
        "-o",
        sweep_dir.to_str().unwrap(),
    ]);
    let (_server, b) = static_page();
    // Warm, the page gives the worker its charts' widths with a file, and the worker sends the
    // first answers ahead (`check_first_screen_first` checks when).
    b.wait_for("return document.body.dataset.warm", 60, "the page's warm-up");
    let shots = screenshots();
    let cases = [
        sample("resnet18_sgd_2steps.pickle"),
        sample("convnet_profiler_trace.json"),
        sample("dftracer_sample.pfw.gz"),
        native.clone(),
        sample("no_history.pickle"),
    ];
    for path in &cases {
        b.upload("#trace-file", path);
        let name = path.file_name().unwrap().to_str().unwrap();
        wait_drawn(&b, name);
        check_first_screen_first(&b, name);
        check_views(&b, path);
        screenshot_sections(&b, &shots, name);
    }

    // The native trace: activation rows equal the native profile's.
    b.upload("#trace-file", &native);
    wait_drawn(&b, "mlp.mtrace.json");
    let trace = traceio::files::load_trace(&native, &shared::ImportOptions::default()).unwrap();
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
    b.wait_for(
        "return document.body.dataset.drawnMs && document.querySelector('#summary h2')?.textContent === 'sweep.json'",
        60,
        "the sweep",
    );
    let painted = b.exec(PAINTED, json!([]));
    assert!(painted["rank-canvas"].as_u64().unwrap() > 2000, "{painted}");
    b.screenshot(&shots.join("sweep.png"));
}

#[test]
fn click_zoom_and_bad_files() {
    let path = sample("resnet18_sgd_2steps.pickle");
    let trace = shared::import(&std::fs::read(&path).unwrap(), &shared::ImportOptions::default()).unwrap();
    let s = summary(&trace);
    let (_server, b) = static_page();
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
    // Who holds the live bytes then: a snapshot records no holders, so they are inferred
    // (its parameters from their lifetimes), and the table says so.
    b.wait_for("return document.querySelectorAll('#holders-at tbody tr').length", 20, "who holds the live bytes");
    let kinds = b.exec("return [...document.querySelectorAll('#holders-at tbody tr')].map(r => r.dataset.holder)", json!([]));
    assert!(kinds.as_array().unwrap().iter().any(|k| k == "parameter"), "{kinds}");
    let hint = b.exec("return document.querySelector('#holders-at .hint').textContent", json!([]));
    assert!(hint.as_str().unwrap().contains("inferred"), "{hint}");

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
    // A file larger than a page can hold is refused before it is read (a sparse file: no
    // bytes on disk), naming the native tools that open it.
    let huge = dir.join("huge.pickle");
    std::fs::File::create(&huge).unwrap().set_len(4_100_000_000).unwrap();
    b.upload("#trace-file", &huge);
    b.wait_for("return (document.querySelector('#error-panel')?.innerText || '').includes('huge.pickle')", 30, "the huge file's error");
    let msg = b.exec("return document.querySelector('#error-panel').innerText", json!([]));
    let msg = msg.as_str().unwrap();
    assert!(msg.contains("4.1 GB") && msg.contains("collector summary huge.pickle"), "{msg}");
    assert!(msg.contains("collector serve --max-upload-mb") && msg.contains("on server"), "{msg}");
    assert!(msg.contains("Still showing resnet18_sgd_2steps.pickle"), "{msg}");
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
    b.wait_for(
        &format!("return document.querySelector('#server-traces')?.innerText.includes({})", json!(id)),
        30,
        "the stored trace in the list",
    );
    b.screenshot(&screenshots().join("serve-done.png"));
    // The API docs render from the binary alone (the browser has no network).
    b.goto(&format!("{}/api/docs?token=e2e-token", s.base));
    b.wait_for("return document.querySelectorAll('.swagger-ui .opblock').length >= 10", 60, "Swagger UI's operations");
    b.screenshot(&screenshots().join("serve-docs.png"));
    b.goto(&format!("{}/api/redoc", s.base));
    b.wait_for("return document.body.innerText.includes('Trace a model now')", 60, "ReDoc's reference");
    b.screenshot(&screenshots().join("serve-redoc.png"));
}

/// `torch.cuda.max_memory_allocated()` of a sample (tests/data/facts.json).
fn max_allocated(sample_name: &str) -> u64 {
    let facts: Value = serde_json::from_slice(&std::fs::read(repo().join("tests/data/facts.json")).unwrap()).unwrap();
    facts["samples"][sample_name]["max_allocated"].as_u64().unwrap()
}

/// Non-background pixels of the top and bottom halves of `canvas#id`.
fn painted_halves(b: &Browser, id: &str) -> (u64, u64) {
    let v = b.exec(
        "const c = document.getElementById(arguments[0]); const h = c.height / 2; const out = [];
         for (const y of [0, h]) { const d = c.getContext('2d').getImageData(0, y, c.width, h).data; let n = 0;
           for (let i = 0; i < d.length; i += 4) if (d[i] !== d[0] || d[i+1] !== d[1] || d[i+2] !== d[2]) n++; out.push(n); }
         return out;",
        json!([id]),
    );
    (v[0].as_u64().unwrap(), v[1].as_u64().unwrap())
}

fn select(b: &Browser, css: &str, value: &str) {
    b.exec(
        "const s = document.querySelector(arguments[0]); s.value = arguments[1]; s.dispatchEvent(new Event('change', {bubbles: true}));",
        json!([css, value]),
    );
}

/// The timeline's highest allocated level as drawn, once the whole trace is drawn.
fn timeline_top(b: &Browser) -> u64 {
    let v = b.wait_for("return document.getElementById('timeline-canvas')?.dataset.maxAllocated", 30, "the timeline");
    v.as_str().unwrap().parse().unwrap()
}

#[test]
fn rank_files_merge_and_two_traces_compare() {
    let (resnet, mlp) = ("resnet18_sgd_2steps.pickle", "mlp_adam_3steps.pickle");
    let (peak0, peak1) = (max_allocated(resnet), max_allocated(mlp));
    assert_eq!((peak0, peak1), (238078976, 110388224));
    // The samples as the files of two ranks, named as torchrun jobs name them.
    let dir = tmpdir("ranks");
    let (rank0, rank1) = (dir.join("rank0.pickle"), dir.join("rank1.pickle"));
    std::fs::copy(sample(resnet), &rank0).unwrap();
    std::fs::copy(sample(mlp), &rank1).unwrap();
    let (_server, b) = static_page();
    let shots = screenshots();

    // Chosen together (given in reverse order: ranks come from the names): merged.
    b.upload_many("#trace-file", &[&rank1, &rank0]);
    let merged = "rank1.pickle + rank0.pickle";
    wait_drawn(&b, merged);
    let rows = b.exec(
        "return [...document.querySelectorAll('#rank-peaks tbody tr')].map(r => [r.cells[0].textContent, r.cells[1].textContent, r.cells[2].dataset.bytes, r.cells[3].dataset.bytes, r.className])",
        json!([]),
    );
    let facts: Value = serde_json::from_slice(&std::fs::read(repo().join("tests/data/facts.json")).unwrap()).unwrap();
    let reserved = |s: &str| facts["samples"][s]["max_reserved"].as_u64().unwrap().to_string();
    assert_eq!(
        rows,
        json!([
            ["0", "cuda:0 (rank 0)", peak0.to_string(), reserved(resnet), "highest"],
            ["1", "cuda:0 (rank 1)", peak1.to_string(), reserved(mlp), ""]
        ]),
        "the rank peak table"
    );
    let peak_text = b.exec("return document.querySelector('#rank-peaks tbody tr').cells[2].textContent", json!([]));
    assert_eq!(peak_text, json!(format!("{} ★", format_bytes(peak0))));
    // Two curves: one panel per rank, each drawn.
    let (top, bottom) = painted_halves(&b, "ranks-canvas");
    assert!(top > 2000 && bottom > 2000, "rank panels painted: {top}, {bottom}");
    // The merged trace's timeline shows the device with the highest peak: rank 0's.
    assert_eq!(timeline_top(&b), peak0);
    b.exec("document.getElementById('ranks').scrollIntoView()", json!([]));
    b.screenshot(&shots.join("ranks.png"));

    // Rank 1 in every view: its own peak on the timeline and in the summary.
    select(&b, "#rank-select", "1");
    wait_drawn(&b, &format!("{merged} · rank 1"));
    assert_eq!(timeline_top(&b), peak1);
    let summary = b.exec("return document.querySelector('#summary').innerText", json!([]));
    assert!(summary.as_str().unwrap().contains(&format_bytes(peak1)), "{summary}");
    assert_eq!(b.exec("return document.getElementById('rank-select').value", json!([])), json!("1"));
    b.exec("document.getElementById('timeline').scrollIntoView()", json!([]));
    b.screenshot(&shots.join("ranks-rank1-timeline.png"));
    // All ranks again.
    select(&b, "#rank-select", "all");
    wait_drawn(&b, merged);
    assert_eq!(timeline_top(&b), peak0);

    // The two most different ranks, compared.
    // Clicked from script: the sticky header may cover the button where WebDriver would click.
    b.exec("document.getElementById('rank-diff-button').click()", json!([]));
    let delta =
        b.wait_for("return document.querySelector('#rank-diff-peaks .peak-allocated .delta')?.dataset.bytes", 60, "the ranks' diff");
    assert_eq!(delta, json!((peak1 as i64 - peak0 as i64).to_string()));
    assert!(painted(&b, "rank-diff-canvas") > 2000);
    b.exec("document.getElementById('rank-diff-peaks').scrollIntoView()", json!([]));
    b.screenshot(&shots.join("ranks-diff.png"));

    // Compare: the open trace (A) with another file (B).
    b.upload("#trace-file", &sample(resnet));
    wait_drawn(&b, resnet);
    assert_eq!(b.exec("return !!document.getElementById('ranks')", json!([])), json!(false), "a single trace has no Ranks view");
    b.upload("#compare-file", &sample(mlp));
    let delta = b.wait_for("return document.querySelector('#compare-peaks .peak-allocated .delta')?.dataset.bytes", 60, "the comparison");
    assert_eq!(delta, json!((110388224i64 - 238078976i64).to_string()));
    let cells = b.exec("return [...document.querySelectorAll('#compare-peaks .peak-allocated td')].map(c => c.textContent)", json!([]));
    assert_eq!(
        cells,
        json!(["peak allocated", format_bytes(peak0), format_bytes(peak1), format!("−{} (−127690752 B)", format_bytes(peak0 - peak1))])
    );
    let notes = b.exec("return document.getElementById('compare-notes').innerText", json!([]));
    assert!(notes.as_str().unwrap().contains("the layers do not match"), "{notes}");
    assert!(painted(&b, "compare-canvas") > 2000);
    let head = b.exec("return document.querySelector('#compare .card-head').innerText", json!([]));
    assert!(head.as_str().unwrap().contains(resnet) && head.as_str().unwrap().contains(mlp), "{head}");
    b.exec("document.getElementById('compare').scrollIntoView()", json!([]));
    b.screenshot(&shots.join("compare.png"));

    // Two files of the same rank: refused with why; the page keeps what it showed.
    let (a, c) = (dir.join("a"), dir.join("c"));
    for d in [&a, &c] {
        std::fs::create_dir_all(d).unwrap();
        std::fs::copy(sample(mlp), d.join("rank0.pickle")).unwrap();
    }
    b.upload_many("#trace-file", &[&a.join("rank0.pickle"), &c.join("rank0.pickle")]);
    let msg = b.wait_for("return document.querySelector('#error-panel')?.innerText", 60, "the merge error");
    let msg = msg.as_str().unwrap();
    assert!(msg.contains("rank 0 is given twice") && msg.contains(&format!("Still showing {resnet}")), "{msg}");
    assert_eq!(b.exec("return document.querySelector('#summary h2').textContent", json!([])), json!(resnet));
    assert_eq!(b.exec("return !!document.getElementById('compare-peaks')", json!([])), json!(true), "the comparison stays");
    b.exec("window.scrollTo(0, 0)", json!([]));
    b.screenshot(&shots.join("ranks-merge-error.png"));

    merge_anyway_when_far_apart(&b, &dir, &rank0, (peak0, peak1));
}
/// Rank 1 recorded ten minutes after rank 0: refused as another run, merged when asked, each
/// rank with its own peak.
fn merge_anyway_when_far_apart(b: &Browser, dir: &Path, rank0: &Path, (peak0, peak1): (u64, u64)) {
    let mlp = "mlp_adam_3steps.pickle";
    let mut later = shared::import(&std::fs::read(sample(mlp)).unwrap(), &shared::ImportOptions::default()).unwrap();
    later.events.ts_ns.iter_mut().for_each(|t| *t += 600_000_000_000);
    later.scopes.iter_mut().for_each(|s| (s.start_ns, s.end_ns) = (s.start_ns + 600_000_000_000, s.end_ns + 600_000_000_000));
    let later_path = dir.join("later.rank1.mtrace.json");
    let mut bytes = Vec::new();
    shared::export::native::write(&later, &mut bytes).unwrap();
    std::fs::write(&later_path, bytes).unwrap();
    b.upload_many("#trace-file", &[rank0, &later_path]);
    b.wait_for(
        "return (document.querySelector('#error-panel')?.innerText || '').includes('recorded at different times')",
        60,
        "the disjoint refusal",
    );
    b.exec("document.getElementById('merge-anyway').click()", json!([]));
    wait_drawn(b, "rank0.pickle + later.rank1.mtrace.json");
    let warnings = b.exec("return document.getElementById('rank-warnings').innerText", json!([]));
    assert!(warnings.as_str().unwrap().contains("were recorded far apart in time; merged as asked"), "{warnings}");
    let peaks = b.exec("return [...document.querySelectorAll('#rank-peaks tbody tr')].map(r => r.cells[2].dataset.bytes)", json!([]));
    assert_eq!(peaks, json!([peak0.to_string(), peak1.to_string()]));
}
#[test]
fn the_served_viewer_compares_two_stored_traces() {
    let _ = dist();
    let s = server::Server::start(&tmpdir("serve-compare"), &[]);
    let (resnet, mlp) = ("resnet18_sgd_2steps.pickle", "mlp_adam_3steps.pickle");
    let upload = |name: &str| {
        let (code, v) = s.post_bytes(&format!("/api/trace/upload?filename={name}"), &std::fs::read(sample(name)).unwrap());
        assert_eq!(code, 200, "{v}");
        v["trace_id"].as_str().unwrap().to_owned()
    };
    let (a, b) = (upload(resnet), upload(mlp));
    let browser = Browser::start(1400, 1000);
    browser.goto(&format!("{}/", s.base));
    browser.wait_for("return document.querySelectorAll('#srv-compare-a option').length === 2", 30, "two stored traces to compare");
    browser.exec(
        "document.getElementById('srv-compare-a').value = arguments[0]; document.getElementById('srv-compare-b').value = arguments[1];
         document.getElementById('srv-compare').click();",
        json!([a, b]),
    );
    let delta =
        browser.wait_for("return document.querySelector('#compare-peaks .peak-allocated .delta')?.dataset.bytes", 60, "the server's diff");
    assert_eq!(delta, json!((max_allocated(mlp) as i64 - max_allocated(resnet) as i64).to_string()));
    let head = browser.exec("return document.querySelector('#compare .card-head').innerText", json!([]));
    assert!(head.as_str().unwrap().contains(&a) && head.as_str().unwrap().contains(&b), "{head}");
    let notes = browser.exec("return document.getElementById('compare-notes').innerText", json!([]));
    assert!(notes.as_str().unwrap().contains("the layers do not match"), "{notes}");
    assert!(painted(&browser, "compare-canvas") > 2000);
    // A trace that is not there: the server's reason, in the panel.
    browser.exec(
        "document.getElementById('srv-compare-b').insertAdjacentHTML('beforeend', '<option value=\"gone\">gone</option>');
         document.getElementById('srv-compare-b').value = 'gone'; document.getElementById('srv-compare').click();",
        json!([]),
    );
    let msg = browser.wait_for("return document.querySelector('#server .server-message')?.innerText", 30, "the server's refusal");
    assert!(msg.as_str().unwrap().contains("Trace gone not found"), "{msg}");
    browser.exec("document.getElementById('compare').scrollIntoView()", json!([]));
    browser.screenshot(&screenshots().join("serve-compare.png"));
}

/// A torchrun job from the page (2 ranks, FSDP2 on the CPU with gloo): the live view gets
/// each rank's memory as its own line, and the finished trace opens with both ranks, whose
/// peaks in the Ranks table are the stored trace's per-rank peaks.
#[test]
fn the_served_viewer_follows_every_rank_of_a_distributed_job() {
    let _ = dist();
    let s = server::Server::start(&tmpdir("serve-ranks"), &[]);
    let b = Browser::start(1400, 1000);
    b.goto(&s.base);
    b.wait_for(
        "return document.querySelector('#srv-trace') && document.querySelector('#server .hint')?.textContent.includes('default device')",
        30,
        "the server panel",
    );
    b.exec(
        "document.getElementById('srv-model').value = 'mlp';
         document.getElementById('srv-iterations').value = '3';
         document.getElementById('srv-device').value = 'cpu';
         document.getElementById('srv-world').value = '2';
         document.getElementById('srv-strategy').value = 'fsdp';",
        json!([]),
    );
    b.click("#srv-trace");
    b.wait_for("return document.body.dataset.liveRanks === '2'", 180, "memory of both ranks");
    b.wait_for("return document.body.dataset.liveState === 'done'", 300, "the job to finish");
    let (_, list) = s.get_json("/api/trace/list");
    let id = list["traces"][0]["trace_id"].as_str().unwrap().to_owned();
    wait_drawn(&b, &id);
    let (_, stored) = s.get(&format!("/api/trace/{id}"));
    let trace = shared::import(stored.as_bytes(), &shared::ImportOptions::default()).unwrap();
    let expected: Vec<String> = shared::analysis::device_peaks(&trace).iter().map(|p| p.peak_allocated_bytes.to_string()).collect();
    assert_eq!(expected.len(), 2);
    b.wait_for("return document.querySelectorAll('#rank-peaks tbody tr').length === 2", 30, "the Ranks view");
    let shown = b.exec("return [...document.querySelectorAll('#rank-peaks tbody tr')].map(r => r.cells[2].dataset.bytes)", json!([]));
    assert_eq!(shown, json!(expected));
    b.screenshot(&screenshots().join("serve-ranks.png"));
}

/// Non-background pixels of each rank's small multiple in the live view, by rank.
const PAINTED_MULTIPLES: &str = r#"
const out = {};
for (const c of document.querySelectorAll('#live-multiples canvas[data-rank]')) {
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let n = 0;
  for (let i = 0; i < d.length; i += 4) if (d[i] !== d[0] || d[i+1] !== d[1] || d[i+2] !== d[2]) n++;
  out[c.dataset.rank] = n;
}
return out;"#;

/// Waits until the live view has one small multiple per rank of `ranks`, each drawn (and
/// drawn at its own size, not squeezed from a wider bitmap), and no other.
fn wait_multiples(b: &Browser, ranks: &[u32]) -> Value {
    let want = json!(ranks.iter().map(u32::to_string).collect::<Vec<_>>());
    b.wait_for(
        &format!(
            "const d = document.body.dataset;
             const got = [...document.querySelectorAll('#live-multiples canvas[data-rank]')].map(c => c.dataset.rank);
             return d.liveMultiples === '{n}' && d.liveRanks === '{n}' && JSON.stringify(got) === {want:?};",
            n = ranks.len(),
            want = want.to_string()
        ),
        60,
        &format!("{} small multiples", ranks.len()),
    );
    let mut painted = json!({});
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        painted = b.exec(PAINTED_MULTIPLES, json!([]));
        if ranks.iter().all(|r| painted[r.to_string()].as_u64().unwrap_or(0) > 800) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    for r in ranks {
        let n = painted[r.to_string()].as_u64().unwrap_or(0);
        assert!(n > 800, "rank {r}'s small multiple is blank ({n} painted pixels): {painted}");
    }
    // Each bitmap is the size of its box on the page (not a wider one squeezed into it).
    let sizes = b.exec(
        "return [...document.querySelectorAll('#live-multiples canvas[data-rank]')].map(c => [c.width, c.height, c.clientWidth, c.clientHeight])",
        json!([]),
    );
    for s in sizes.as_array().unwrap() {
        let v: Vec<i64> = s.as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
        assert!(
            (v[0] - v[2]).abs() <= 1 && (v[1] - v[3]).abs() <= 1 && v[2] >= 150,
            "a small multiple's bitmap is {}x{} px, shown {}x{} px: {sizes}",
            v[0],
            v[1],
            v[2],
            v[3]
        );
    }
    painted
}

/// A live trace of a job of several ranks registered through the API (as
/// `collector trace --serve` does on each node) and followed by the page (`?follow=ID`): a
/// small multiple appears per rank as its first points come (ranks 0 and 1, then 2 and 3),
/// all drawn; the rank picker and a click on a small multiple draw one rank large, and the
/// picker draws them all again; an `error` line of each node ends the job, which the page
/// shows failed with the reason.
#[test]
fn the_served_viewer_shows_each_rank_of_a_live_job_as_it_comes() {
    let _ = dist();
    let s = server::Server::start(&tmpdir("serve-live-ranks"), &["--token", "e2e-token"]);
    let (code, a) =
        s.post_json("/api/trace/live", &json!({"model_name": "train.py", "device": "live", "job": "e2e-job", "nnodes": 2, "node_rank": 0}));
    assert_eq!(code, 202, "{a}");
    let id = a["trace_id"].as_str().unwrap().to_owned();
    let b = Browser::start(1400, 1000);
    b.goto(&format!("{}/?follow={id}&token=e2e-token", s.base));
    b.wait_for("return document.body.dataset.liveState === 'running' && document.getElementById('live-canvas')", 60, "the live view");
    // Each rank's memory in two lines of 40 points, 25 ms apart; rank r peaks higher than r − 1.
    const MIB: u64 = 1 << 20;
    let points = |r: u32, from: u64| -> Vec<[u64; 3]> {
        (from..from + 40)
            .map(|i| [i * 25_000_000, (u64::from(r) + 1) * 8 * MIB * (1 + i % 12), (u64::from(r) + 1) * 8 * MIB * 13])
            .collect()
    };
    let post = |r: u32| {
        for from in [0, 40] {
            let (code, v) = s.post_json(&format!("/api/trace/live/{id}"), &json!({"kind": "memory", "points": points(r, from), "rank": r}));
            assert_eq!(code, 200, "{v}");
        }
    };
    post(0);
    post(1);
    wait_multiples(&b, &[0, 1]);
    b.wait_for("return document.body.dataset.liveDrawn === '160'", 30, "both ranks in the large chart");
    // New points update the charts in place: the picker (which may be open) and the canvases
    // are kept.
    let kept = "['live-rank-picker', 'live-canvas', 'live-multiples'].map(id => document.getElementById(id))
        .concat([document.querySelector('#live-multiples canvas[data-rank=\"0\"]')])";
    b.exec(&format!("window.__mtKept = {kept}; return true"), json!([]));
    post(2);
    post(3);
    wait_multiples(&b, &[0, 1, 2, 3]);
    b.wait_for("return document.body.dataset.liveDrawn === '320'", 30, "every rank in the large chart");
    let same = b.exec(&format!("const now = {kept}; return now.map((e, i) => e !== null && e === window.__mtKept[i])"), json!([]));
    assert_eq!(same, json!([true, true, true, true]), "the picker, the live chart, the small multiples and rank 0's are the same elements");
    assert_eq!(b.exec("return document.body.dataset.liveBatches", json!([])), json!("8"));
    let all = painted(&b, "live-canvas");
    assert!(all > 2000, "the live chart of every rank is blank ({all} painted pixels)");
    let text = b.exec("return document.getElementById('live').innerText", json!([]));
    let text = text.as_str().unwrap();
    assert!(text.contains("4 ranks: rank 0 peak"), "{text}");
    assert!(text.contains(&format!("rank 3 peak {}", format_bytes(4 * 8 * MIB * 12))), "{text}");
    let options = b.exec("return [...document.querySelectorAll('#live-rank-picker option')].map(o => o.value)", json!([]));
    assert_eq!(options, json!(["", "0", "1", "2", "3"]));
    // The live view just under the page's sticky header.
    b.exec("window.scrollTo(0, document.getElementById('live').getBoundingClientRect().top + window.scrollY - 70)", json!([]));
    b.screenshot(&screenshots().join("serve-live-ranks.png"));

    // One rank large, from the picker: its 80 points, its small multiple marked.
    select(&b, "#live-rank-picker", "2");
    b.wait_for("const d = document.body.dataset; return d.livePick === '2' && d.liveDrawn === '80'", 30, "rank 2 drawn large");
    assert!(painted(&b, "live-canvas") > 2000, "rank 2's live chart is blank");
    let selected = b.exec("return [...document.querySelectorAll('#live-multiples canvas.selected')].map(c => c.dataset.rank)", json!([]));
    assert_eq!(selected, json!(["2"]));
    // More points of the picked rank: the large chart keeps drawing that rank alone.
    let (code, v) = s.post_json(&format!("/api/trace/live/{id}"), &json!({"kind": "memory", "points": points(2, 80), "rank": 2}));
    assert_eq!(code, 200, "{v}");
    b.wait_for("return document.body.dataset.liveDrawn === '120'", 30, "rank 2's new points drawn large");
    assert_eq!(b.exec("return document.getElementById('live-rank-picker').value", json!([])), json!("2"));
    b.screenshot(&screenshots().join("serve-live-rank2.png"));
    // Another, from a click on its small multiple (from script: the sticky header may cover it).
    b.exec("document.querySelector('#live-multiples canvas[data-rank=\"3\"]').click()", json!([]));
    b.wait_for("const d = document.body.dataset; return d.livePick === '3' && d.liveDrawn === '80'", 30, "rank 3 drawn large");
    assert_eq!(b.exec("return document.getElementById('live-rank-picker').value", json!([])), json!("3"));
    assert!(painted(&b, "live-canvas") > 2000, "rank 3's live chart is blank");
    // Every rank again.
    select(&b, "#live-rank-picker", "");
    b.wait_for("const d = document.body.dataset; return d.livePick === 'all' && d.liveDrawn === '360'", 30, "every rank overlaid again");
    let selected = b.exec("return document.querySelectorAll('#live-multiples canvas.selected').length", json!([]));
    assert_eq!(selected, json!(0));
    assert!(painted(&b, "live-canvas") > 2000, "the live chart of every rank is blank");

    // Both nodes fail: the job ends failed, the page says why and draws no more.
    for node in 0..2 {
        let (code, v) =
            s.post_json(&format!("/api/trace/live/{id}?node={node}"), &json!({"kind": "error", "class": "invalid", "detail": "e2e done"}));
        assert_eq!(code, 200, "{v}");
    }
    b.wait_for("return document.body.dataset.liveState === 'failed'", 60, "the job to fail");
    let text = b.wait_for("return document.querySelector('#live .server-message')?.innerText", 30, "the reason");
    assert!(text.as_str().unwrap().contains("e2e done"), "{text}");
    let left = b.exec("return [!!document.getElementById('live-canvas'), !!document.getElementById('live-multiples'), !!document.getElementById('live-rank-picker')]", json!([]));
    assert_eq!(left, json!([false, false, false]), "a finished job's live charts are gone");
}

/// A trace that ran out of memory opens with the explanation above everything else; a trace
/// with operators gets the advice, each suggestion with the predicted peak `collector advise`
/// computes, and a budget below its weights says it cannot be met.
#[test]
fn out_of_memory_first_and_advice_with_predictions() {
    let (_server, b) = static_page();
    b.upload("#trace-file", &sample("oom_program.mtrace.json"));
    wait_drawn(&b, "oom_program.mtrace.json");
    let order = b.exec("return [...document.querySelectorAll('section.card')].map(s => s.id).slice(0, 2)", json!([]));
    assert_eq!(order[0], json!("oom"), "{order}");
    let verdict = b.exec("return document.getElementById('oom-verdict').textContent", json!([]));
    assert!(
        verdict.as_str().unwrap().contains("a request of 2.00 GiB failed with 125.41 MiB allocated and 138.00 MiB reserved"),
        "{verdict}"
    );
    b.screenshot(&screenshots().join("oom.png"));

    let dir = tmpdir("advice");
    let path = native_trace(&dir);
    b.upload("#trace-file", &path);
    wait_drawn(&b, "mlp.mtrace.json");
    assert_eq!(b.exec("return document.getElementById('oom')", json!([])), Value::Null, "no out-of-memory section");
    b.wait_for("return document.querySelectorAll('#advice-table tbody tr').length > 0", 60, "the advice");
    let trace = shared::import(&std::fs::read(&path).unwrap(), &shared::ImportOptions::default()).unwrap();
    let native = shared::analysis::advice::advise(&trace, &shared::analysis::advice::AdviceOptions { top: 10, ..Default::default() });
    let expected: Vec<String> = native.suggestions.iter().map(|s| s.predicted_peak_bytes.to_string()).collect();
    assert!(!expected.is_empty());
    let shown = b.exec("return [...document.querySelectorAll('#advice-table tbody tr')].map(r => r.cells[2].dataset.bytes)", json!([]));
    assert_eq!(shown, json!(expected));
    b.exec("const i = document.getElementById('advice-budget'); i.value = '1KiB'; i.dispatchEvent(new Event('input'));", json!([]));
    b.click("#advice-button");
    b.wait_for(
        "return document.querySelector('#advice .sub')?.textContent.includes('budget 1.00 KiB cannot be met')",
        60,
        "the budget's answer",
    );
    b.exec("document.getElementById('advice').scrollIntoView()", json!([]));
    b.screenshot(&screenshots().join("advice.png"));
}

/// A trace recorded with the device ledger (an H200: a model, a 1-rank NCCL group, a raw
/// 256 MiB cudaMalloc) draws its sources outside PyTorch as bands above the timeline's
/// reserved bytes, the ones the native ledger names.
#[test]
fn the_device_ledger_draws_its_sources_above_the_timeline() {
    let (_server, b) = static_page();
    let path = repo().join("tests/data/ledger/probe.mtrace.json.gz");
    b.upload("#trace-file", &path);
    wait_drawn(&b, "probe.mtrace.json.gz");
    let shown = b.wait_for("return document.getElementById('timeline-canvas')?.dataset.ledgerSources", 30, "the ledger's bands");
    let shown: Vec<&str> = shown.as_str().unwrap().split(',').collect();
    let trace = shared::import(&std::fs::read(&path).unwrap(), &shared::ImportOptions::default()).unwrap();
    let at = shared::analysis::ledger::moment(&trace, "held").unwrap();
    let native = shared::analysis::ledger::ledger_at(&trace, at, None).unwrap();
    for s in native.sources.iter().filter(|s| s.bytes >= 1 << 20 && s.source != "pytorch_reserved" && s.source != "other_processes") {
        assert!(shown.contains(&s.source.as_str()), "{} ({} B at the mark) not drawn: {shown:?}", s.source, s.bytes);
    }
    assert!(shown.contains(&"cuda_context") && shown.contains(&"nccl"), "{shown:?}");
    b.screenshot(&screenshots().join("ledger.png"));
}

/// The Active Memory Timeline's answer for the whole of `name`, as the worker gives it to a
/// canvas `width` pixels wide, and how many allocations the trace's shown device makes.
fn native_active(name: &str, width: u32) -> (shared::analysis::active::ActiveTimeline, usize) {
    use shared::explore::{Opened, Response, Session};
    let Opened::Trace(mut session, overview) = Session::open(name, &std::fs::read(sample(name)).unwrap(), |_| {}).unwrap() else {
        panic!("a sweep")
    };
    let Response::Active(a) = session.answer(&viewer_active_request(overview.duration_s, width)) else { panic!("no active view") };
    let device = shared::analysis::peak_device(session.trace());
    let made = shared::analysis::active::Pairs::of(session.trace(), device).spans.len();
    (*a, made)
}

/// The request the page makes (`viewer/src/messages.rs`, `requests::active`).
fn viewer_active_request(duration_s: f64, width: u32) -> shared::explore::Request {
    shared::explore::Request::Active { start_s: 0.0, end_s: duration_s.max(1e-9), columns: (width as usize).saturating_sub(90).max(100) }
}

/// Sweeps the pointer over the Active Memory plot: each point of a grid (fractions of the
/// canvas) with the band under it (`-1`: none), as the page finds it.
fn hover_sweep(b: &Browser) -> Vec<(f64, f64, i64)> {
    let v = b.exec(
        r#"const c = document.getElementById('active-canvas'); const r = c.getBoundingClientRect(); const out = [];
           for (let fy = 0.9; fy > 0.05; fy -= 0.04) for (let fx = 0.08; fx < 0.99; fx += 0.015) {
             c.dispatchEvent(new MouseEvent('mousemove', {clientX: r.left + r.width * fx, clientY: r.top + r.height * fy, bubbles: true}));
             out.push([fx, fy, c.dataset.hoverBand === '' ? -1 : +c.dataset.hoverBand]);
           }
           return out;"#,
        json!([]),
    );
    serde_json::from_value(v).unwrap()
}

/// Non-background pixels of the bands as drawn: the WebGL canvas over the plot (read back
/// through a 2D canvas), else the 2D canvas.
fn active_painted(b: &Browser) -> u64 {
    let v = b.exec(
        "const g = document.getElementById('active-gl'); const c = document.getElementById('active-canvas');
         let src = c; if (c.dataset.render === 'webgl2') { src = document.createElement('canvas'); src.width = g.width; src.height = g.height;
           src.getContext('2d').drawImage(g, 0, 0); }
         const d = src.getContext('2d').getImageData(0, 0, src.width, src.height).data; let n = 0, sum = 0;
         for (let i = 0; i < d.length; i += 4) { if (d[i] !== d[0] || d[i+1] !== d[1] || d[i+2] !== d[2]) n++; sum = (sum * 31 + d[i] + d[i+1] * 7 + d[i+2] * 13) % 1000000007; }
         return [n, sum];",
        json!([]),
    );
    v[0].as_u64().unwrap() * 1_000_000_007 + v[1].as_u64().unwrap()
}

/// The Active Memory Timeline on both paths: WebGL2 (through SwiftShader: headless Chromium
/// with `--disable-gpu` has no WebGL2 without `--enable-unsafe-swiftshader`, and the page
/// takes a CPU-drawn one only when `?render=webgl2` asks) and the 2D canvas a browser without
/// WebGL2 gets (the harness's own browser). On each, every allocation live
/// at a column's moment is its own band, as many as `shared` answers natively, with the rest
/// counted as between two moments, so no allocation of the trace is grey; the top is PyTorch's
/// peak; the band under every point of a grid is the same on both paths; a hover shows its
/// size and lifetime, a click pins it with its stack, a new colouring repaints, and a wheel
/// zoom redraws at once on the GPU and then refines from the worker.
#[test]
fn active_memory_draws_every_allocation_on_both_paths() {
    let name = "resnet18_sgd_2steps.pickle";
    let mut answers = Vec::new();
    for (flags, query, render) in [(&["--enable-unsafe-swiftshader"][..], "?render=webgl2", "webgl2"), (&[][..], "", "canvas")] {
        let (_server, url) = static_server(&dist());
        let b = Browser::start_with(1400, 1000, flags);
        goto_viewer(&b, &format!("{url}/index.html{query}"));
        b.upload("#trace-file", &sample(name));
        wait_drawn(&b, name);
        let top = b.wait_for("return document.getElementById('active-canvas')?.dataset.maxAllocated", 30, "the active view");
        assert_eq!(top.as_str().unwrap().parse::<u64>().unwrap(), max_allocated(name), "{render}: the stack's top is the peak");
        let drawn = b.exec("return document.getElementById('active-canvas').dataset.render", json!([]));
        assert!(drawn.as_str().unwrap().starts_with(render), "{render}: drawn by {drawn}");
        let width = b.exec("return document.getElementById('active-canvas').width", json!([])).as_u64().unwrap() as u32;
        let (native, made) = native_active(name, width);
        let shown = |k: &str| b.exec(&format!("return +document.getElementById('active-canvas').dataset.{k}"), json!([])).as_u64().unwrap();
        assert_eq!(shown("bands"), native.bands.len() as u64, "{render}: every allocation live at a column's moment");
        assert_eq!(shown("bands") + shown("between"), made as u64, "{render}: every allocation of the trace is a band or between");
        assert!(native.bands.len() * 10 > made * 9, "{render}: {} bands of {made} allocations", native.bands.len());
        assert_eq!(shown("beforeTrace"), native.before_trace.iter().max().copied().unwrap_or(0), "{render}");
        let caption = b.exec("return document.getElementById('active-caption').innerText", json!([]));
        assert!(caption.as_str().unwrap().contains(&format!("{} allocations, each its own band", native.bands.len())), "{caption}");
        b.exec("document.getElementById('active').scrollIntoView()", json!([]));
        let hovered = hover_sweep(&b);
        assert!(hovered.iter().filter(|h| h.2 >= 0).count() > 200, "{render}: bands under the pointer");
        let painted = active_painted(&b);
        assert!(painted / 1_000_000_007 > 20_000, "{render}: {} pixels painted", painted / 1_000_000_007);
        // Hover, then pin the band under a point.
        let &(fx, fy, _) = hovered.iter().find(|h| h.2 >= 0).unwrap();
        b.exec(
            "const c = document.getElementById('active-canvas'); const r = c.getBoundingClientRect();
             const p = {clientX: r.left + r.width * arguments[0], clientY: r.top + r.height * arguments[1], bubbles: true};
             c.dispatchEvent(new MouseEvent('mousemove', p)); c.dispatchEvent(new MouseEvent('click', p));",
            json!([fx, fy]),
        );
        let pinned = b.wait_for(
            "const p = document.querySelector('#active-pinned pre'); return p && p.innerText.length > 0 && p.innerText",
            20,
            "the pinned allocation's stack",
        );
        assert!(pinned.as_str().unwrap().contains(".py:"), "{render}: a snapshot's stack names Python frames: {pinned}");
        b.screenshot(&screenshots().join(format!("active-pinned-{render}.png")));
        select(&b, "#active-colour", "stack");
        let repainted = (0..100).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(100));
            active_painted(&b) != painted
        });
        assert!(repainted, "{render}: colours by stack repaint");
        // A wheel zoom: a frame at once (before any answer: the GPU's quads or the canvas's last
        // picture moved), then the worker's bands.
        let moved = |b: &Browser| b.exec("return +(document.getElementById('active-canvas').dataset.movedFrames || 0)", json!([]));
        let before = moved(&b);
        b.exec(
            "window.__mtActiveFrames = []; window.__mtActiveRefined = []; const c = document.getElementById('active-canvas');
             const r = c.getBoundingClientRect();
             c.dispatchEvent(new WheelEvent('wheel', {deltaY: -100, clientX: r.left + r.width * 0.5, clientY: r.top + r.height / 2, bubbles: true, cancelable: true}));",
            json!([]),
        );
        let at_once = b.exec("return window.__mtActiveFrames.length", json!([]));
        assert_eq!(at_once, json!(1), "{render}: a frame drawn in the wheel's own task");
        assert_eq!(moved(&b).as_u64(), before.as_u64().map(|n| n + 1), "{render}: drawn from the bands the page held");
        b.wait_for("return window.__mtActiveRefined.length > 0", 30, "the zoomed window's bands");
        answers.push((native.bands.len(), top, hovered));
    }
    assert!(answers[0] == answers[1], "both paths give the same bands, top and band under every point");
}

/// A stored trace opened on the server (as files too large for the page are): every view is
/// drawn from the server's answers, with PyTorch's peak, and zooming asks the server again.
/// A snapshot of 1 GB or more opens in the page itself (issue 17), its peak equal to PyTorch's:
/// the file named by `MEMORY_TRACER_BIG_SNAPSHOT` (its peak then from the native importer),
/// else the first recording of `tests/data/big_snapshots.json` found in /tmp (where
/// `tests/gpu/big_snapshots.py` writes them; its peak from the facts). The files are
/// regenerated, never committed, so the test is ignored (and counted so) unless asked for:
/// `cargo test -p collector --test viewer_e2e -- --ignored a_big_snapshot`, which fails when
/// there is none.
#[test]
#[ignore = "needs a snapshot of 1 GB or more (MEMORY_TRACER_BIG_SNAPSHOT=FILE, or tests/gpu/big_snapshots.py's in /tmp)"]
fn a_big_snapshot_opens_in_the_page_when_present() {
    const PAGE_LIMIT: u64 = 4_000_000_000;
    let facts: Value = serde_json::from_slice(&std::fs::read(repo().join("tests/data/big_snapshots.json")).unwrap()).unwrap();
    let recorded = facts["snapshots"].as_array().unwrap().iter().find_map(|f| {
        let path = std::env::temp_dir().join(f["file"].as_str()?);
        let size = std::fs::metadata(&path).ok()?.len();
        (size == f["bytes"].as_u64()? && size <= PAGE_LIMIT).then(|| (path, f["max_allocated"].as_u64()))
    });
    let given = std::env::var_os("MEMORY_TRACER_BIG_SNAPSHOT")
        .map(|p| (PathBuf::from(p), std::env::var("MEMORY_TRACER_BIG_SNAPSHOT_PEAK").ok().and_then(|v| v.parse().ok())));
    let Some((path, peak)) = given.or(recorded) else {
        panic!(
            "no snapshot of 1 GB or more here (set MEMORY_TRACER_BIG_SNAPSHOT=FILE, or record one on a GPU with \
             tests/gpu/big_snapshots.py, which leaves it in /tmp)"
        );
    };
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(size <= PAGE_LIMIT, "{} is {size} bytes: more than a page opens; it opens through collector serve", path.display());
    let peak = peak.unwrap_or_else(|| {
        let trace =
            shared::import::import_reader(std::io::BufReader::new(std::fs::File::open(&path).unwrap()), &Default::default()).unwrap();
        summary(&trace).peak_allocated_bytes
    });
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    let (_server, b) = static_page();
    b.upload("#trace-file", &path);
    b.wait_for(
        &format!(
            "const h = document.querySelector('#summary h2'); return (document.body.dataset.drawnMs && h && h.textContent === {} && !document.querySelector('#progress')) || document.querySelector('#error-panel')?.innerText",
            json!(name)
        ),
        300,
        &format!("{name} to be drawn"),
    );
    let failed = b.exec("return document.querySelector('#error-panel')?.innerText", json!([]));
    assert!(failed.is_null(), "{name} did not open: {failed}");
    assert_eq!(timeline_top(&b), peak, "{name}: the timeline's top is the peak");
    let (ms, memory) =
        (b.exec("return document.body.dataset.drawnMs", json!([])), b.exec("return document.body.dataset.workerMemory", json!([])));
    eprintln!(
        "{name}: {:.1} MB drawn in {} ms, worker memory {} bytes",
        size as f64 / 1e6,
        ms.as_str().unwrap_or("?"),
        memory.as_str().unwrap_or("?")
    );
    // Where the time went, and what the page held as it read (the parsing stages say).
    for mark in b.exec("return window.__mtMarks || []", json!([])).as_array().into_iter().flatten() {
        eprintln!("  {:>9.0} ms  {}", mark[1].as_f64().unwrap_or(f64::NAN), mark[0].as_str().unwrap_or("?"));
    }
}

/// A file larger than the page holds, chosen in a page `collector serve` serves: the page says
/// so before reading it and offers the server, which takes the upload, imports it natively and
/// answers every view (the page's limit lowered to 0.1 MB with `?page_limit_mb=`).
#[test]
fn a_file_too_large_for_the_page_opens_on_the_server_that_serves_it() {
    let _ = dist();
    let s = server::Server::start(&tmpdir("serve-offer"), &[]);
    let name = "resnet18_sgd_2steps.pickle";
    let b = Browser::start(1400, 1000);
    goto_viewer(&b, &format!("{}/?page_limit_mb=0.1", s.base));
    b.upload("#trace-file", &sample(name));
    let said = b.wait_for("return document.querySelector('#error-panel')?.innerText", 30, "the page's refusal");
    let said = said.as_str().unwrap();
    let size = std::fs::metadata(sample(name)).unwrap().len();
    assert!(said.contains("more than this page holds"), "{said}");
    assert!(said.contains(&shared::units::format_bytes(size)), "the size is named: {said}");
    assert!(said.contains(&shared::units::format_bytes(100_000)), "the limit is named: {said}");
    // Nothing was read: the worker holds no trace and no request went to the server yet.
    let (_, list) = s.get_json("/api/trace/list");
    assert_eq!(list["count"], 0, "{list}");
    b.click("#upload-to-server");
    wait_drawn(&b, name);
    assert_eq!(timeline_top(&b), max_allocated(name));
    let (_, list) = s.get_json("/api/trace/list");
    assert_eq!(list["count"], 1, "stored once: {list}");
}

#[test]
fn the_served_viewer_explores_a_stored_trace_on_the_server() {
    let _ = dist();
    let s = server::Server::start(&tmpdir("serve-remote"), &[]);
    let name = "resnet18_sgd_2steps.pickle";
    let (code, v) = s.post_bytes(&format!("/api/trace/upload?filename={name}"), &std::fs::read(sample(name)).unwrap());
    assert_eq!(code, 200, "{v}");
    let id = v["trace_id"].as_str().unwrap().to_owned();
    let b = Browser::start(1400, 1000);
    b.goto(&format!("{}/", s.base));
    b.wait_for("return document.querySelector('#server-traces .explore-remote')", 30, "the stored trace's buttons");
    // The server's page is cross-origin isolated: a local file goes to the worker through the
    // shared ring the page reads it into.
    assert_eq!(b.exec("return self.crossOriginIsolated", json!([])), json!(true));
    let local = "mlp_adam_3steps.pickle";
    b.upload("#trace-file", &sample(local));
    wait_drawn(&b, local);
    assert_eq!(b.exec("return document.body.dataset.read", json!([])), json!("shared"));
    assert_eq!(timeline_top(&b), max_allocated(local));
    b.click("#server-traces .explore-remote");
    // Shown under the name it was uploaded with, like any stored trace.
    wait_drawn(&b, name);
    assert!(!id.is_empty());
    assert_eq!(timeline_top(&b), max_allocated(name));
    let top = b.wait_for("return document.getElementById('active-canvas')?.dataset.maxAllocated", 30, "the active view");
    assert_eq!(top.as_str().unwrap().parse::<u64>().unwrap(), max_allocated(name));
    let painted = b.exec(PAINTED, json!([]));
    for id in ["timeline-canvas", "active-canvas", "flame-canvas"] {
        assert!(painted[id].as_u64().unwrap_or(0) > 2000, "{id} blank: {painted}");
    }
    // The worker holds nothing: a zoom is answered by the server.
    let frames_before = b.exec("return (window.__mtFrames || []).length", json!([])).as_u64().unwrap();
    b.click("#timeline .card-head button:nth-of-type(1)"); // zoom to peak
    b.wait_for(&format!("return (window.__mtFrames || []).length > {frames_before}"), 30, "a zoom frame from the server's answer");
    b.screenshot(&screenshots().join("serve-remote.png"));
}

/// A file whose opening would pass the worker's memory budget (`?page_memory_mb=`, here a few
/// MiB over what the worker holds with a small trace open) is stopped while read: the page says
/// at which byte, what the worker holds and the ways that open it, and the trace open before
/// stays shown and answering.
#[test]
fn a_file_past_the_worker_memory_stops_where_it_is_and_keeps_the_open_trace() {
    let dir = tmpdir("memory-budget");
    let path = dir.join("scaled.pickle");
    let python = std::env::var("MEMORY_TRACER_PYTHON").unwrap_or_else(|_| "python3".into());
    let made = std::process::Command::new(python)
        .arg(repo().join("tests/bench/scale_snapshot.py"))
        .arg(sample("resnet18_sgd_2steps.pickle"))
        .arg("120")
        .arg(&path)
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let size = std::fs::metadata(&path).unwrap().len();
    let small = "resnet18_sgd_2steps.pickle";
    // The worker reads the file itself (a plain static host), or takes it from the ring the page
    // reads it into (cross-origin isolated): both stop, and the page's reading with them.
    for isolated in [false, true] {
        // What the worker holds with the small trace open, measured in a page like the one below.
        let (_server, b, url) = static_page_at(isolated);
        b.upload("#trace-file", &sample(small));
        wait_drawn(&b, small);
        let held: f64 = b.exec("return document.body.dataset.workerMemory", json!([])).as_str().unwrap().parse().unwrap();
        // Room for 8 MiB more, with what opening adds after the parse (the worker's OPEN_OVER_PARSE).
        let budget_mb = (held + f64::from(8u32 << 20)) * 1.6 / 1e6;
        goto_viewer(&b, &format!("{url}/index.html?page_memory_mb={budget_mb}"));
        b.upload("#trace-file", &sample(small));
        wait_drawn(&b, small);
        b.upload("#trace-file", &path);
        let said = b.wait_for("return document.querySelector('#error-panel')?.innerText", 60, "the page to stop reading");
        let said = said.as_str().unwrap();
        let at: f64 = said
            .split("stopped at byte ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("the byte where reading stopped: {said}"));
        assert!(at > 0.0 && at < size as f64, "stopped inside the file ({size} bytes): {said}");
        assert!(said.contains(&format!("of {size}")), "{said}");
        assert!(said.contains("collector serve") && said.contains("collector summary scaled.pickle"), "the ways around: {said}");
        // The trace open before is still the one shown, and its worker session still answers.
        let title = b.exec("return document.querySelector('#summary h2')?.textContent", json!([]));
        assert_eq!(title, json!(small));
        assert_eq!(timeline_top(&b), max_allocated(small));
        // And the next file opens, the same way.
        let next = "mlp_adam_3steps.pickle";
        b.upload("#trace-file", &sample(next));
        wait_drawn(&b, next);
        assert_eq!(b.exec("return document.body.dataset.read", json!([])), json!(if isolated { "shared" } else { "worker" }));
        assert_eq!(timeline_top(&b), max_allocated(next));
    }
}

/// A file read in several slices (the worker reads 16 MiB at a time into one reused buffer), and
/// through the page's ring (8 MiB of shared memory, filled again and again) on a cross-origin
/// isolated page: a 43 MB snapshot opens with the native importer's peak and event count both
/// ways.
#[test]
fn a_file_of_several_slices_opens_as_the_native_importer_reads_it() {
    let dir = tmpdir("slices");
    let path = dir.join("scaled.pickle");
    let python = std::env::var("MEMORY_TRACER_PYTHON").unwrap_or_else(|_| "python3".into());
    let made = std::process::Command::new(python)
        .arg(repo().join("tests/bench/scale_snapshot.py"))
        .arg(sample("resnet18_sgd_2steps.pickle"))
        .arg("120")
        .arg(&path)
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(size > 32 << 20, "more than two slices of 16 MiB, and four rings of 8 MiB: {size}");
    let trace = shared::import::import_reader(std::io::BufReader::new(std::fs::File::open(&path).unwrap()), &Default::default()).unwrap();
    for (isolated, read) in [(false, "worker"), (true, "shared")] {
        let (_server, b, _) = static_page_at(isolated);
        assert_eq!(b.exec("return self.crossOriginIsolated", json!([])), json!(isolated));
        b.upload("#trace-file", &path);
        wait_drawn(&b, "scaled.pickle");
        assert_eq!(b.exec("return document.body.dataset.read", json!([])), json!(read));
        assert_eq!(timeline_top(&b), summary(&trace).peak_allocated_bytes, "read by the {read}");
        let events = b.exec(
            "return [...document.querySelectorAll('#summary dt')].find(d => d.textContent === 'Events')?.nextSibling?.textContent",
            json!([]),
        );
        let digits: String = events.as_str().unwrap_or_default().chars().filter(char::is_ascii_digit).collect();
        assert_eq!(digits, trace.events.len().to_string(), "events shown, read by the {read}: {events}");
    }
}

/// A torch 2.15 snapshot with a private pool, pinned host memory and annotations: the Pools
/// view draws one panel per (device, pool, stream) with the native peaks, says pinned host
/// memory's totals apart, and the segment map shows one pool at a time.
#[test]
fn pools_view_and_the_segment_map_of_each_pool() {
    let (_server, b) = static_page();
    let path = sample("layout_2_15.pickle");
    b.upload("#trace-file", &path);
    wait_drawn(&b, "layout_2_15.pickle");
    check_views(&b, &path);
    let trace = shared::import(&std::fs::read(&path).unwrap(), &shared::ImportOptions::default()).unwrap();
    let curves = shared::analysis::pools::pool_curves(&trace, 500);
    assert!(curves.iter().any(|c| c.private), "the sample has a private pool");
    let pools = column(&b, "#pools-table", 1);
    assert_eq!(pools.len(), curves.len(), "one row per panel: {pools:?}");
    let peaks = column(&b, "#pools-table", 3);
    assert_eq!(peaks, curves.iter().map(|c| format_bytes(c.peak_allocated_bytes)).collect::<Vec<_>>(), "pool peaks");
    let host = summary(&trace).pinned_host.unwrap();
    let said = b.exec("return document.querySelector('#pools-host').innerText", json!([]));
    assert!(said.as_str().unwrap().contains(&format_bytes(host.peak_allocated_bytes)), "pinned host: {said}");
    // The segment map of the private pool alone: its segments at the end of the trace.
    let at_end = shared::analysis::segments_at(&trace, trace.events.len() - 1, 0);
    let k = 0u16;
    let mine = at_end.iter().filter(|g| g.private_pool == Some(k)).count();
    assert!(mine > 0 && mine < at_end.len(), "{mine} of {}", at_end.len());
    b.exec(
        "const r = document.querySelector('#segments-time'); r.value = r.max; r.dispatchEvent(new Event('input', {bubbles: true}));",
        json!([]),
    );
    b.wait_for(
        &format!("return document.querySelector('#segments-stats').innerText.includes(': {} segments,')", at_end.len()),
        20,
        "every segment at the end",
    );
    select(&b, "#segments-pool", &k.to_string());
    b.wait_for(
        &format!("return document.querySelector('#segments-stats').innerText.includes(': {mine} segments,')"),
        20,
        "the private pool's segments",
    );
    // What the memory at the peak is for, as the native categorisation says.
    let categorized = shared::analysis::categories::categorize(&trace);
    let want: Vec<(String, u64)> = shared::analysis::categories::bytes_at(&trace, &categorized, summary(&trace).peak_event_index)
        .into_iter()
        .filter(|&(_, b)| b > 0)
        .map(|(c, b)| (c.as_str().to_owned(), b))
        .collect();
    let chips = b.exec(
        "return [...document.querySelectorAll('#categories-at-peak .chip')].map(c => [c.dataset.category, Number(c.dataset.bytes)])",
        json!([]),
    );
    assert_eq!(chips, json!(want), "categories at the peak");
    // Colour by category: the bands take the categories' colours.
    let checksum = "const d = document.getElementById('active-canvas').getContext('2d').getImageData(0, 0, 4000, 4000).data; \
        let s = 0; for (let i = 0; i < d.length; i += 4) s = (s + d[i] + 3 * d[i+1] + 7 * d[i+2]) % 1000000007; return s;";
    let before = b.exec(checksum, json!([]));
    select(&b, "#active-colour", "category");
    b.wait_for(&format!("{{ const f = () => {{ {checksum} }}; return f() !== {before}; }}"), 20, "the active view in category colours");
    // A search: the annotation's text finds its allocation, and the count is said.
    b.exec(
        "const i = document.querySelector('#active-search'); i.value = 'graph input'; i.dispatchEvent(new Event('change', {bubbles: true}));",
        json!([]),
    );
    b.wait_for("return document.querySelector('#active-found').innerText.startsWith('1 allocations match')", 20, "the search's count");
}
