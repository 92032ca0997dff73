//! The memory timeline: allocated, reserved and driver-used memory over a window of the trace,
//! with phase and layer bands; wheel or `+`/`-` to zoom, drag or arrows to pan, `0` to reset,
//! hover for totals, click for who holds the live bytes and the largest live allocations. The
//! window's arithmetic is
//! `shared::analysis::view_math`'s; the worker answers each window at the canvas's width.

use crate::charts::{self, Mapping};
use crate::messages::requests;
use crate::state::{Errors, FirstScreen, Theme};
use crate::widgets::{legend_chip, png_button};
use crate::{bridge, dom::fit_canvas, perf};
use leptos::html::Canvas;
use leptos::prelude::*;
use shared::analysis::holders::Why;
use shared::analysis::ledger::LedgerBands;
use shared::analysis::view_math::{around, dragged, panned, zoomed, Window};
use shared::analysis::TimelinePoint;
use shared::explore::{Allocation, Band, Moment, Overview, Request, Response};
use shared::units::{format_bytes, format_seconds};
use std::sync::Arc;

/// Height of the chart in CSS pixels.
const HEIGHT: u32 = 340;

/// A timeline answer: window start and end, the buckets, the driver's samples, the device
/// ledger's sources.
type TimelineWindow = (f64, f64, Arc<Vec<TimelinePoint>>, Arc<Vec<(f64, u64)>>, Arc<LedgerBands>);

/// The timeline's state: its window, what the worker answered for it, and the pointer's.
#[derive(Clone, Copy)]
struct Timeline {
    full: Window,
    window: RwSignal<Window>,
    data: RwSignal<Option<TimelineWindow>>,
    /// Where the last drawing put the plot.
    mapping: StoredValue<Option<Mapping>>,
    /// Pointer position and the moment under it.
    hover: RwSignal<Option<(f64, f64, Moment)>>,
    /// The moment clicked and its largest live allocations.
    selected: RwSignal<Option<(f64, Vec<Allocation>)>>,
    /// Who holds the live bytes at the moment clicked.
    held: RwSignal<Option<Arc<Why>>>,
    /// One request in flight at a time; the latest window waits its turn.
    in_flight: StoredValue<bool>,
    queued: StoredValue<Option<Window>>,
    /// When the zoom or pan being drawn was asked for (for the frame timings).
    input_at: StoredValue<Option<f64>>,
    /// Where a drag began (pointer x, the window then), and whether it moved (then it is no
    /// click).
    drag: StoredValue<Option<(f64, Window)>>,
    dragged: StoredValue<bool>,
    canvas: NodeRef<Canvas>,
    /// The report's first screen, which this chart is on: told when it is drawn.
    first_screen: Option<FirstScreen>,
}

impl Timeline {
    fn new(full: Window, first_screen: Option<FirstScreen>) -> Self {
        Self {
            full,
            window: RwSignal::new(full),
            data: RwSignal::new(None),
            mapping: StoredValue::new(None),
            hover: RwSignal::new(None),
            selected: RwSignal::new(None),
            held: RwSignal::new(None),
            in_flight: StoredValue::new(false),
            queued: StoredValue::new(None),
            input_at: StoredValue::new(None),
            drag: StoredValue::new(None),
            dragged: StoredValue::new(false),
            canvas: NodeRef::new(),
            first_screen,
        }
    }

    /// Asks for window `w`, or queues it behind the request in flight.
    fn fetch(self, w: Window) {
        if self.in_flight.get_value() {
            self.queued.set_value(Some(w));
            return;
        }
        self.in_flight.set_value(true);
        let width = self.canvas.get_untracked().map_or(1200, |c| c.width());
        bridge::ask(&requests::timeline(w, width), move |r| {
            self.in_flight.set_value(false);
            match r {
                Response::Timeline { start_s, end_s, points, driver, ledger } => {
                    self.data.set(Some((start_s, end_s, Arc::new(points), Arc::new(driver), Arc::new(ledger))));
                }
                // Nothing to draw: the first screen waits no longer.
                _ => self.tell_first_screen(),
            }
            if let Some(next) = self.queued.get_value() {
                self.queued.set_value(None);
                self.fetch(next);
            }
        });
    }

