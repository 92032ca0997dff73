//! Components in a real browser (headless Chromium through wasm-bindgen-test): the worker's
//! analysis code running as wasm on the real samples, and every chart drawing real pixels.
//! Rank files merge, their curves share one axis, and two traces compare, as wasm.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use shared::analysis::view_math::{flame_layout, FlameMetric};
use shared::explore::{Opened, Overview, Request, Response, Session};
use shared::ranks::merge::MergeOptions;
use viewer::charts::{self, Palette};
use wasm_bindgen::JsCast;
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

const SNAPSHOT: &[u8] = include_bytes!("../../tests/data/mlp_adam_3steps.pickle");
const PROFILER: &[u8] = include_bytes!("../../tests/data/convnet_profiler_trace.json");
const RESNET: &[u8] = include_bytes!("../../tests/data/resnet18_sgd_2steps.pickle");
/// `torch.cuda.max_memory_allocated()` of the samples (tests/data/facts.json).
const RESNET_PEAK: u64 = 238078976;
const MLP_PEAK: u64 = 110388224;

fn canvas(w: u32, h: u32) -> web_sys::HtmlCanvasElement {
    let doc = web_sys::window().unwrap().document().unwrap();
    let c: web_sys::HtmlCanvasElement = doc.create_element("canvas").unwrap().dyn_into().unwrap();
    c.set_width(w);
    c.set_height(h);
    doc.body().unwrap().append_child(&c).unwrap();
    c
}

fn open(name: &str, bytes: &[u8]) -> (Session, shared::explore::Overview) {
    match Session::open(name, bytes, |_| {}).unwrap() {
        Opened::Trace(s, o) => (*s, *o),
        Opened::Sweep(_) => panic!("not a trace"),
    }
}

#[wasm_bindgen_test]
fn timeline_of_a_real_snapshot_draws_and_maps_pixels_to_time() {
    let (mut session, o) = open("mlp.pickle", SNAPSHOT);
    let c = canvas(900, 340);
    let Response::Timeline { points, driver, start_s, end_s, ledger } =
        session.answer(&Request::Timeline { start_s: 0.0, end_s: o.duration_s, buckets: 900 })
    else {
        panic!("no timeline")
    };
    assert_eq!(points.iter().map(|p| p.allocated_max_bytes).max(), Some(o.summary.peak_allocated_bytes));
    let blank = charts::painted_pixels(&c);
    let m = charts::draw_timeline(&c, &Palette::DARK, (start_s, end_s), &points, &driver, &ledger, &o.phase_bands, &o.layer_bands, None)
        .unwrap();
    assert!(charts::painted_pixels(&c) > blank + 10_000);
    assert!((m.x_at(m.px.0) - start_s).abs() < 1e-12 && (m.x_at(m.px.1) - end_s).abs() < 1e-9);
}

#[wasm_bindgen_test]
fn flame_graph_layout_fills_the_width_and_draws() {
    let (mut session, _) = open("mlp.pickle", SNAPSHOT);
    let Response::Flame { graph: flame } = session.answer(&Request::Flame { all_frames: false }) else { panic!("no flame graph") };
    let boxes = flame_layout(&flame, 0, FlameMetric::LiveAtPeak, 1000.0);
    // The root spans the width; its children together span at most the width.
    assert_eq!((boxes[0].x, boxes[0].w), (0.0, 1000.0));
    let children: f64 = boxes.iter().filter(|b| flame.nodes[b.node as usize].parent == Some(0)).map(|b| b.w).sum();
    assert!(children <= 1000.0 + 1e-6 && children > 999.0, "{children}");
    let c = canvas(1000, 400);
    charts::draw_flame(&c, &Palette::LIGHT, &flame, &boxes, "").unwrap();
    assert!(charts::painted_pixels(&c) > 20_000);
    // Zooming into a child makes it the full width.
    let child = boxes.iter().find(|b| flame.nodes[b.node as usize].parent == Some(0)).unwrap().node;
    let zoomed = flame_layout(&flame, child, FlameMetric::LiveAtPeak, 1000.0);
    assert!(zoomed.iter().any(|b| b.node == child && b.w == 1000.0));
}

