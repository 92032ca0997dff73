//! The Active Memory Timeline (memory_viz's main view): every allocation as its own band,
//! stacked in the order they were made; the smaller ones and what predates the trace in one
//! band at the bottom, so the top is the exact allocated total. Colour by layer, operator,
//! stack or category; hover for size and lifetime; click to pin one with its stack; search.

use crate::charts::{self, ActiveMapping, ColourBy};
use crate::messages::requests;
use crate::state::{Errors, Theme};
use crate::widgets::png_button;
use crate::{bridge, dom::fit_canvas, perf};
use leptos::html::Canvas;
use leptos::prelude::*;
use shared::analysis::active::ActiveTimeline;
use shared::analysis::view_math::{zoomed, Window};
use shared::explore::{Allocation, Overview, Request, Response};
use shared::units::{format_bytes, format_seconds};
use std::sync::Arc;

/// Height of the chart in CSS pixels.
const HEIGHT: u32 = 360;

/// A search's allocation events (sorted), how many allocations matched, and the query.
type Found = (Arc<Vec<u32>>, usize, String);

/// The view's state: its window and detail, the bands the worker answered, the pointer's.
#[derive(Clone, Copy)]
struct Active {
    full: Window,
    window: RwSignal<Window>,
    /// How many allocations are drawn one by one.
    detail: RwSignal<usize>,
    colour_by: RwSignal<ColourBy>,
    data: RwSignal<Option<Arc<ActiveTimeline>>>,
    mapping: StoredValue<Option<ActiveMapping>>,
    /// Pointer position and the band under it.
    hover: RwSignal<Option<(f64, f64, usize)>>,
    /// The band clicked, and its allocation once the worker sends it.
    pinned: RwSignal<Option<(usize, Option<Allocation>)>>,
    found: RwSignal<Option<Found>>,
    canvas: NodeRef<Canvas>,
}

impl Active {
    fn new(full: Window) -> Self {
        Self {
            full,
            window: RwSignal::new(full),
            detail: RwSignal::new(requests::ACTIVE_DETAIL),
            colour_by: RwSignal::new(ColourBy::Layer),
            data: RwSignal::new(None),
            mapping: StoredValue::new(None),
            hover: RwSignal::new(None),
            pinned: RwSignal::new(None),
            found: RwSignal::new(None),
            canvas: NodeRef::new(),
        }
    }

    /// Asks for the bands of the window at the detail chosen (an effect: again when they change).
    fn fetch(self, errors: Errors) {
        let (w, d) = (self.window.get(), self.detail.get());
        let Some(c) = self.canvas.get() else { return };
        fit_canvas(&c, HEIGHT);
        bridge::ask(&requests::active(w, c.width(), d), move |r| match r {
            Response::Active(a) => {
                self.pinned.set(None);
                self.data.set(Some(Arc::new(*a)));
            }
            Response::Error { message } => errors.report("active memory", message),
            _ => {}
        });
    }

    /// Draws the bands (an effect: again when they, the colouring, the pin, the search or the
    /// theme change).
    fn draw(self, theme: Theme, errors: Errors) {
        let pal = theme.palette();
        let (by, pin) = (self.colour_by.get(), self.pinned.with(|p| p.as_ref().map(|p| p.0)));
        let hits = self.found.get().map(|(e, _, _)| e);
        let Some(c) = self.canvas.get() else { return };
        self.data.with(|d| {
            let Some(a) = d else { return };
            fit_canvas(&c, HEIGHT);
            perf::mark("draw active");
            match charts::draw_active(&c, &pal, a, by, pin, hits.as_deref().map(Vec::as_slice)) {
                Ok(m) => {
                    self.mapping.set_value(Some(m));
                    // The highest total drawn and the bands, for tests and the benchmark.
                    let _ = c.set_attribute("data-max-allocated", &a.totals.iter().max().copied().unwrap_or(0).to_string());
                    let _ = c.set_attribute("data-bands", &a.bands.len().to_string());
                    perf::drawn("active");
                }
                Err(e) => errors.report("active memory", e),
            }
        });
    }