    /// Draws the last answer (an effect: again when it, the selection or the theme change).
    fn draw(self, theme: Theme, errors: Errors, bands: &(Vec<Band>, Vec<Band>)) {
        let pal = theme.palette();
        let sel = self.selected.with(|s| s.as_ref().map(|s| s.0));
        let Some(c) = self.canvas.get() else { return };
        self.data.with(|d| {
            let Some((a, b, points, driver, ledger)) = d else { return };
            fit_canvas(&c, HEIGHT);
            perf::mark("draw timeline");
            match charts::draw_timeline(&c, &pal, (*a, *b), points, driver, ledger, &bands.0, &bands.1, sel) {
                Ok(m) => {
                    self.mapping.set_value(Some(m));
                    // The highest allocated level drawn, for tests and the benchmark to read.
                    let top = points.iter().map(|p| p.allocated_max_bytes).max().unwrap_or(0);
                    let _ = c.set_attribute("data-max-allocated", &top.to_string());
                    // The device ledger's sources drawn as bands (those with bytes in the window).
                    let shown: Vec<&str> =
                        ledger.sources.iter().filter(|(_, b)| b.iter().any(|&x| x > 0)).map(|(n, _)| n.as_str()).collect();
                    let _ = c.set_attribute("data-ledger-sources", &shown.join(","));
                    perf::drawn(perf::Chart::Timeline);
                    self.tell_first_screen();
                    if let Some(t) = self.input_at.get_value() {
                        self.input_at.set_value(None);
                        perf::frame(perf::now() - t);
                    }
                }
                Err(e) => {
                    errors.report("timeline", e);
                    self.tell_first_screen();
                }
            }
        });
    }

    /// Tells the report's first screen that this chart is drawn (or will not be).
    fn tell_first_screen(self) {
        if let Some(first) = self.first_screen {
            first.drawn();
        }
    }

    /// Shows `w`, timing the frame it takes from now.
    fn move_to(self, w: Window) {
        self.input_at.set_value(Some(perf::now()));
        self.window.set(w);
    }

    /// Zooms by `factor` around `centre` (the window's middle when `None`).
    fn zoom(self, factor: f64, centre: Option<f64>) {
        let w = self.window.get_untracked();
        self.move_to(zoomed(w, factor, centre.unwrap_or((w.0 + w.1) / 2.0), self.full));
    }

    fn pan(self, fraction: f64) {
        self.move_to(panned(self.window.get_untracked(), fraction, self.full));
    }

    fn on_key(self, ev: &web_sys::KeyboardEvent) {
        if crate::dom::is_typing(ev) {
            return;
        }
        match ev.key().as_str() {
            "+" | "=" => self.zoom(0.5, None),
            "-" | "_" => self.zoom(2.0, None),
            "ArrowLeft" => self.pan(-0.2),
            "ArrowRight" => self.pan(0.2),
            "0" => self.move_to(self.full),
            _ => {}
        }
    }

    fn on_wheel(self, ev: leptos::ev::WheelEvent) {
        let Some(m) = self.mapping.get_value() else { return };
        ev.prevent_default();
        let t = m.x_at(ev.offset_x() as f64);
        self.zoom(if ev.delta_y() < 0.0 { 0.8 } else { 1.25 }, Some(t));
    }

    fn on_down(self, ev: leptos::ev::MouseEvent) {
        self.drag.set_value(Some((ev.offset_x() as f64, self.window.get_untracked())));
        self.dragged.set_value(false);
    }

    /// Drags the window with the button down; else asks what is under the pointer.
    fn on_move(self, ev: leptos::ev::MouseEvent) {
        let Some(m) = self.mapping.get_value() else { return };
        let (px, py) = (ev.offset_x() as f64, ev.offset_y() as f64);
        if let Some((x0, w0)) = self.drag.get_value().filter(|_| ev.buttons() & 1 == 1) {
            if let Some(w) = dragged(w0, px - x0, m.px.1 - m.px.0, self.full) {
                self.dragged.set_value(true);
                self.move_to(w);
            }
            return;
        }
        if !m.contains(px, py) {
            self.hover.set(None);
            return;
        }
        let hover = self.hover;
        bridge::ask(&Request::At { t_s: m.x_at(px) }, move |r| {
            if let Response::At(moment) = r {
                hover.set(Some((px, py, moment)));
            }
        });
    }

