//! Charts that explain themselves (issue 71, items 3 and 4), end to end in Debian's headless
//! Chromium on the viewer `cargo xtask viewer` built (`dist/`, which `cargo xtask test` builds
//! first): the timeline's phase bands and Active Memory's colours have legends, equal to what
//! `shared` computes natively; a CPU trace's reserved peak reads n/a; the layer table's headers
//! are words; the memory-vs-rank caption names missing sections in words; the help overlay
//! opens on `?` and closes on Esc; the page's icon is inline (no `/favicon.ico`); the what-if's
//! two segment maps share one scale and its input shows its whole example; pinning an
//! allocation fades the other bands alike on the WebGL2 and the 2D canvas paths; and a server
//! that cannot trace disables its trace form with the reason; the pinned stack and the flame
//! graph fold torch's and Python's own frames behind a switch. Screenshots go to
//! `target/e2e-screenshots/`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scratch;
mod server;
mod webdriver;

use scratch::Scratch;
use serde_json::{json, Value};
use shared::analysis::active::{ActiveTimeline, NONE};
use shared::explore::{Opened, Overview, Request, Response, Session};
use shared::model::SegmentInfo;
use std::path::{Path, PathBuf};
use std::process::Command;
use webdriver::viewer::{dist, goto_viewer, repo, sample, screenshots, wait_drawn};
use webdriver::{static_server, Browser};

/// Escape, as WebDriver names the key.
const ESCAPE: &str = "\u{E00C}";

/// A real CPU trace: a GAN's two optimizers on the CPU, traced with `collector trace` through
/// the torch venv's Python (`MEMORY_TRACER_PYTHON`, set by `cargo xtask`; else `python3`).
fn cpu_trace(dir: &Path) -> PathBuf {
    let out = dir.join("gan_cpu.mtrace.json");
    let python = std::env::var("MEMORY_TRACER_PYTHON").unwrap_or_else(|_| "python3".into());
    let program = repo().join("tests/python/programs/two_optimizers.py");
    let done = Command::new(env!("CARGO_BIN_EXE_collector"))
        .current_dir(dir)
        .env_remove("MEMORY_TRACER_PYTHONPATH")
        .args(["trace", "-q", "-o"])
        .arg(&out)
        .arg("--")
        .arg(python)
        .arg(program)
        .output()
        .unwrap();
    assert!(done.status.success(), "collector trace: {}", String::from_utf8_lossy(&done.stderr));
    out
}

/// The page in the light theme (a headless browser's own; the one where WebGL2 erased the
/// bands a pin dims).
fn light_theme(b: &Browser) {
    if b.exec("return document.documentElement.dataset.theme", json!([])) != json!("light") {
        b.exec("document.body.focus()", json!([]));
        b.press("t");
    }
    b.wait_for("return document.documentElement.dataset.theme === 'light'", 10, "the light theme");
}

/// `path` opened natively as the worker opens it: its session and overview.
fn native_session(path: &Path) -> (Session, Overview) {
    let name = path.file_name().unwrap().to_str().unwrap();
    let Opened::Trace(session, overview) = Session::open(name, &std::fs::read(path).unwrap(), |_| {}).unwrap() else { panic!("a sweep") };
    (*session, *overview)
}

/// `data-key` and text of each chip of the legend `css`.
fn chips(b: &Browser, css: &str) -> Vec<(String, String)> {
    let v =
        b.exec(&format!("return [...document.querySelectorAll('{css} .chip')].map(c => [c.dataset.key, c.textContent.trim()])"), json!([]));
    serde_json::from_value(v).unwrap()
}

/// The active answer the page asks for a canvas `width` pixels wide (`viewer/src/messages.rs`).
fn native_active(session: &mut Session, overview: &Overview, width: u32) -> ActiveTimeline {
    let request =
        Request::Active { start_s: 0.0, end_s: overview.duration_s.max(1e-9), columns: (width as usize).saturating_sub(90).max(100) };
    let Response::Active(a) = session.answer(&request) else { panic!("no active answer") };
    *a
}

