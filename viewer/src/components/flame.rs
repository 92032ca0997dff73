//! The flame graph (icicle) of memory by module path → operator → call stack, weighted by bytes
//! live at the peak or allocated in total; click a box to zoom into it, `/` to search. Its
//! layout, hit testing and search are `shared::analysis::view_math`'s.

use crate::charts;
use crate::state::{Errors, Theme};
use crate::widgets::{percent, png_button};
use crate::{bridge, dom::fit_canvas, perf};
use leptos::html::Canvas;
use leptos::prelude::*;
use shared::analysis::flame::FlameGraph;
use shared::analysis::view_math::{flame_box_at, flame_height_px, flame_layout, flame_search, FlameBox, FlameMetric};
use shared::explore::{Request, Response};
use shared::units::format_bytes;
use std::sync::Arc;

/// The box under the pointer: its node's name, kind and both weights with their share of the
/// root.
fn node_tooltip(flame: &FlameGraph, x: f64, y: f64, n: u32) -> impl IntoView {
    let node = &flame.nodes[n as usize];
    let root = &flame.nodes[0];
    let share = |v: u64, r: u64| if r == 0 { "—".to_owned() } else { percent(v as f64 / r as f64) };
    view! {
        <div class="tooltip" style=format!("left:{}px;top:{}px", x + 14.0, y + 10.0)>
            <b>{node.name.clone()}</b>" (" {format!("{:?}", node.kind).to_lowercase()} ")"<br />
            "live at peak " {format_bytes(node.live_at_peak_bytes)} " · " {share(node.live_at_peak_bytes, root.live_at_peak_bytes)}<br />
            "allocated in total " {format_bytes(node.total_allocated_bytes)} " · " {share(node.total_allocated_bytes, root.total_allocated_bytes)}
        </div>
    }
}

/// The metric chosen in a `<select>`.
fn metric_of(ev: &leptos::ev::Event) -> FlameMetric {
    if event_target_value(ev) == "total" {
        FlameMetric::TotalAllocated
    } else {
        FlameMetric::LiveAtPeak
    }
}

/// The flame graph, once the worker (or the server) answers it.
#[component]
pub fn FlameSection() -> impl IntoView {
    let errors = expect_context::<Errors>();
    let flame: RwSignal<Option<Arc<FlameGraph>>> = RwSignal::new(None);
    // Torch's and Python's own frames (the unwinder, the allocator, the interpreter) are folded
    // unless asked for.
    let all_frames = RwSignal::new(false);
    let ask = move |all: bool| {
        bridge::ask(&Request::Flame { all_frames: all }, move |r| match r {
            Response::Flame { graph } => flame.set(Some(Arc::new(*graph))),
            Response::Error { message } => errors.report("flame graph", message),
            _ => {}
        })
    };
    ask(false);
    Effect::new(move |first: Option<()>| {
        let all = all_frames.get();
        if first.is_some() {
            ask(all);
        }
    });
    move || flame.get().map(|f| flame_view(f, all_frames))
}

/// The flame graph drawn; `all_frames`: the switch that shows the runtime's frames.
fn flame_view(flame: Arc<FlameGraph>, all_frames: RwSignal<bool>) -> impl IntoView {
    let (theme, errors) = (expect_context::<Theme>(), expect_context::<Errors>());
    let metric = RwSignal::new(FlameMetric::LiveAtPeak);
    let focus = RwSignal::new(0u32);
    let search = RwSignal::new(String::new());
    let boxes: StoredValue<Vec<FlameBox>> = StoredValue::new(Vec::new());
    let hover: RwSignal<Option<(f64, f64, u32)>> = RwSignal::new(None);
    let canvas = NodeRef::<Canvas>::new();
    let f = flame.clone();
    Effect::new(move |_| {
        let pal = theme.palette();
        let (m, fo, q) = (metric.get(), focus.get(), search.get());
        let Some(c) = canvas.get() else { return };
        fit_canvas(&c, 100);
        let layout = flame_layout(&f, fo, m, c.width() as f64);
        fit_canvas(&c, (flame_height_px(&layout) as u32 + 4).clamp(60, 2400));
        perf::mark("draw flame");
        match charts::draw_flame(&c, &pal, &f, &layout, &q) {
            Ok(()) => perf::drawn(perf::Chart::Flame),
            Err(e) => errors.report("flame graph", e),
        }
        boxes.set_value(layout);
    });
    let hit = move |x: f64, y: f64| boxes.with_value(|b| flame_box_at(b, x, y));
    let f = flame.clone();
    let matched = move || {
        let m = flame_search(&f, &search.get(), metric.get())?;
        Some(format!("{} matches, {} ({:.1} % of the root)", m.count, format_bytes(m.bytes), m.percent_of_root))
    };
    let left_out = flame.nodes_left_out;
    view! {
        <section class="card" id="flame">
            <div class="card-head">
                <h2>"Flame graph"</h2>
                <select on:change=move |ev| metric.set(metric_of(&ev))>
                    <option value="live">"bytes live at the peak"</option>
                    <option value="total">"bytes allocated in total"</option>
                </select>
                <input type="search" id="flame-search" placeholder="search (/)" on:input=move |ev| search.set(event_target_value(&ev)) />
                <span class="hint">{matched}</span>
                <label class="hint" title="the unwinder, the caching allocator, PyTorch's dispatcher, CPython's interpreter, nn.Module's call">
                    <input type="checkbox" id="flame-all-frames" prop:checked=move || all_frames.get()
                        on:change=move |ev| all_frames.set(event_target_checked(&ev)) />
                    " torch's and Python's own frames"
                </label>
                <span class="spacer"></span>
                <button class="small" on:click=move |_| focus.set(0)>"Reset zoom"</button>
                {png_button(canvas, "flame")}
            </div>
            <div class="chart-wrap">
                <canvas class="chart" id="flame-canvas" node_ref=canvas
                    on:click=move |ev: leptos::ev::MouseEvent| {
                        if let Some(n) = hit(ev.offset_x() as f64, ev.offset_y() as f64) { focus.set(n) }
                    }
                    on:mousemove=move |ev: leptos::ev::MouseEvent| {
                        let (x, y) = (ev.offset_x() as f64, ev.offset_y() as f64);
                        hover.set(hit(x, y).map(|n| (x, y, n)));
                    }
                    on:mouseleave=move |_| hover.set(None)></canvas>
                {move || hover.get().map(|(x, y, n)| node_tooltip(&flame, x, y, n))}
            </div>
            <p class="sub">"Module path → operator → call stack (outermost frame first; torch's and Python's own frames folded unless shown). Click a box to zoom into it."
                {(left_out > 0).then(|| format!(" {left_out} boxes under 0.01 % of the total are not drawn; their bytes stay in their parents."))}</p>
        </section>
    }
}