    /// A click (a press that did not drag): the largest allocations live then.
    fn on_up(self, ev: leptos::ev::MouseEvent) {
        self.drag.set_value(None);
        if self.dragged.get_value() {
            return;
        }
        let Some(m) = self.mapping.get_value() else { return };
        if !m.contains(ev.offset_x() as f64, ev.offset_y() as f64) {
            return;
        }
        let (selected, held) = (self.selected, self.held);
        let t_s = m.x_at(ev.offset_x() as f64);
        bridge::ask(&Request::Allocations { t_s, limit: 25 }, move |r| {
            if let Response::Allocations { t_s, allocations } = r {
                selected.set(Some((t_s, allocations)));
            }
        });
        held.set(None);
        bridge::ask(&Request::Holders { t_s }, move |r| {
            if let Response::Holders(w) = r {
                held.set(Some(Arc::new(*w)));
            }
        });
    }
}

/// Totals, layer, operator and phase at the moment under the pointer.
fn moment_tooltip(x: f64, y: f64, m: Moment) -> impl IntoView {
    view! {
        <div class="tooltip" style=format!("left:{}px;top:{}px", x + 14.0, y + 10.0)>
            <b>{format_seconds(m.t_s)}</b><br />
            "allocated " {format_bytes(m.allocated_bytes)}<br />
            "reserved " {format_bytes(m.reserved_bytes)}<br />
            {m.layer.map(|l| view! { "layer " <code>{l}</code><br /> })}
            {m.op.map(|o| view! { "op " <code>{o}</code><br /> })}
            {m.phase.filter(|p| *p != shared::Phase::Other).map(|p| p.as_str())}
        </div>
    }
}

/// One live allocation: size, when it was made and freed, its layer and operator, its stack.
fn allocation_row(a: Allocation) -> impl IntoView {
    let life = a.free_s.map_or("until the end".to_owned(), |f| format_seconds(f - a.alloc_s));
    view! { <tr>
        <td class="num">{format_bytes(a.size_bytes)}</td>
        <td class="num">{format_seconds(a.alloc_s)}</td>
        <td class="num">{a.free_s.map_or("never".to_owned(), format_seconds)}</td>
        <td class="num">{life}</td>
        <td>{a.layer.unwrap_or_default()} " " <code>{a.op.unwrap_or_default()}</code>
            {a.pool.map(|p| view! { " " <span class="tag">{format!("pool {p}")}</span> })}
            {(!a.holders.is_empty()).then(|| view! { <div class="holders">"held by " {a.holders.join(" · ")}</div> })}
            {(!a.notes.is_empty()).then(|| view! { <div class="notes">{a.notes.join(" · ")}</div> })}</td>
        <td>{crate::widgets::stack_view(&a.stack, &a.shown, false)}</td>
    </tr> }
}

/// Who holds the live bytes at the moment clicked, largest first.
fn holders_table(w: &Why) -> impl IntoView {
    let how = if w.recorded { "recorded" } else { "inferred (trace with --holders to record them)" };
    let rows = w
        .holders
        .iter()
        .take(20)
        .map(|g| {
            let released = g.released_at_s.map_or("held to the end".to_owned(), format_seconds);
            let kind = g.kind.as_str().replace('_', " ");
            view! { <tr data-holder=g.kind.as_str()>
                <td class="num">{format_bytes(g.bytes)}</td>
                <td class="num">{g.blocks}</td>
                <td>{kind}{g.inferred.then_some(" (inferred)")}</td>
                <td><code>{g.name.clone()}</code></td>
                <td>{g.module.clone()}</td>
                <td class="num">{released}</td>
            </tr> }
        })
        .collect_view();
    view! {
        <div class="holders-table" id="holders-at">
            <h3>{format!("Who holds the {} live at {}", format_bytes(w.live_bytes), format_seconds(w.at.time_s))}</h3>
            <p class="hint">{format!("holders {how}; {}", w.shares())}</p>
            <table class="data">
                <thead><tr><th>"bytes"</th><th>"blocks"</th><th>"holder"</th><th>"name"</th><th>"module"</th><th>"released"</th></tr></thead>
                <tbody>{rows}</tbody>
            </table>
        </div>
    }
}