/// The layers holding the most bytes among `a`'s bands, most first (ties by first seen name),
/// as the legend lists them.
fn top_layers(a: &ActiveTimeline, most: usize) -> Vec<String> {
    let mut bytes: std::collections::HashMap<u32, u64> = Default::default();
    for b in 0..a.bands.len() {
        *bytes.entry(a.bands.layer[b]).or_default() += a.bands.size_bytes[b];
    }
    let mut keys: Vec<(u32, u64)> = bytes.into_iter().collect();
    keys.sort_by(|x, y| y.1.cmp(&x.1).then(x.0.cmp(&y.0)));
    keys.into_iter().take(most).map(|(k, _)| if k == NONE { "(no layer)".to_owned() } else { a.bands.names[k as usize].clone() }).collect()
}

/// The timeline's legend names the phases the trace has, Active Memory's names the layers
/// holding the most bytes and then the categories; both are drawn (screenshots).
fn check_legends(b: &Browser, trace: &Path) {
    let (mut session, overview) = native_session(trace);
    let mut phases: Vec<&str> = Vec::new();
    for p in [shared::Phase::Forward, shared::Phase::Backward, shared::Phase::Optimizer] {
        if overview.phase_bands.iter().any(|band| band.phase == p) {
            phases.push(p.as_str());
        }
    }
    assert!(!phases.is_empty(), "the CPU trace has phases");
    let mut want: Vec<String> = phases.iter().map(|p| p.to_string()).collect();
    if !overview.layer_bands.is_empty() {
        want.push("layer".into());
    }
    let keys: Vec<String> = chips(b, "#timeline-legend").into_iter().map(|c| c.0).collect();
    assert_eq!(keys, want, "the timeline's legend");
    b.exec("document.getElementById('timeline').scrollIntoView()", json!([]));
    b.screenshot(&screenshots().join("legend-timeline.png"));

    b.wait_for("return document.querySelector('#active-legend .chip')", 30, "Active Memory's legend");
    let width = b.exec("return document.getElementById('active-canvas').width", json!([])).as_u64().unwrap() as u32;
    let a = native_active(&mut session, &overview, width);
    let labels: Vec<String> = chips(b, "#active-legend").into_iter().map(|c| c.1).collect();
    assert_eq!(labels, top_layers(&a, 8), "Active Memory's legend, by layer");
    b.exec(
        "const s = document.getElementById('active-colour'); s.value = 'category'; s.dispatchEvent(new Event('change')); return null",
        json!([]),
    );
    b.wait_for("return document.getElementById('active-legend').dataset.colourBy === 'category'", 10, "the legend by category");
    let mut categories: Vec<String> =
        (0..a.bands.len()).map(|i| a.bands.category_of(i).map_or_else(|| "unknown".into(), |c| c.as_str().replace('_', " "))).collect();
    categories.sort();
    categories.dedup();
    let mut shown: Vec<String> = chips(b, "#active-legend").into_iter().map(|c| c.1).collect();
    shown.sort();
    assert_eq!(shown, categories, "Active Memory's legend, by category");
    b.exec("document.getElementById('active').scrollIntoView()", json!([]));
    b.screenshot(&screenshots().join("legend-active.png"));
}

/// The help overlay opens on `?` and closes on Esc, listing the shortcuts; from a menu too,
/// but a `?` typed into a text field is the field's.
fn check_help(b: &Browser) {
    let shown = "const o = document.querySelector('.overlay'); return getComputedStyle(o).display !== 'none'";
    b.exec("document.activeElement.blur()", json!([]));
    b.press("?");
    b.wait_for(shown, 10, "the help overlay");
    let keys = b.exec("return [...document.querySelectorAll('#help kbd')].map(k => k.textContent)", json!([]));
    for k in ["?", "Esc", "o", "t", "/", "0"] {
        assert!(keys.as_array().unwrap().iter().any(|v| v == k), "the help lists {k}: {keys}");
    }
    b.screenshot(&screenshots().join("help.png"));
    b.press(ESCAPE);
    b.wait_for(&format!("return !(() => {{ {shown} }})()"), 10, "the help overlay closed");
    b.exec("document.getElementById('active-colour').focus()", json!([]));
    b.press("?");
    b.wait_for(shown, 10, "the help overlay from a menu");
    b.press(ESCAPE);
    b.exec("document.getElementById('layer-filter').focus()", json!([]));
    b.press("?");
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(b.exec(shown, json!([])), json!(false), "a ? typed into a filter opened the help");
    let typed = b.exec("const i = document.getElementById('layer-filter'); const v = i.value; i.value = ''; i.dispatchEvent(new Event('input', {bubbles: true})); return v", json!([]));
    assert_eq!(typed, json!("?"));
}

