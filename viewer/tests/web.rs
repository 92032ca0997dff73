//! Components in a real browser (headless Chromium through wasm-bindgen-test): the worker's
//! analysis code running as wasm on the real samples, and every chart drawing real pixels.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use shared::explore::{Opened, Request, Response, Session};
use viewer::charts::{self, FlameMetric, Palette};
use wasm_bindgen::JsCast;
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_browser);

const SNAPSHOT: &[u8] = include_bytes!("../../tests/data/mlp_adam_3steps.pickle");
const PROFILER: &[u8] = include_bytes!("../../tests/data/convnet_profiler_trace.json");

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
    let (session, o) = open("mlp.pickle", SNAPSHOT);
    let c = canvas(900, 340);
    let Response::Timeline { points, driver, start_s, end_s } =
        session.answer(&Request::Timeline { start_s: 0.0, end_s: o.duration_s, buckets: 900 })
    else {
        panic!("no timeline")
    };
    assert_eq!(points.iter().map(|p| p.allocated_max_bytes).max(), Some(o.summary.peak_allocated_bytes));
    let blank = charts::painted_pixels(&c);
    let m = charts::draw_timeline(&c, &Palette::DARK, (start_s, end_s), &points, &driver, &o.phase_bands, &o.layer_bands, None).unwrap();
    assert!(charts::painted_pixels(&c) > blank + 10_000);
    assert!((m.x_at(m.px.0) - start_s).abs() < 1e-12 && (m.x_at(m.px.1) - end_s).abs() < 1e-9);
}

#[wasm_bindgen_test]
fn flame_graph_layout_fills_the_width_and_draws() {
    let (_, o) = open("mlp.pickle", SNAPSHOT);
    let boxes = charts::flame_layout(&o.flame, 0, FlameMetric::LiveAtPeak, 1000.0);
    // The root spans the width; its children together span at most the width.
    assert_eq!((boxes[0].x, boxes[0].w), (0.0, 1000.0));
    let children: f64 = boxes.iter().filter(|b| o.flame.nodes[b.node as usize].parent == Some(0)).map(|b| b.w).sum();
    assert!(children <= 1000.0 + 1e-6 && children > 999.0, "{children}");
    let c = canvas(1000, 400);
    charts::draw_flame(&c, &Palette::LIGHT, &o.flame, &boxes, "").unwrap();
    assert!(charts::painted_pixels(&c) > 20_000);
    // Zooming into a child makes it the full width.
    let child = boxes.iter().find(|b| o.flame.nodes[b.node as usize].parent == Some(0)).unwrap().node;
    let zoomed = charts::flame_layout(&o.flame, child, FlameMetric::LiveAtPeak, 1000.0);
    assert!(zoomed.iter().any(|b| b.node == child && b.w == 1000.0));
}

#[wasm_bindgen_test]
fn rank_chart_and_segments_draw() {
    let (_, o) = open("convnet.json", PROFILER);
    let c = canvas(900, 340);
    let m = charts::draw_rank(&c, &Palette::DARK, o.profile.as_ref(), &o.curves).unwrap();
    assert_eq!(m.x.1 as usize, o.profile.as_ref().unwrap().nodes.len());
    assert!(charts::painted_pixels(&c) > 10_000);
    let (session, snap) = open("mlp.pickle", SNAPSHOT);
    let Response::Segments { segments, .. } = session.answer(&Request::Segments { t_s: snap.summary.peak_time_s }) else { panic!() };
    let c = canvas(900, 200);
    assert_eq!(charts::draw_segments(&c, &Palette::DARK, &segments, 12).unwrap(), segments.len().saturating_sub(16));
    assert!(charts::painted_pixels(&c) > 1_000);
}

#[wasm_bindgen_test]
fn table_selection_filters_and_sorts() {
    let (_, o) = open("convnet.json", PROFILER);
    let rows = viewer::tables::select(&o.layers, |l| &l.layer_name, "CONV", |a, b| a.peak_allocated.cmp(&b.peak_allocated), true);
    assert!(!rows.is_empty());
    assert!(rows.iter().all(|l| l.layer_name.to_lowercase().contains("conv")));
    assert!(rows.windows(2).all(|w| w[0].peak_allocated >= w[1].peak_allocated));
}