/// The largest allocations live at `t` (a click), closed by clearing `selected`.
fn live_list(t: f64, allocs: Vec<Allocation>, selected: RwSignal<Option<(f64, Vec<Allocation>)>>) -> impl IntoView {
    view! {
        <div class="live-list" id="live-list">
            <h3>{format!("Largest allocations live at {}", format_seconds(t))}
                <button class="small" on:click=move |_| selected.set(None)>"×"</button></h3>
            {if allocs.is_empty() {
                view! { <p class="hint">"Nothing allocated in this trace is live then (memory from before recording is not listed)."</p> }.into_any()
            } else {
                view! {
                    <table class="data">
                        <thead><tr><th>"size"</th><th>"allocated"</th><th>"freed"</th><th>"lifetime"</th><th>"layer / op"</th><th>"stack (innermost first)"</th></tr></thead>
                        <tbody>{allocs.into_iter().map(allocation_row).collect_view()}</tbody>
                    </table>
                }.into_any()
            }}
        </div>
    }
}

/// What the bands above the plot stand for: the phases the trace has (the first row), and the
/// outermost modules (the second, named where they fit). The lines have their legend in the plot.
fn band_legend(phase_bands: &[Band], has_layers: bool, theme: Theme) -> Option<impl IntoView> {
    let phases: Vec<shared::Phase> = [shared::Phase::Forward, shared::Phase::Backward, shared::Phase::Optimizer]
        .into_iter()
        .filter(|p| phase_bands.iter().any(|b| b.phase == *p))
        .collect();
    (!phases.is_empty() || has_layers).then(|| {
        view! {
            <p class="sub chart-legend" id="timeline-legend">
                "Bands above the plot: "
                {move || {
                    let pal = theme.palette();
                    let phase = |p: shared::Phase| {
                        legend_chip(p.as_str().into(), pal.phase(p), 0.8, p.as_str().into(), format!("the {} phase (top row)", p.as_str()))
                    };
                    let layer = || {
                        let label = "outermost module (second row)".to_owned();
                        legend_chip("layer".into(), pal.allocated, 0.25, label, "named where its band is wide enough".into())
                    };
                    view! { {phases.iter().copied().map(phase).collect_view()} {has_layers.then(layer)} }
                }}
            </p>
        }
    })
}

/// The memory timeline with zoom, pan, hover and click.
#[component]
pub fn TimelineSection(
    /// The trace's overview: its duration, peak and phase and layer bands.
    overview: Arc<Overview>,
) -> impl IntoView {
    let (theme, errors) = (expect_context::<Theme>(), expect_context::<Errors>());
    let full = requests::full_window(&overview);
    let t = Timeline::new(full, use_context::<FirstScreen>());
    Effect::new(move |_| {
        let w = t.window.get();
        if let Some(c) = t.canvas.get() {
            fit_canvas(&c, HEIGHT);
        }
        t.fetch(w);
    });
    let legend = band_legend(&overview.phase_bands, !overview.layer_bands.is_empty(), theme);
    let bands = (overview.phase_bands.clone(), overview.layer_bands.clone());
    Effect::new(move |_| t.draw(theme, errors, &bands));
    // This section is replaced when another trace opens: its shortcuts go with it.
    let keys = window_event_listener(leptos::ev::keydown, move |ev| t.on_key(&ev));
    on_cleanup(move || keys.remove());
    let peak_t = overview.summary.peak_time_s;
    view! {
        <section class="card" id="timeline">
            <div class="card-head">
                <h2>"Memory timeline"</h2>
                <span class="hint">"wheel or +/− to zoom, drag or ←/→ to pan, 0 to reset, click to see what is live"</span>
                <span class="spacer"></span>
                <button class="small" on:click=move |_| t.move_to(around(peak_t, 0.02, full))>"Zoom to peak"</button>
                <button class="small" on:click=move |_| t.window.set(full)>"Reset"</button>
                {png_button(t.canvas, "timeline")}
            </div>
            <div class="chart-wrap">
                <canvas class="chart" id="timeline-canvas" node_ref=t.canvas on:wheel=move |ev| t.on_wheel(ev)
                    on:mousedown=move |ev| t.on_down(ev) on:mousemove=move |ev| t.on_move(ev) on:mouseup=move |ev| t.on_up(ev)
                    on:mouseleave=move |_| t.hover.set(None)></canvas>
                {move || t.hover.get().map(|(x, y, m)| moment_tooltip(x, y, m))}
            </div>
            {legend}
            <p class="sub">{move || { let w = t.window.get(); format!("{} – {} of {}", format_seconds(w.0), format_seconds(w.1), format_seconds(full.1)) }}</p>
            {move || t.selected.get().and_then(|_| t.held.get()).map(|w| holders_table(&w))}
            {move || t.selected.get().map(|(at, allocs)| live_list(at, allocs, t.selected))}
        </section>
    }
}