/// The icon is the page's own (inline), so no server is asked for `/favicon.ico`: the link
/// resolves to an image.
fn check_icon(b: &Browser) {
    let loaded = b.exec_async(
        "const done = arguments[arguments.length - 1]; const l = document.querySelector('link[rel=icon]'); if (!l) { done('no icon link'); return; }
         const i = new Image(); i.onload = () => done([l.href.slice(0, 5), i.naturalWidth]); i.onerror = () => done('the icon does not load'); i.src = l.href;",
    );
    assert_eq!(loaded, json!(["data:", 16]), "the page's icon");
}

/// A CPU trace: legends, n/a for reserved, words for headers and sections, the help, the icon.
#[test]
fn a_cpu_trace_explains_its_charts() {
    let dir = Scratch::new("charts-cpu");
    let trace = cpu_trace(&dir);
    let name = trace.file_name().unwrap().to_str().unwrap().to_owned();
    let (_server, url) = static_server(&dist());
    let b = Browser::start(1400, 1000);
    goto_viewer(&b, &format!("{url}/index.html"));
    light_theme(&b);
    check_icon(&b);
    b.upload("#trace-file", &trace);
    wait_drawn(&b, &name);
    check_legends(&b, &trace);
    // The reserved peak of a CPU trace does not exist: n/a, as `collector summary` says.
    let peak_reserved = b.exec(
        "return [...document.querySelectorAll('#summary dt')].find(d => d.textContent === 'Peak reserved')?.nextSibling?.textContent",
        json!([]),
    );
    assert_eq!(peak_reserved, json!("n/a (the CPU allocator caches nothing)"));
    let layer_reserved =
        b.exec("return [...new Set([...document.querySelectorAll('#layer-table tbody tr')].map(r => r.cells[2].textContent))]", json!([]));
    assert_eq!(layer_reserved, json!(["n/a"]), "the layers' reserved peaks");
    // The layer table's headers are words (the field names in their tooltips).
    let headers =
        b.exec("return [...document.querySelectorAll('#layer-table th')].map(h => h.textContent.replace(/ [▲▼]$/, ''))", json!([]));
    let words =
        ["layer", "peak allocated", "peak reserved", "allocations", "frees", "mean fragmentation", "time (ms)", "allocated in total"];
    assert_eq!(headers, json!(words), "the layer table's headers");
    // Sections the iteration lacks are said in words, not dashes.
    let profile = shared::analysis::profile::graph_profile(&traceio::files::load_trace(&trace, &Default::default()).unwrap()).unwrap();
    let caption = b.exec("return document.querySelector('#rank .hint').textContent", json!([]));
    let caption = caption.as_str().unwrap();
    assert!(!caption.contains('—') && caption.contains(&format!("{} ranks per iteration", profile.nodes.len())), "{caption}");
    let s = &profile.sections;
    let from = |name: &str, start: Option<usize>| start.map_or_else(|| format!("no {name}"), |r| format!("{name} from {r}"));
    let optimizer = match (s.optimizer_start_rank, s.optimizer_end_rank) {
        (Some(a), Some(z)) => format!("optimizer {a}–{z}"),
        (start, _) => from("optimizer step", start),
    };
    for said in [from("forward", s.forward_start_rank), from("backward", s.backward_start_rank), optimizer] {
        assert!(caption.contains(&said), "the caption lacks {said:?}: {caption}");
    }
    b.exec("document.getElementById('tables').scrollIntoView()", json!([]));
    b.screenshot(&screenshots().join("layer-headers.png"));
    check_help(&b);
}