#[wasm_bindgen_test]
fn rank_chart_and_segments_draw() {
    let (_, o) = open("convnet.json", PROFILER);
    let c = canvas(900, 340);
    let m = charts::draw_rank(&c, &Palette::DARK, o.profile.as_ref(), &o.curves).unwrap();
    assert_eq!(m.x.1 as usize, o.profile.as_ref().unwrap().nodes.len());
    assert!(charts::painted_pixels(&c) > 10_000);
    let (mut session, snap) = open("mlp.pickle", SNAPSHOT);
    let Response::Segments { segments, .. } = session.answer(&Request::Segments { t_s: snap.summary.peak_time_s }) else { panic!() };
    let c = canvas(900, 200);
    // Alone, a map is on its own scale (0: its largest segment spans the width).
    assert_eq!(charts::draw_segments(&c, &Palette::DARK, &segments, 12, 0).unwrap(), segments.len().saturating_sub(16));
    assert!(charts::painted_pixels(&c) > 1_000);
}

#[wasm_bindgen_test]
fn simulated_segments_draw_beside_the_recorded_ones() {
    let (mut session, snap) = open("mlp.pickle", SNAPSHOT);
    let t_s = snap.summary.peak_time_s;
    let Response::Segments { segments: recorded, .. } = session.answer(&Request::Segments { t_s }) else { panic!() };
    let allocated = |s: &[shared::model::SegmentInfo]| -> u64 {
        s.iter().flat_map(|g| &g.blocks).filter(|b| b.state == shared::model::BlockState::Allocated).map(|b| b.size_bytes).sum()
    };
    let request = viewer::messages::requests::simulated_segments(t_s, " expandable_segments:True ");
    let Response::SimulatedSegments { segments, error, alloc_conf, .. } = session.answer(&request) else { panic!() };
    assert_eq!((error, alloc_conf.as_str()), (None, "expandable_segments:True"));
    assert_eq!(allocated(&segments), allocated(&recorded));
    assert!(!segments.is_empty() && segments.len() < recorded.len(), "{} simulated, {} recorded", segments.len(), recorded.len());
    // Beside the recorded map, on its scale: the largest segment of either spans the width.
    let largest = recorded.iter().chain(&segments).map(|g| g.size_bytes).max().unwrap();
    let c = canvas(450, 200);
    assert_eq!(charts::draw_segments(&c, &Palette::DARK, &segments, 12, largest).unwrap(), segments.len().saturating_sub(16));
    assert!(charts::painted_pixels(&c) > 1_000);
    // A setting that does not parse is an error line naming what was wrong, not a panic.
    let bad = viewer::messages::requests::simulated_segments(t_s, "expandable_segments:yes");
    let Response::SimulatedSegments { segments, error: Some(e), .. } = session.answer(&bad) else { panic!("no error") };
    assert!(segments.is_empty() && e.contains("expandable_segments") && e.contains("yes"), "{e}");
}

#[wasm_bindgen_test]
fn table_selection_filters_and_sorts() {
    let (_, o) = open("convnet.json", PROFILER);
    let rows = viewer::tables::select(&o.layers, |l| &l.layer_name, "CONV", |a, b| a.peak_allocated.cmp(&b.peak_allocated), true);
    assert!(!rows.is_empty());
    assert!(rows.iter().all(|l| l.layer_name.to_lowercase().contains("conv")));
    assert!(rows.windows(2).all(|w| w[0].peak_allocated >= w[1].peak_allocated));
}

