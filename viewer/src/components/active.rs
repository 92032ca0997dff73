//! The Active Memory Timeline (memory_viz's main view): every allocation as its own band,
//! stacked in the order they were made; only memory from before the trace (no allocation of
//! its own) in a grey band at the bottom, so the top is the exact allocated total. Drawn with
//! WebGL2 where the browser has it (a zoom or pan moves the bands on the GPU at once, the
//! worker's answer for the new window follows), else on a 2D canvas. Colour by layer,
//! operator, stack or category; hover for size and lifetime; click to pin one with its stack;
//! search.

use crate::charts::{self, ActiveGl, ActiveMapping, ColourBy, Quads};
use crate::messages::requests;
use crate::state::{Errors, Theme};
use crate::widgets::legend_chip;
use crate::{bridge, dom::fit_canvas, perf};
use leptos::html::Canvas;
use leptos::prelude::*;
use shared::analysis::active::{ActiveTimeline, HoverIndex};
use shared::analysis::view_math::{dragged, zoomed, Window};
use shared::explore::{Allocation, Overview, Request, Response};
use shared::units::{format_bytes, format_seconds};
use std::sync::Arc;

/// Height of the chart in CSS pixels.
const HEIGHT: u32 = 360;

/// A search's allocation events (sorted), how many allocations matched, and the query.
type Found = (Arc<Vec<u32>>, usize, String);

/// An answer with what hovering it needs, built once.
struct Answer {
    a: ActiveTimeline,
    hover: HoverIndex,
    top_bytes: u64,
}

/// The GPU path's context, and the answer whose quads it holds.
struct Gpu {
    gl: ActiveGl,
    quads: Quads,
    uploaded: Option<Arc<Answer>>,
    /// The plot's top (bytes) the quads were scaled to.
    ymax: f64,
}

/// The canvas path's last picture of the bands: the plot's pixels, the window they show and
/// the top the plot was scaled to, so that a zoom or pan shows them moved at once (as the GPU
/// path moves its quads) until the worker's answer for the new window is drawn.
struct Picture {
    image: web_sys::HtmlCanvasElement,
    window: Window,
    top: u64,
}

/// The 2D context of `canvas`.
fn context_2d(canvas: &web_sys::HtmlCanvasElement) -> Option<web_sys::CanvasRenderingContext2d> {
    canvas.get_context("2d").ok().flatten().and_then(|c| wasm_bindgen::JsCast::dyn_into(c).ok())
}

/// The view's state: the window shown, the bands the worker answered, the pointer's.
#[derive(Clone, Copy)]
struct Active {
    full: Window,
    /// The window shown and asked for: a zoom or pan moves it at once (the GPU path redraws
    /// the bands it has), the worker's answer for it follows.
    window: RwSignal<Window>,
    colour_by: RwSignal<ColourBy>,
    data: RwSignal<Option<Arc<Answer>>>,
    mapping: StoredValue<Option<ActiveMapping>>,
    /// Pointer position and the band under it.
    hover: RwSignal<Option<(f64, f64, usize)>>,
    /// The band clicked, and its allocation once the worker sends it.
    pinned: RwSignal<Option<(usize, Option<Allocation>)>>,
    found: RwSignal<Option<Found>>,
    canvas: NodeRef<Canvas>,
    gl_canvas: NodeRef<Canvas>,
    /// `None`: the 2D canvas path (no WebGL2, or `?render=canvas`).
    gpu: StoredValue<Option<Gpu>, LocalStorage>,
    /// The canvas path's last picture.
    picture: StoredValue<Option<Picture>, LocalStorage>,
    /// A request is with the worker; the window to ask for when it answers.
    in_flight: StoredValue<bool>,
    queued: StoredValue<Option<Window>>,
    /// When the last zoom or pan input came, until its answer is drawn, and whether a frame
    /// showed it at once.
    input_at: StoredValue<Option<(f64, bool)>>,
    /// A drag: where it began, the window then, and whether it moved the window.
    drag: StoredValue<Option<(f64, Window, bool)>>,
}