/// Bar widths of each drawn row of the segment map `id`: pixels from the bars' left edge to the
/// last one not the background, a row's middle line at a time.
fn bar_widths(b: &Browser, id: &str, rows: usize) -> (u64, Vec<u64>) {
    let v = b.exec(
        "const c = document.getElementById(arguments[0]); const ctx = c.getContext('2d'); const out = [];
         const d = ctx.getImageData(0, 0, c.width, c.height).data; const bg = [d[0], d[1], d[2]];
         for (let r = 0; r < arguments[1]; r++) { const y = 2 + r * 12 + 5; let last = 99;
           for (let x = 100; x < c.width; x++) { const i = (y * c.width + x) * 4;
             if (d[i] !== bg[0] || d[i+1] !== bg[1] || d[i+2] !== bg[2]) last = x; }
           out.push(last - 99); }
         return [c.width, out];",
        json!([id, rows]),
    );
    serde_json::from_value(v).unwrap()
}

/// Segments at `t_s`, recorded and under `setting`, as the worker answers them.
fn native_maps(session: &mut Session, t_s: f64, setting: &str) -> (Vec<SegmentInfo>, Vec<SegmentInfo>) {
    let Response::Segments { segments: recorded, .. } = session.answer(&Request::Segments { t_s }) else { panic!("no segments") };
    let Response::SimulatedSegments { segments, error, .. } =
        session.answer(&Request::SimulatedSegments { t_s, alloc_conf: setting.into() })
    else {
        panic!("no simulated segments")
    };
    assert_eq!(error, None);
    (recorded, segments)
}