/// Pixels of exactly `colour` in rows `rows` of the canvas.
fn pixels_in(canvas: &web_sys::HtmlCanvasElement, colour: plotters::style::RGBColor, rows: std::ops::Range<u32>) -> usize {
    let ctx: web_sys::CanvasRenderingContext2d = canvas.get_context("2d").unwrap().unwrap().dyn_into().unwrap();
    let height = rows.end.saturating_sub(rows.start) as f64;
    let data = ctx.get_image_data(0.0, rows.start as f64, canvas.width() as f64, height).unwrap().data();
    data.chunks_exact(4).filter(|p| (p[0], p[1], p[2]) == (colour.0, colour.1, colour.2)).count()
}

/// Pixels of exactly `colour` on the canvas.
fn pixels_of(canvas: &web_sys::HtmlCanvasElement, colour: plotters::style::RGBColor) -> usize {
    pixels_in(canvas, colour, 0..canvas.height())
}

fn open_ranks() -> (Session, Overview) {
    let files = vec![("rank1.pickle".to_owned(), SNAPSHOT.to_vec()), ("rank0.pickle".to_owned(), RESNET.to_vec())];
    match Session::open_ranks(&files, &MergeOptions::default(), |_| {}).unwrap() {
        Opened::Trace(s, o) => (*s, *o),
        Opened::Sweep(_) => panic!("not a trace"),
    }
}

#[wasm_bindgen_test]
fn rank_files_merge_and_their_panels_share_one_axis() {
    let (mut session, o) = open_ranks();
    let ranks = o.ranks.expect("two ranks");
    let peaks: Vec<(u32, u64)> = ranks.devices.iter().map(|d| (d.rank, d.peak_allocated_bytes)).collect();
    assert_eq!(peaks, [(0, RESNET_PEAK), (1, MLP_PEAK)]);
    let Response::RankCurves { end_s, curves } = session.answer(&Request::RankCurves { buckets: 900 }) else { panic!("no curves") };
    let c = canvas(900, 220);
    let blank = charts::painted_pixels(&c);
    let pal = Palette::DARK;
    let panels = charts::draw_rank_curves(&c, &pal, end_s, &curves, ranks.highest_device).unwrap();
    assert_eq!(panels.len(), 2);
    // Same time range and same pixel columns: one shared axis; the panels stack.
    assert_eq!(panels[0].x, (0.0, end_s));
    assert_eq!((panels[0].x, panels[0].px), (panels[1].x, panels[1].px));
    assert!(panels[0].py.1 <= panels[1].py.0, "{panels:?}");
    assert!(charts::painted_pixels(&c) > blank + 10_000);
    // Rank 0 has the highest peak: its panel (the top half) is drawn and marked in the
    // highlight colour, rank 1's in the plain one.
    let (top, bottom) = (0..c.height() / 2, c.height() / 2..c.height());
    let counts = [
        pixels_in(&c, pal.highlight, top.clone()),
        pixels_in(&c, pal.allocated, top),
        pixels_in(&c, pal.highlight, bottom.clone()),
        pixels_in(&c, pal.allocated, bottom),
    ];
    assert!(counts[0] > 50 && counts[1] == 0 && counts[2] == 0 && counts[3] > 50, "highlight/allocated top, then bottom: {counts:?}");
    // Picking rank 1 shows its own trace.
    let Response::Overview(one) = session.answer(&Request::ShowRank { rank: Some(1) }) else { panic!("no overview") };
    assert_eq!(one.summary.peak_allocated_bytes, MLP_PEAK);
}