/// Appends `ms` to `window[key]` (an array the benchmark reads).
fn push_ms(key: &str, ms: f64) {
    let Some(w) = web_sys::window() else { return };
    let key = wasm_bindgen::JsValue::from_str(key);
    let arr = js_sys::Reflect::get(&w, &key).ok().filter(|v| v.is_object()).unwrap_or_else(|| {
        let a: wasm_bindgen::JsValue = js_sys::Array::new().into();
        let _ = js_sys::Reflect::set(&w, &key, &a);
        a
    });
    let _ = wasm_bindgen::JsCast::unchecked_into::<js_sys::Array>(arr).push(&ms.into());
}

impl Active {
    fn new(full: Window) -> Self {
        Self {
            full,
            window: RwSignal::new(full),
            colour_by: RwSignal::new(ColourBy::Layer),
            data: RwSignal::new(None),
            mapping: StoredValue::new(None),
            hover: RwSignal::new(None),
            pinned: RwSignal::new(None),
            found: RwSignal::new(None),
            canvas: NodeRef::new(),
            gl_canvas: NodeRef::new(),
            gpu: StoredValue::new_local(None),
            picture: StoredValue::new_local(None),
            in_flight: StoredValue::new(false),
            queued: StoredValue::new(None),
            input_at: StoredValue::new(None),
            drag: StoredValue::new(None),
        }
    }

    /// Picks the path once both canvases exist: WebGL2 where a GPU draws it, else the 2D
    /// canvas; `?render=canvas` forces the canvas, `?render=webgl2` WebGL2 even drawn on the
    /// CPU (the tests compare both paths in a GPU-less browser).
    fn start_gpu(self) {
        let (Some(c), Some(g)) = (self.canvas.get_untracked(), self.gl_canvas.get_untracked()) else { return };
        let asked = crate::dom::query_param("render");
        let gpu = match asked.as_deref() {
            Some("canvas") => Err("?render=canvas".to_owned()),
            other => ActiveGl::new(&g, other == Some("webgl2")),
        };
        let render = match gpu {
            Ok(gl) => {
                self.gpu.set_value(Some(Gpu { gl, quads: Quads::default(), uploaded: None, ymax: 1.0 }));
                "webgl2".to_owned()
            }
            Err(why) => {
                let _ = g.set_attribute("style", "display:none");
                format!("canvas ({why})")
            }
        };
        let _ = c.set_attribute("data-render", &render);
    }

    /// Asks for the bands of the window (an effect: again when it changes), one request at a
    /// time: a window asked meanwhile waits, the last one only.
    fn fetch(self, errors: Errors) {
        let w = self.window.get();
        if self.in_flight.get_value() {
            self.queued.set_value(Some(w));
            return;
        }
        self.ask(w, errors);
    }

    fn ask(self, w: Window, errors: Errors) {
        let Some(c) = self.canvas.get_untracked() else { return };
        fit_canvas(&c, HEIGHT);
        self.in_flight.set_value(true);
        bridge::ask(&requests::active(w, c.width()), move |r| {
            self.in_flight.set_value(false);
            match r {
                Response::Active(a) if a.bands.is_consistent(a.totals.len()) => {
                    self.pinned.set(None);
                    let top_bytes = a.totals.iter().copied().max().unwrap_or(0);
                    self.data.set(Some(Arc::new(Answer { hover: HoverIndex::new(&a.bands), a: *a, top_bytes })));
                }
                Response::Active(_) => errors.report("active memory", "the bands answered do not fit their columns".into()),
                Response::Error { message } => errors.report("active memory", message),
                _ => {}
            }
            if let Some(next) = self.queued.get_value() {
                self.queued.set_value(None);
                if next != w {
                    self.ask(next, errors);
                }
            }
        });
    }