/// The what-if's two maps side by side on one scale: the largest segment of either spans the
/// width, and every bar of both is as wide as its bytes at that scale; the setting's input
/// shows its whole example.
#[test]
fn the_what_if_segment_maps_share_one_scale() {
    let path = sample("resnet18_sgd_2steps.pickle");
    let (mut session, overview) = native_session(&path);
    let (_server, url) = static_server(&dist());
    let b = Browser::start(1400, 1000);
    goto_viewer(&b, &format!("{url}/index.html"));
    b.upload("#trace-file", &path);
    wait_drawn(&b, "resnet18_sgd_2steps.pickle");
    b.wait_for("return document.getElementById('segments-canvas')", 30, "the segment map");
    // The example is not cut: its text fits the input's content box.
    let fits = b.exec(
        "const i = document.getElementById('segments-setting'); const s = getComputedStyle(i);
         const ctx = document.createElement('canvas').getContext('2d'); ctx.font = s.font;
         const room = i.clientWidth - parseFloat(s.paddingLeft) - parseFloat(s.paddingRight);
         return [ctx.measureText(i.placeholder).width, room, i.placeholder];",
        json!([]),
    );
    assert!(fits[0].as_f64().unwrap() <= fits[1].as_f64().unwrap(), "the setting's example is cut: {fits}");
    let setting = "expandable_segments:True";
    b.exec(
        "const i = document.querySelector('#segments-setting'); i.value = arguments[0]; i.dispatchEvent(new Event('change')); return null",
        json!([setting]),
    );
    b.wait_for(
        "const c = document.querySelector('#segments-simulated'); return c && c.offsetParent !== null && c.dataset.fullWidthBytes
           && c.dataset.fullWidthBytes === document.querySelector('#segments-canvas').dataset.fullWidthBytes",
        30,
        "the simulated segments on the recorded ones' scale",
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    let (recorded, simulated) = native_maps(&mut session, overview.summary.peak_time_s, setting);
    let largest = recorded.iter().chain(&simulated).map(|g| g.size_bytes).max().unwrap();
    let smaller_map = recorded.iter().map(|g| g.size_bytes).max().unwrap().min(simulated.iter().map(|g| g.size_bytes).max().unwrap());
    assert!(smaller_map * 2 < largest, "the sample's maps differ in scale: {smaller_map} and {largest} bytes");
    let mut checked = 0;
    for (id, segments) in [("segments-canvas", &recorded), ("segments-simulated", &simulated)] {
        let shown = b.exec(&format!("return document.getElementById('{id}').dataset.fullWidthBytes"), json!([]));
        assert_eq!(shown, json!(largest.to_string()), "{id}: the bytes the width stands for");
        let rows = segments.len().min(40);
        let (width, bars) = bar_widths(&b, id, rows);
        let px_per_byte = (width as f64 - 110.0) / largest as f64;
        for (g, &px) in segments.iter().zip(&bars) {
            let want = (g.size_bytes as f64 * px_per_byte).max(1.0);
            assert!((px as f64 - want).abs() <= 2.0, "{id}: a segment of {} bytes drawn {px} px wide, expected {want:.1}", g.size_bytes);
            checked += 1;
        }
    }
    assert!(checked > 2, "{checked} bars checked");
    b.exec("document.getElementById('segments').scrollIntoView()", json!([]));
    b.screenshot(&screenshots().join("segments-one-scale.png"));
}

/// Non-background pixels of the bands as drawn (the WebGL canvas read back, else the 2D
/// canvas's plot).
fn bands_painted(b: &Browser) -> u64 {
    b.exec(
        "const g = document.getElementById('active-gl'); const c = document.getElementById('active-canvas');
         let src = c; if (c.dataset.render === 'webgl2') { src = document.createElement('canvas'); src.width = g.width; src.height = g.height;
           src.getContext('2d').drawImage(g, 0, 0); }
         const d = src.getContext('2d').getImageData(0, 0, src.width, src.height).data; let n = 0;
         for (let i = 0; i < d.length; i += 4) if (d[i] !== d[0] || d[i+1] !== d[1] || d[i+2] !== d[2]) n++;
         return n;",
        json!([]),
    )
    .as_u64()
    .unwrap()
}

/// Frames that point at the user's code (issue 71, item 2): the pinned allocation's stack shows
/// its Python frames with torch's and Python's own folded behind a switch, and the flame graph
/// has none of them until its switch is on.
fn check_folded_frames(b: &Browser) {
    let runtime = ["torch::unwind", "_PyEval_EvalFrameDefault", "??:0", "CUDACachingAllocator"];
    let shown = b.exec("return document.querySelector('#active-pinned details.stack > pre.stack-shown')?.textContent ?? ''", json!([]));
    let shown = shown.as_str().unwrap();
    assert!(shown.contains(".py:"), "the pinned stack shows no Python frame: {shown}");
    assert!(!runtime.iter().any(|r| shown.contains(r)), "a runtime frame in the pinned stack as shown: {shown}");
    let folded = b.exec("return document.querySelector('#active-pinned details.stack-folded > summary')?.textContent ?? ''", json!([]));
    assert!(folded.as_str().unwrap().contains("frames of torch and Python folded"), "no switch for the folded frames: {folded}");
    let full = b.exec("return document.querySelector('#active-pinned details.stack-folded > pre')?.textContent ?? ''", json!([]));
    assert!(full.as_str().unwrap().contains("torch::unwind"), "the switch does not hold every frame");

    let search = |b: &Browser, q: &str| {
        b.exec(
            "const i = document.getElementById('flame-search'); i.value = arguments[0]; i.dispatchEvent(new Event('input', {bubbles: true}));",
            json!([q]),
        );
        b.wait_for("return /matches/.test(document.querySelector('#flame .card-head .hint')?.textContent ?? '')", 20, "the flame search");
        let hint = b.exec("return document.querySelector('#flame .card-head .hint').textContent", json!([]));
        hint.as_str().unwrap().split(' ').next().unwrap().parse::<u64>().unwrap()
    };
    b.exec("document.getElementById('flame').scrollIntoView()", json!([]));
    assert_eq!(search(b, "unwind"), 0, "the folded flame graph holds the unwinder");
    assert!(search(b, ".py:") > 0, "the folded flame graph lost the Python frames");
    b.exec("document.getElementById('flame-all-frames').click()", json!([]));
    b.wait_for("return document.getElementById('flame-all-frames')?.checked", 20, "the switch on");
    // The graph with every frame comes from the worker and replaces the folded one.
    let start = std::time::Instant::now();
    while search(b, "unwind") == 0 {
        assert!(start.elapsed().as_secs() < 30, "the flame graph kept its runtime frames folded with the switch on");
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    b.exec("document.getElementById('flame-all-frames').click()", json!([]));
}

/// Pinning an allocation fades the other bands on both paths alike (light theme): the bands
/// keep their pixels, on WebGL2 as on the 2D canvas.
#[test]
fn pinning_fades_the_other_bands_on_both_paths() {
    let name = "resnet18_sgd_2steps.pickle";
    let mut kept = Vec::new();
    for (flags, query, render) in
        [(&["--enable-unsafe-swiftshader"][..], "?render=webgl2", "webgl2"), (&[][..], "?render=canvas", "canvas")]
    {
        let (_server, url) = static_server(&dist());
        let b = Browser::start_with(1400, 1000, flags);
        goto_viewer(&b, &format!("{url}/index.html{query}"));
        light_theme(&b);
        b.upload("#trace-file", &sample(name));
        wait_drawn(&b, name);
        b.wait_for("return document.getElementById('active-canvas')?.dataset.bands", 30, "the active view");
        let drawn = b.exec("return document.getElementById('active-canvas').dataset.render", json!([]));
        assert!(drawn.as_str().unwrap().starts_with(render), "{render}: drawn by {drawn}");
        b.exec("document.getElementById('active').scrollIntoView()", json!([]));
        let before = bands_painted(&b);
        // Pin the first band found under a grid of points, from the plot's bottom up.
        let pinned = b.exec(
            "const c = document.getElementById('active-canvas'); const r = c.getBoundingClientRect();
             for (let fy = 0.9; fy > 0.05; fy -= 0.04) for (let fx = 0.3; fx < 0.95; fx += 0.02) {
               const p = {clientX: r.left + r.width * fx, clientY: r.top + r.height * fy, bubbles: true};
               c.dispatchEvent(new MouseEvent('mousemove', p));
               if (c.dataset.hoverBand) { c.dispatchEvent(new MouseEvent('click', p)); return c.dataset.hoverBand; } }
             return null;",
            json!([]),
        );
        assert!(pinned.is_string(), "{render}: no band under the pointer");
        b.wait_for("return document.querySelector('#active-pinned pre')", 20, "the pinned allocation");
        std::thread::sleep(std::time::Duration::from_millis(500));
        let after = bands_painted(&b);
        let share = after as f64 / before as f64;
        assert!(share > 0.9, "{render}: pinning left {after} of {before} band pixels");
        let legend = b.exec("return document.getElementById('active-legend').textContent", json!([]));
        assert!(legend.as_str().unwrap().contains("faded"), "{render}: the legend says what is faded: {legend}");
        b.screenshot(&screenshots().join(format!("pinned-light-{render}.png")));
        kept.push(share);
        check_folded_frames(&b);
    }
    assert!((kept[0] - kept[1]).abs() < 0.1, "the paths fade differently: {kept:?} of their pixels kept");
}

/// A server without collector-capture (its binary alone in a folder) says so and disables the
/// trace form, where it failed on a click.
#[test]
fn a_server_that_cannot_trace_disables_its_form() {
    let dir = Scratch::new("charts-no-capture");
    let exe = dir.join("collector");
    if std::fs::hard_link(env!("CARGO_BIN_EXE_collector"), &exe).is_err() {
        std::fs::copy(env!("CARGO_BIN_EXE_collector"), &exe).unwrap();
    }
    let data = dir.join("data");
    let s = server::Server::start_with(exe.to_str().unwrap(), &data, &[]);
    let (code, health) = s.get_json("/api/health");
    assert_eq!((code, &health["tracing_available"]), (200, &json!(false)), "MEMORY_TRACER_CAPTURE names a capture: {health}");
    let b = Browser::start(1400, 1000);
    goto_viewer(&b, &format!("{}/", s.base));
    let why = b.wait_for("return document.getElementById('srv-cannot-trace')?.textContent", 30, "the reason");
    assert!(why.as_str().unwrap().contains("cannot trace"), "{why}");
    let disabled: Value = b.exec(
        "return [document.querySelector('#server fieldset').disabled, document.getElementById('srv-trace').matches(':disabled'), document.getElementById('srv-model').matches(':disabled')]",
        json!([]),
    );
    assert_eq!(disabled, json!([true, true, true]), "the trace form is disabled");
    b.screenshot(&screenshots().join("server-cannot-trace.png"));
}