    /// Finds the allocations a query names, lit among the others.
    fn search(self, query: String, errors: Errors) {
        if query.trim().is_empty() {
            self.found.set(None);
            return;
        }
        let found = self.found;
        bridge::ask(&Request::Find { query, limit: 0 }, move |r| match r {
            Response::Found(f) => found.set(Some((Arc::new(f.events), f.total, f.query))),
            Response::Error { message } => errors.report("the search", message),
            _ => {}
        });
    }

    fn band_at(self, px: f64, py: f64) -> Option<usize> {
        let (column, bytes) = self.mapping.get_value()?.at(px, py)?;
        self.data.with_untracked(|d| d.as_ref().and_then(|a| charts::active_band_at(a, column, bytes)))
    }

    fn on_move(self, ev: leptos::ev::MouseEvent) {
        let (px, py) = (ev.offset_x() as f64, ev.offset_y() as f64);
        let band = self.band_at(px, py);
        // The band under the pointer, at once (the tooltip follows on the next render).
        if let Some(c) = self.canvas.get_untracked() {
            let _ = c.set_attribute("data-hover-band", &band.map_or(String::new(), |b| b.to_string()));
        }
        self.hover.set(band.map(|b| (px, py, b)));
    }

    /// Pins the band clicked and asks for its allocation (with its stack); a click beside
    /// every band unpins.
    fn on_click(self, ev: leptos::ev::MouseEvent) {
        let Some(b) = self.band_at(ev.offset_x() as f64, ev.offset_y() as f64) else {
            self.pinned.set(None);
            return;
        };
        self.pinned.set(Some((b, None)));
        let Some(event_index) = self.data.with_untracked(|d| d.as_ref().and_then(|a| a.bands.get(b)).map(|x| x.event_index as usize))
        else {
            return;
        };
        let pinned = self.pinned;
        bridge::ask(&Request::Allocation { event_index }, move |r| {
            if let Response::Allocations { allocations, .. } = r {
                pinned.update(|p| {
                    if let Some(p) = p.as_mut().filter(|p| p.0 == b) {
                        p.1 = allocations.into_iter().next();
                    }
                });
            }
        });
    }

    fn on_wheel(self, ev: leptos::ev::WheelEvent) {
        let Some(m) = self.mapping.get_value() else { return };
        ev.prevent_default();
        let t = m.plot.x_at(ev.offset_x() as f64);
        let factor = if ev.delta_y() < 0.0 { 0.8 } else { 1.25 };
        self.window.update(|w| *w = zoomed(*w, factor, t, self.full));
    }

    /// Size, lifetime, layer, operator and category of the band under the pointer.
    fn tooltip(self) -> Option<impl IntoView> {
        let (x, y, b) = self.hover.get()?;
        let band = self.data.with(|d| d.as_ref().and_then(|a| a.bands.get(b).cloned()))?;
        let life = band.free_s.map_or("until the end".to_owned(), |f| format_seconds(f - band.alloc_s));
        Some(view! {
            <div class="tooltip" style=format!("left:{}px;top:{}px", x + 14.0, y + 10.0)>
                <b>{format_bytes(band.size_bytes)}</b><br />
                "allocated at " {format_seconds(band.alloc_s)} ", lives " {life}<br />
                {band.layer.map(|l| view! { "layer " <code>{l}</code><br /> })}
                {band.op.map(|o| view! { "op " <code>{o}</code><br /> })}
                {band.category.map(|c| view! { "category " {c.as_str().replace('_', " ")}<br /> })}
                "click to pin and see its stack"
            </div>
        })
    }
}