#[wasm_bindgen_test]
fn two_traces_compare_and_both_curves_draw() {
    let (session, _) = open("resnet18.pickle", RESNET);
    let d = session.compare_with("mlp.pickle", SNAPSHOT).unwrap();
    assert_eq!(d.peak_allocated_delta_bytes, MLP_PEAK as i64 - RESNET_PEAK as i64);
    assert_eq!(
        viewer::components::compare::diff::signed_bytes(d.peak_allocated_delta_bytes),
        format!("−{}", shared::units::format_bytes(RESNET_PEAK - MLP_PEAK))
    );
    assert_eq!(viewer::components::compare::diff::signed_bytes(0), "0 B");
    let c = canvas(900, 300);
    let pal = Palette::LIGHT;
    let m = charts::draw_diff_curves(&c, &pal, &d.curves, ("resnet18.pickle", "mlp.pickle")).unwrap();
    let xs: Vec<f64> = d.curves.a.iter().chain(&d.curves.b).map(|p| p.x).collect();
    assert_eq!(m.x.0, xs.iter().copied().fold(f64::INFINITY, f64::min));
    assert_eq!(m.x.1, xs.iter().copied().fold(f64::NEG_INFINITY, f64::max));
    // A's line and B's line (and their legend swatches) are both there.
    assert!(pixels_of(&c, pal.allocated) > 300 && pixels_of(&c, pal.reserved) > 300);
}

#[wasm_bindgen_test]
fn page_messages_read_back_as_they_were_sent() {
    use viewer::messages::{requests, ChartWidths, ToWorker, Unreadable};
    let request = Request::Timeline { start_s: 0.5, end_s: 2.0, buckets: 900 };
    let ToWorker::Request { id, request: back } =
        ToWorker::from_js(&ToWorker::Request { id: 7, request: request.clone() }.to_js()).unwrap()
    else {
        panic!("not a request")
    };
    assert_eq!((id, requests::Key::of(&back)), (7, requests::Key::of(&request)));
    let file = web_sys::File::new_with_str_sequence(&js_sys::Array::of1(&"x".into()), "t.pickle").unwrap();
    let widths = Some(ChartWidths { timeline: 900, active: 880, fragmentation: 900, pools: 860 });
    // A ring only where the test's page may share memory (cross-origin isolated).
    let ring = viewer::ring::Ring::for_file(100.0);
    assert_eq!(ring.is_some(), viewer::ring::shared_memory_available());
    let sent = ToWorker::OpenFile { file, memory_budget_bytes: 1e9, widths, ring: ring.clone() };
    let ToWorker::OpenFile { file, memory_budget_bytes, widths: got, ring: ring_back } = ToWorker::from_js(&sent.to_js()).unwrap() else {
        panic!("not a file")
    };
    assert_eq!((file.name(), memory_budget_bytes, got), ("t.pickle".to_owned(), 1e9, widths));
    // The same shared memory, sized to the file.
    assert_eq!(ring_back.map(|r| r.data.byte_length()), ring.map(|r| r.data.byte_length()));
    assert!(matches!(ToWorker::from_js(&ToWorker::FirstScreenShown.to_js()), Ok(ToWorker::FirstScreenShown)));
    // A request whose body does not parse is answered with its id; anything else unknown is not.
    let bad = js_sys::Object::new();
    js_sys::Reflect::set(&bad, &"kind".into(), &"request".into()).unwrap();
    js_sys::Reflect::set(&bad, &"id".into(), &3.into()).unwrap();
    js_sys::Reflect::set(&bad, &"body".into(), &"{}".into()).unwrap();
    assert!(matches!(ToWorker::from_js(&bad), Err(Unreadable { request_id: Some(3), .. })));
    assert!(matches!(ToWorker::from_js(&js_sys::Object::new().into()), Err(Unreadable { request_id: None, .. })));
}

/// A prefetched answer crosses as its JSON and reads back as the session answered it (the
/// flame graph, whose columns have a `kind` of their own); one that does not read is an error
/// answer saying so.
#[wasm_bindgen_test]
fn prefetched_answers_read_back_when_asked() {
    use viewer::messages::requests::Key;
    use viewer::messages::{read_answer, ToPage};
    let (mut session, _) = open("mlp.pickle", SNAPSHOT);
    let answer = session.answer(&Request::Flame { all_frames: false });
    let sent = ToPage::Prefetched { key: Key::Flame { all_frames: false }, response: serde_json::to_string(&answer).unwrap() };
    let Ok(ToPage::Prefetched { key, response }) = ToPage::from_text(&serde_json::to_string(&sent).unwrap()) else {
        panic!("not a prefetched answer")
    };
    assert_eq!(key, Key::Flame { all_frames: false });
    let (Response::Flame { graph: back }, Response::Flame { graph }) = (read_answer(&response), answer) else {
        panic!("not a flame graph")
    };
    assert_eq!(back, graph);
    let Response::Error { message } = read_answer("{\"kind\": \"flame\"}") else { panic!("a bad answer read") };
    assert!(message.starts_with("unreadable answer from the worker"), "{message}");
}