    /// Draws the answer (an effect: again when it, the colouring, the pin, the search or the
    /// theme change) on the path chosen.
    fn draw(self, theme: Theme, errors: Errors) {
        let pal = theme.palette();
        let (by, pin) = (self.colour_by.get(), self.pinned.with(|p| p.as_ref().map(|p| p.0)));
        let hits = self.found.get().map(|(e, _, _)| e);
        let Some(d) = self.data.get() else { return };
        let Some(c) = self.canvas.get() else { return };
        fit_canvas(&c, HEIGHT);
        perf::mark("draw active");
        let a = &d.a;
        let styles = charts::band_styles(&a.bands, &by.colours(&a.bands), pin, hits.as_deref().map(Vec::as_slice));
        let gpu = self.gpu.try_update_value(|g| {
            let g = g.as_mut()?;
            if !g.uploaded.as_ref().is_some_and(|u| Arc::ptr_eq(u, &d)) {
                // The plot's top for this answer, as its axes will be drawn.
                g.ymax = charts::draw_active_axes(&c, &pal, (a.start_s, a.end_s), d.top_bytes).map_or(1.0, |m| m.ymax);
                g.quads = Quads::of(a, g.ymax);
                g.gl.upload_quads(&g.quads);
                g.uploaded = Some(d.clone());
            }
            g.gl.upload_colours(&g.quads, &styles, &pal);
            g.gl.upload_outline(a, pin, g.ymax);
            Some(())
        });
        let drawn = match gpu.flatten() {
            Some(()) => self.frame(self.window.get_untracked(), &pal),
            None => charts::draw_active(&c, &pal, a, &styles, pin).map(|m| {
                self.keep_picture(&c, &m, (a.start_s, a.end_s), a.totals.iter().copied().max().unwrap_or(0));
                self.mapping.set_value(Some(m));
            }),
        };
        if let Err(e) = drawn {
            return errors.report("active memory", e);
        }
        // What was drawn, for tests and the benchmark.
        let _ = c.set_attribute("data-max-allocated", &d.top_bytes.to_string());
        let _ = c.set_attribute("data-bands", &a.bands.len().to_string());
        let _ = c.set_attribute("data-between", &a.between.to_string());
        let _ = c.set_attribute("data-before-trace", &a.before_trace.iter().max().copied().unwrap_or(0).to_string());
        perf::drawn(perf::Chart::Active);
        if let Some((t, framed)) = self.input_at.get_value() {
            self.input_at.set_value(None);
            push_ms("__mtActiveRefined", perf::now() - t);
            if !framed {
                push_ms("__mtActiveFrames", perf::now() - t);
            }
        }
    }

    /// The GPU path's frame of `view`: the axes on the 2D canvas, the bands held on the GPU
    /// moved under them by a uniform (no worker in between).
    fn frame(self, view: Window, pal: &charts::Palette) -> Result<(), String> {
        let (Some(c), Some(g)) = (self.canvas.get_untracked(), self.gl_canvas.get_untracked()) else { return Ok(()) };
        let Some(d) = self.gpu.with_value(|g| g.as_ref().and_then(|g| g.uploaded.clone())) else { return Ok(()) };
        let m = charts::draw_active_axes(&c, pal, view, d.top_bytes)?;
        self.mapping.set_value(Some(m));
        let (w, h) = ((m.plot.px.1 - m.plot.px.0).max(1.0), (m.plot.py.1 - m.plot.py.0).max(1.0));
        if g.width() != w as u32 || g.height() != h as u32 {
            g.set_width(w as u32);
            g.set_height(h as u32);
        }
        let style = format!("left:{}px;top:{}px;width:{w}px;height:{h}px", m.plot.px.0, m.plot.py.0);
        if g.get_attribute("style").as_deref() != Some(&style) {
            let _ = g.set_attribute("style", &style);
        }
        let map = charts::x_map((d.a.start_s, d.a.end_s), d.a.totals.len(), view);
        self.gpu.with_value(|gpu| gpu.as_ref().map(|gpu| gpu.gl.draw(map, pal, true)));
        Ok(())
    }

    /// Copies the plot's pixels just drawn on the canvas path, for [`Active::picture_frame`].
    fn keep_picture(self, c: &web_sys::HtmlCanvasElement, m: &ActiveMapping, window: Window, top: u64) {
        let (x, y) = (m.plot.px.0, m.plot.py.0);
        let (w, h) = ((m.plot.px.1 - x).max(1.0), (m.plot.py.1 - y).max(1.0));
        let image = web_sys::window()
            .and_then(|win| win.document())
            .and_then(|d| d.create_element("canvas").ok())
            .and_then(|e| wasm_bindgen::JsCast::dyn_into::<web_sys::HtmlCanvasElement>(e).ok());
        let Some(image) = image else { return };
        image.set_width(w as u32);
        image.set_height(h as u32);
        let Some(ctx) = context_2d(&image) else { return };
        if ctx.draw_image_with_html_canvas_element_and_sw_and_sh_and_dx_and_dy_and_dw_and_dh(c, x, y, w, h, 0.0, 0.0, w, h).is_ok() {
            self.picture.set_value(Some(Picture { image, window, top }));
        }
    }