/// The card's head: search, colouring, detail, reset and PNG.
fn controls(a: Active, errors: Errors) -> impl IntoView {
    let select_colour = move |ev: leptos::ev::Event| {
        a.colour_by.set(match event_target_value(&ev).as_str() {
            "operator" => ColourBy::Operator,
            "stack" => ColourBy::Stack,
            "category" => ColourBy::Category,
            _ => ColourBy::Layer,
        })
    };
    let select_detail = move |ev: leptos::ev::Event| a.detail.set(event_target_value(&ev).parse().unwrap_or(2000));
    view! {
        <div class="card-head">
            <h2>"Active memory"</h2>
            <span class="hint">"every allocation as its own band, stacked as made; wheel to zoom, hover for size and lifetime, click to pin"</span>
            <span class="spacer"></span>
            <input type="search" id="active-search" placeholder="find: 0x address, file:line, module, metadata"
                on:change=move |ev| a.search(event_target_value(&ev), errors) />
            <span class="hint" id="active-found">{move || a.found.get().map(|(_, n, q)| format!("{n} allocations match {q:?}"))}</span>
            <label>"colour by " <select id="active-colour" on:change=select_colour>
                <option value="layer">"layer"</option><option value="operator">"operator"</option><option value="stack">"stack"</option>
                <option value="category">"category"</option>
            </select></label>
            <label>" detail " <select id="active-detail" on:change=select_detail>
                <option value="500">"500 largest"</option><option value="2000" selected>"2000 largest"</option>
                <option value="10000">"10000 largest"</option><option value="50000">"50000 largest"</option>
            </select></label>
            <button class="small" on:click=move |_| a.window.set(a.full)>"Reset"</button>
            {png_button(a.canvas, "active")}
        </div>
    }
}

/// The pinned band's allocation ("…" until the worker sends it), its stack, and a close
/// button.
fn pinned_view(detail: Option<Allocation>, pinned: RwSignal<Option<(usize, Option<Allocation>)>>) -> impl IntoView {
    view! {
        <div class="live-list" id="active-pinned">
            <h3>"Pinned allocation" <button class="small" on:click=move |_| pinned.set(None)>"×"</button></h3>
            {match detail {
                None => view! { <p class="hint">"…"</p> }.into_any(),
                Some(a) => view! {
                    <p>{format_bytes(a.size_bytes)} " at " {format_seconds(a.alloc_s)} ", freed "
                       {a.free_s.map_or("never".to_owned(), format_seconds)} " · " {a.layer.unwrap_or_default()} " "
                       <code>{a.op.unwrap_or_default()}</code>
                       {a.pool.map(|p| format!(" · pool {p}"))}
                       " · the bands that share its stack are lit"</p>
                    {(!a.notes.is_empty()).then(|| view! { <p class="notes" id="active-pinned-notes">{a.notes.join(" · ")}</p> })}
                    <pre>{if a.stack.is_empty() { "no stack recorded".to_owned() } else { a.stack.join("\n") }}</pre>
                }.into_any(),
            }}
        </div>
    }
}

/// The Active Memory Timeline.
#[component]
pub fn ActiveSection(
    /// The trace's overview (its duration).
    overview: Arc<Overview>,
) -> impl IntoView {
    let (theme, errors) = (expect_context::<Theme>(), expect_context::<Errors>());
    let a = Active::new(requests::full_window(&overview));
    Effect::new(move |_| a.fetch(errors));
    Effect::new(move |_| a.draw(theme, errors));
    view! {
        <section class="card" id="active">
            {controls(a, errors)}
            <div class="chart-wrap">
                <canvas class="chart" id="active-canvas" node_ref=a.canvas on:wheel=move |ev| a.on_wheel(ev)
                    on:mousemove=move |ev| a.on_move(ev) on:click=move |ev| a.on_click(ev) on:mouseleave=move |_| a.hover.set(None)></canvas>
                {move || a.tooltip()}
            </div>
            <p class="sub">{move || a.data.with(|d| d.as_ref().map(|t| format!(
                "{} – {}: {} allocations drawn one by one, {} smaller ones (and memory from before the trace) in the grey band",
                format_seconds(t.start_s), format_seconds(t.end_s), t.bands.len(), t.summarized
            )))}</p>
            {move || a.pinned.get().map(|(_, detail)| pinned_view(detail, a.pinned))}
        </section>
    }
}