/// An overview crosses with the first screen's answer and the keys of the answers to come: the
/// keys read back as the page looks them up (`Key::of` the requests its views build, times by
/// their bits), and the answer as the session made it.
#[wasm_bindgen_test]
fn an_overview_crosses_with_its_first_answer_and_the_keys_to_come() {
    use viewer::messages::requests::{self, Key};
    use viewer::messages::{read_answer, ToPage};
    let (mut session, mut overview) = open("mlp.pickle", SNAPSHOT);
    // A duration whose JSON serde_json's default parser read back one unit in the last place
    // off: the page's key then missed the worker's (`float_roundtrip` keeps the bits).
    overview.duration_s = 10.993402306909223;
    let full = requests::full_window(&overview);
    let timeline = requests::timeline(full, 1187);
    let below = [
        requests::active(full, 1187),
        Request::Flame { all_frames: false },
        requests::segments(overview.summary.peak_time_s),
        requests::pools(640),
    ];
    let answer = serde_json::to_string(&session.answer(&timeline)).unwrap();
    let sent = ToPage::Loaded {
        overview: Box::new(overview.clone()),
        worker_memory_bytes: 1 << 20,
        answered: vec![(Key::of(&timeline).unwrap(), answer)],
        coming: below.iter().map(|r| Key::of(r).unwrap()).collect(),
        stages: vec![("parsing".into(), 1.5)],
        read_ms: 2.0,
    };
    let Ok(ToPage::Loaded { answered, coming, overview: back, .. }) = ToPage::from_text(&serde_json::to_string(&sent).unwrap()) else {
        panic!("not an overview")
    };
    assert_eq!(back.summary.peak_allocated_bytes, overview.summary.peak_allocated_bytes);
    assert_eq!(answered.len(), 1);
    assert_eq!(Some(answered[0].0), Key::of(&requests::timeline(requests::full_window(&back), 1187)));
    let Response::Timeline { points, .. } = read_answer(&answered[0].1) else { panic!("not a timeline") };
    assert!(!points.is_empty());
    let looked_up: Vec<Option<Key>> = below.iter().map(Key::of).collect();
    assert_eq!(coming.into_iter().map(Some).collect::<Vec<_>>(), looked_up);
}

#[wasm_bindgen_test]
fn a_request_kind_is_the_name_its_json_carries() {
    let all = [
        Request::Timeline { start_s: 0.0, end_s: 1.0, buckets: 1 },
        Request::At { t_s: 0.0 },
        Request::Allocations { t_s: 0.0, limit: 1 },
        Request::Segments { t_s: 0.0 },
        Request::Export { format: "csv".into() },
        Request::RankCurves { buckets: 1 },
        Request::ShowRank { rank: None },
        Request::DiffDevices { a: 0, b: 1 },
        Request::Advice { budget_bytes: None },
        Request::Active { start_s: 0.0, end_s: 1.0, columns: 1 },
        Request::Allocation { event_index: 0 },
        Request::Pools { buckets: 1 },
        Request::Find { query: "x".into(), limit: 0 },
        Request::SimulatedSegments { t_s: 0.0, alloc_conf: String::new() },
        Request::Holders { t_s: 0.0 },
        Request::Flame { all_frames: false },
    ];
    for r in &all {
        let json = serde_json::to_string(r).unwrap();
        assert!(json.starts_with(&format!("{{\"kind\":\"{}\"", viewer::messages::requests::kind(r))), "{json}");
    }
}