    /// The canvas path's frame of `view`: the axes, and the last picture moved and stretched
    /// under them (no worker in between). False when there is no picture yet.
    fn picture_frame(self, view: Window, pal: &charts::Palette) -> bool {
        let Some(c) = self.canvas.get_untracked() else { return false };
        self.picture.with_value(|p| {
            let Some(p) = p else { return false };
            let (Ok(m), Some(ctx)) = (charts::draw_active_axes(&c, pal, view, p.top), context_2d(&c)) else { return false };
            let (x0, y0) = (m.plot.px.0, m.plot.py.0);
            let (pw, ph) = (m.plot.px.1 - x0, m.plot.py.1 - y0);
            let span = (view.1 - view.0).max(1e-12);
            let dx = x0 + (p.window.0 - view.0) / span * pw;
            let dw = (p.window.1 - p.window.0) / span * pw;
            ctx.save();
            ctx.begin_path();
            ctx.rect(x0, y0, pw, ph);
            ctx.clip();
            let drawn = ctx.draw_image_with_html_canvas_element_and_dw_and_dh(&p.image, dx, y0, dw, ph).is_ok();
            ctx.restore();
            self.mapping.set_value(Some(m));
            drawn
        })
    }

    /// Shows `w`: at once from the bands on the GPU or the canvas path's last picture (timed as
    /// a frame), then from the worker's answer.
    fn move_to(self, w: Window, theme: Theme) {
        let t = perf::now();
        let pal = theme.palette();
        let framed = if self.gpu.with_value(Option::is_some) { self.frame(w, &pal).is_ok() } else { self.picture_frame(w, &pal) };
        if framed {
            push_ms("__mtActiveFrames", perf::now() - t);
            // Frames drawn from what the page held, counted for the tests.
            if let Some(c) = self.canvas.get_untracked() {
                let n = c.get_attribute("data-moved-frames").and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
                let _ = c.set_attribute("data-moved-frames", &(n + 1).to_string());
            }
        }
        self.input_at.set_value(Some((t, framed)));
        self.window.set(w);
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

    /// The band drawn under pixel (px, py): its column by time (the window shown may be ahead
    /// of the answer's), then the band there over those bytes.
    fn band_at(self, px: f64, py: f64) -> Option<usize> {
        let (t, bytes) = self.mapping.get_value()?.at(px, py)?;
        self.data.with_untracked(|d| {
            let d = d.as_ref()?;
            d.hover.band_at(&d.a.bands, charts::column_at(&d.a, t)?, bytes)
        })
    }

    fn on_down(self, ev: leptos::ev::MouseEvent) {
        self.drag.set_value(Some((ev.offset_x() as f64, self.window.get_untracked(), false)));
    }

    /// Drags the window with the button down; else finds the band under the pointer.
    fn on_move(self, ev: leptos::ev::MouseEvent, theme: Theme) {
        let (px, py) = (ev.offset_x() as f64, ev.offset_y() as f64);
        if let Some((x0, w0, _)) = self.drag.get_value().filter(|_| ev.buttons() & 1 == 1) {
            let Some(m) = self.mapping.get_value() else { return };
            if let Some(w) = dragged(w0, px - x0, m.plot.px.1 - m.plot.px.0, self.full).filter(|_| (px - x0).abs() > 2.0) {
                self.drag.set_value(Some((x0, w0, true)));
                self.move_to(w, theme);
            }
            return;
        }
        let band = self.band_at(px, py);
        // The band under the pointer, at once (the tooltip follows on the next render).
        if let Some(c) = self.canvas.get_untracked() {
            let _ = c.set_attribute("data-hover-band", &band.map_or(String::new(), |b| b.to_string()));
        }
        self.hover.set(band.map(|b| (px, py, b)));
    }

    /// Pins the band clicked and asks for its allocation (with its stack); a click beside
    /// every band unpins; the end of a drag does neither.
    fn on_click(self, ev: leptos::ev::MouseEvent) {
        if self.drag.get_value().is_some_and(|d| d.2) {
            self.drag.set_value(None);
            return;
        }
        self.drag.set_value(None);
        let Some(b) = self.band_at(ev.offset_x() as f64, ev.offset_y() as f64) else {
            self.pinned.set(None);
            return;
        };
        self.pinned.set(Some((b, None)));
        let Some(event_index) = self.data.with_untracked(|d| d.as_ref().and_then(|d| d.a.bands.event_index.get(b).copied())) else {
            return;
        };
        let pinned = self.pinned;
        bridge::ask(&Request::Allocation { event_index: event_index as usize }, move |r| {
            if let Response::Allocations { allocations, .. } = r {
                pinned.update(|p| {
                    if let Some(p) = p.as_mut().filter(|p| p.0 == b) {
                        p.1 = allocations.into_iter().next();
                    }
                });
            }
        });
    }

    fn on_wheel(self, ev: leptos::ev::WheelEvent, theme: Theme) {
        let Some(m) = self.mapping.get_value() else { return };
        ev.prevent_default();
        let t = m.plot.x_at(ev.offset_x() as f64);
        let factor = if ev.delta_y() < 0.0 { 0.8 } else { 1.25 };
        self.move_to(zoomed(self.window.get_untracked(), factor, t, self.full), theme);
    }

    /// Size, lifetime, layer, operator and category of the band under the pointer.
    fn tooltip(self) -> Option<impl IntoView> {
        let (x, y, b) = self.hover.get()?;
        let (size, alloc_s, free_s, layer, op, category) = self.data.with(|d| {
            let band = d.as_ref().filter(|d| b < d.a.bands.len())?.a.bands.band(b);
            Some((band.size_bytes, band.alloc_s, band.free_s, band.layer.map(str::to_owned), band.op.map(str::to_owned), band.category))
        })?;
        let life = free_s.map_or("until the end".to_owned(), |f| format_seconds(f - alloc_s));
        Some(view! {
            <div class="tooltip" style=format!("left:{}px;top:{}px", x + 14.0, y + 10.0)>
                <b>{format_bytes(size)}</b><br />
                "allocated at " {format_seconds(alloc_s)} ", lives " {life}<br />
                {layer.map(|l| view! { "layer " <code>{l}</code><br /> })}
                {op.map(|o| view! { "op " <code>{o}</code><br /> })}
                {category.map(|c| view! { "category " {c.as_str().replace('_', " ")}<br /> })}
                "click to pin and see its stack"
            </div>
        })
    }

    /// Saves the chart as PNG: on the GPU path, the bands are copied onto the axes first.
    fn save_png(self) {
        let Some(c) = self.canvas.get_untracked() else { return };
        if let (Some(g), Some(m)) =
            (self.gl_canvas.get_untracked().filter(|_| self.gpu.with_value(Option::is_some)), self.mapping.get_value())
        {
            if let Some(ctx) = context_2d(&c) {
                let _ = ctx.draw_image_with_html_canvas_element(&g, m.plot.px.0, m.plot.py.0);
            }
        }
        if let Ok(url) = c.to_data_url() {
            crate::dom::download_url("active.png", &url);
        }
    }
}

/// The card's head: search, colouring, reset and PNG.
fn controls(a: Active, errors: Errors) -> impl IntoView {
    let select_colour = move |ev: leptos::ev::Event| {
        a.colour_by.set(match event_target_value(&ev).as_str() {
            "operator" => ColourBy::Operator,
            "stack" => ColourBy::Stack,
            "category" => ColourBy::Category,
            _ => ColourBy::Layer,
        })
    };
    view! {
        <div class="card-head">
            <h2>"Active memory"</h2>
            <span class="hint">"every allocation as its own band, stacked as made; wheel to zoom, drag to pan, hover for size and lifetime, click to pin"</span>
            <span class="spacer"></span>
            <input type="search" id="active-search" placeholder="find: 0x address, file:line, module, metadata"
                on:change=move |ev| a.search(event_target_value(&ev), errors) />
            <span class="hint" id="active-found">{move || a.found.get().map(|(_, n, q)| format!("{n} allocations match {q:?}"))}</span>
            <label>"colour by " <select id="active-colour" on:change=select_colour>
                <option value="layer">"layer"</option><option value="operator">"operator"</option><option value="stack">"stack"</option>
                <option value="category">"category"</option>
            </select></label>
            <button class="small" on:click=move |_| a.window.set(a.full)>"Reset"</button>
            <button class="small" title="Save this chart as PNG" on:click=move |_| a.save_png()>"PNG"</button>
        </div>
    }
}

/// The colouring's legend: what each colour stands for over the answer shown (most bytes
/// first), the grey of the memory from before the trace, and what a pin or a search fades.
fn legend(a: Active, theme: Theme) -> impl IntoView {
    let plural = |by: ColourBy| match by {
        ColourBy::Category => "categories",
        ColourBy::Layer => "layers",
        ColourBy::Operator => "operators",
        ColourBy::Stack => "stacks",
    };
    let entries = move || {
        let (pal, by) = (theme.palette(), a.colour_by.get());
        a.data.with(|d| {
            let d = d.as_ref()?;
            let colours = by.colours(&d.a.bands);
            let (entries, more) = by.legend(&d.a.bands, &colours, 8);
            let chip = |e: charts::LegendEntry| {
                legend_chip(e.label.clone(), e.colour, 1.0, e.label, format!("{} in the allocations shown", format_bytes(e.bytes)))
            };
            let more = match by {
                ColourBy::Stack => format!("one colour per recorded stack ({more} stacks; hover a band for its stack) "),
                _ if more > 0 => format!("and {more} more {}, each its own colour ", plural(by)),
                _ => String::new(),
            };
            let grey = d.a.before_trace.iter().any(|&b| b > 0).then(|| {
                let why = "memory allocated before the trace began, with no allocation of its own in it".to_owned();
                legend_chip("before-trace".into(), pal.grid, 0.9, "before the trace".into(), why)
            });
            Some(view! { {format!("Colour by {}: ", by.as_str())} {entries.into_iter().map(chip).collect_view()} {more} {grey} })
        })
    };
    let faded = move || match (a.pinned.with(Option::is_some), a.found.with(Option::is_some)) {
        (true, _) => Some(" · faded: the bands that do not share the pinned allocation's stack"),
        (false, true) => Some(" · faded: the bands the search did not find"),
        _ => None,
    };
    view! {
        <p class="sub chart-legend" id="active-legend" data-colour-by=move || a.colour_by.get().as_str()>{entries}{faded}</p>
    }
}

/// What the answer shows, in words: the bands, those too brief for a column, the grey band.
fn caption(t: &ActiveTimeline) -> String {
    let grey = t.before_trace.iter().max().copied().unwrap_or(0);
    let mut s = format!("{} – {}: {} allocations, each its own band", format_seconds(t.start_s), format_seconds(t.end_s), t.bands.len());
    if t.between > 0 {
        s += &format!("; {} more made and freed between two columns' moments (zoom in to see them)", t.between);
    }
    if grey > 0 {
        s += &format!("; in grey, up to {} allocated before the trace began (no allocation of its own in it)", format_bytes(grey));
    }
    s
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
                    {crate::widgets::stack_view(&a.stack, &a.shown, true)}
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
    Effect::new(move |started: Option<bool>| {
        let ready = a.canvas.get().is_some() && a.gl_canvas.get().is_some();
        if ready && started != Some(true) {
            a.start_gpu();
        }
        ready || started == Some(true)
    });
    Effect::new(move |_| a.fetch(errors));
    Effect::new(move |_| a.draw(theme, errors));
    view! {
        <section class="card" id="active">
            {controls(a, errors)}
            <div class="chart-wrap">
                <canvas class="chart" id="active-canvas" node_ref=a.canvas on:wheel=move |ev| a.on_wheel(ev, theme)
                    on:mousedown=move |ev| a.on_down(ev) on:mousemove=move |ev| a.on_move(ev, theme) on:click=move |ev| a.on_click(ev)
                    on:mouseleave=move |_| a.hover.set(None)></canvas>
                <canvas id="active-gl" node_ref=a.gl_canvas></canvas>
                {move || a.tooltip()}
            </div>
            {legend(a, theme)}
            <p class="sub" id="active-caption">{move || a.data.with(|d| d.as_ref().map(|d| caption(&d.a)))}</p>
            {move || a.pinned.get().map(|(_, detail)| pinned_view(detail, a.pinned))}
        </section>
    }
}
