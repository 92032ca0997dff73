//! The page's sections: header (open, compare, export, theme, help), summary, ranks, memory
//! timeline, flame graph, memory vs rank, tables, fragmentation and allocator segments.

use crate::charts::{self, FlameBox, FlameMetric, Mapping};
use crate::protocol::requests;
use crate::widgets::png_button;
use crate::{bridge, fit_canvas, perf, AppState};
use leptos::html::Canvas;
use leptos::prelude::*;
use shared::analysis::active::ActiveTimeline;
use shared::explore::{Allocation, Moment, Overview, Request, Response};
use shared::units::{format_bytes, format_seconds};
use std::sync::Arc;
use wasm_bindgen::JsCast;

fn state() -> AppState {
    expect_context::<AppState>()
}

fn pct(v: f64) -> String {
    format!("{:.1} %", v * 100.0)
}

/// The files chosen in a file input's change event; the input is emptied so that the same
/// files can be chosen again.
fn chosen_files(ev: &leptos::ev::Event) -> Vec<web_sys::File> {
    let input: Option<web_sys::HtmlInputElement> = ev.target().and_then(|t| t.dyn_into().ok());
    let files = bridge::files_of(input.as_ref().and_then(|i| i.files()));
    if let Some(i) = input {
        i.set_value("");
    }
    files
}

/// Title bar: open a file (several: the ranks of one job), compare with another, exports,
/// theme and help.
#[component]
pub fn Header() -> impl IntoView {
    let state = state();
    let on_change = move |ev: leptos::ev::Event| bridge::open_files(state, chosen_files(&ev));
    let on_compare = move |ev: leptos::ev::Event| {
        if let Some(file) = chosen_files(&ev).into_iter().next() {
            bridge::compare_file(state, file);
        }
    };
    let export = move |format: &'static str| {
        bridge::ask(&Request::Export { format: format.into() }, move |r| match r {
            Response::Export { file_name, mime, text } => crate::download_text(&file_name, &mime, &text),
            Response::Error { message } => state.error.set(Some(("export".into(), message))),
            _ => {}
        })
    };
    let has_trace = move || state.overview.get().is_some_and(|o| o.summary.total_events > 0 || o.profile.is_some());
    view! {
        <header class="top">
            <h1>"Memory Tracer"</h1>
            <label class="button primary" title="Open a trace, or one file per rank of a job to merge them (o)">
                "Open trace…" <input type="file" id="trace-file" multiple on:change=on_change />
            </label>
            <label class="button" class:hidden=move || !has_trace() data-drop="compare" id="compare-drop"
                title="Compare the open trace with another: choose it, or drop it here">
                "Compare with…" <input type="file" id="compare-file" on:change=on_compare />
            </label>
            <nav class="exports" class:hidden=move || !has_trace()>
                "Export: "
                <button on:click=move |_| export("speedscope") title="speedscope JSON (speedscope.app)">"speedscope"</button>
                <button on:click=move |_| export("timeline") title="Memory Tracer timeline JSON">"timeline"</button>
                <button on:click=move |_| export("chrome") title="Chrome trace JSON (Perfetto)">"Perfetto"</button>
                <button on:click=move |_| export("csv") title="Every event as CSV">"events CSV"</button>
                <button on:click=move |_| export("layers_csv") title="The layer table as CSV">"layers CSV"</button>
            </nav>
            <span class="spacer"></span>
            <span class="memory" title="WebAssembly memory of the worker that holds the trace (it only grows, so this is its peak)">
                {move || (state.worker_memory.get() > 0).then(|| format!("worker memory {}", format_bytes(state.worker_memory.get())))}
            </span>
            <button on:click=move |_| state.dark.update(|d| *d = !*d) title="Dark or light (t)">
                {move || if state.dark.get() { "☀ light" } else { "☾ dark" }}
            </button>
            <button on:click=move |_| state.help.update(|h| *h = !*h) title="Keyboard shortcuts (?)">"?"</button>
        </header>
    }
}

/// The empty page: a drop zone.
#[component]
pub fn Welcome() -> impl IntoView {
    view! {
        <section class="welcome">
            <h2>"Where does your GPU memory go?"</h2>
            <p>"Drop a trace anywhere on this page, or press " <kbd>"o"</kbd> " to pick one. It is read here, in your browser; nothing is uploaded."</p>
            <p>"Drop (or pick) one file per rank of a distributed job together to merge them: ranks come from "
                <code>"RANK"</code> " recorded by the collector, else " <code>"rank<N>"</code> " in the file names, else their order."</p>
            <ul>
                <li>"PyTorch memory snapshots (" <code>"torch.cuda.memory._dump_snapshot"</code> ", .pickle)"</li>
                <li>"torch.profiler Chrome traces with memory events (.json, .json.gz)"</li>
                <li>"DFTracer traces (.pfw, .pfw.gz)"</li>
                <li>"Memory Tracer traces (" <code>"collector trace"</code> ") and batch sweeps (" <code>"sweep.json"</code> ")"</li>
            </ul>
        </section>
    }
}

/// The keyboard shortcuts overlay.
#[component]
pub fn Help() -> impl IntoView {
    let state = state();
    let keys = [
        ("o", "open a trace (several files: the ranks of one job)"),
        ("1 … 7", "jump to summary, timeline, flame graph, rank, tables, fragmentation, segments"),
        ("+ / −  or wheel", "zoom the timeline (around the pointer with the wheel)"),
        ("← / →  or drag", "pan the timeline"),
        ("0", "show the whole timeline"),
        ("click", "timeline: list what is live then; flame graph: zoom into a box"),
        ("/", "search the flame graph"),
        ("t", "dark or light theme"),
        ("?", "this help"),
        ("Esc", "close this help, leave a text field"),
    ];
    view! {
        <div class="overlay" class:hidden=move || !state.help.get() on:click=move |_| state.help.set(false)>
            <section class="help" role="dialog" aria-label="Keyboard shortcuts">
                <h2>"Keyboard shortcuts"</h2>
                <table>
                    {keys.into_iter().map(|(k, what)| view! { <tr><td><kbd>{k}</kbd></td><td>{what}</td></tr> }).collect_view()}
                </table>
            </section>
        </div>
    }
}

/// Every view of a loaded trace, one after another.
#[component]
pub fn Report(overview: Arc<Overview>) -> impl IntoView {
    perf::mark("report built");
    let has_events = overview.summary.total_events > 0;
    let has_rank = overview.profile.is_some() || !overview.curves.is_empty();
    let has_segments = overview.has_segments;
    let o = overview.clone();
    view! {
        {o.oom.clone().map(|r| view! { <crate::answers::OomSection oom=Arc::new(r) /> })}
        <SummarySection overview=o.clone() />
        {o.ranks.clone().map(|r| view! { <crate::ranks::RanksSection ranks=Arc::new(r) /> })}
        {has_events.then(|| view! {
            <TimelineSection overview=o.clone() />
            <ActiveSection overview=o.clone() />
            <FlameSection overview=o.clone() />
        })}
        <section class="card" id="rank">
            <h2>"Memory vs rank"</h2>
            {if has_rank {
                view! { <RankChart overview=o.clone() /> }.into_any()
            } else {
                view! { <p class="hint">{o.profile_error.clone().unwrap_or_default()}</p> }.into_any()
            }}
        </section>
        <crate::tables::Tables overview=o.clone() />
        {has_events.then(|| view! { <crate::answers::AdviceSection events=o.summary.total_events as u64 /> })}
        {has_events.then(|| view! { <FragmentationSection overview=o.clone() /> })}
        {has_segments.then(|| view! { <SegmentsSection overview=o.clone() /> })}
        {has_segments.then(|| view! { <crate::pools::PoolsSection overview=o.clone() /> })}
    }
}

#[component]
fn SummarySection(overview: Arc<Overview>) -> impl IntoView {
    let s = overview.summary.clone();
    let fields: Vec<(&str, String)> = vec![
        ("Peak allocated", format_bytes(s.peak_allocated_bytes)),
        // A peak outside every layer (a snapshot's frames name none there) shows its time alone.
        ("at", s.peak_layer.as_ref().map_or_else(|| format_seconds(s.peak_time_s), |l| format!("{} ({l})", format_seconds(s.peak_time_s)))),
        ("Peak reserved", format_bytes(s.peak_reserved_bytes)),
        ("at", format_seconds(s.peak_reserved_time_s)),
        ("Average fragmentation", pct(s.avg_fragmentation)),
        ("Reserved but unused at the peak", format_bytes(overview.fragmentation.unused_reserved_at_peak_bytes)),
        ("Allocated at the end", format_bytes(s.final_allocated_bytes)),
        ("Reserved at the end", format_bytes(s.final_reserved_bytes)),
        ("Events", s.total_events.to_string()),
        ("Allocations / frees", format!("{} / {}", s.total_allocations, s.total_deallocations)),
        ("Layers", s.total_layers.to_string()),
        ("Operators", s.total_ops.to_string()),
        ("Dropped events", s.dropped_events.to_string()),
        ("Duration", format_seconds(s.duration_s)),
    ];
    let warnings = overview.profile.as_ref().map(|p| p.warnings.clone()).unwrap_or_default();
    // A merged trace's notes are the Ranks view's warnings.
    let notes = if overview.ranks.is_some() { Vec::new() } else { overview.notes.clone() };
    let devices = (overview.devices.len() > 1).then(|| overview.devices.clone());
    // Without events (a snapshot taken without its recorder) there is nothing to call a leak.
    let (leaks, has_events) = (overview.leaks.clone(), s.total_events > 0);
    // What the memory at the peak is for: one coloured chip per category that holds any.
    let categories = overview.categories_at_peak.iter().any(|&(_, b)| b > 0).then(|| {
        let chips = overview
            .categories_at_peak
            .iter()
            .filter(|&&(_, b)| b > 0)
            .map(|&(c, b)| {
                let plotters::style::RGBColor(r, g, bl) = charts::category_colour(Some(c));
                view! {
                    <span class="chip" data-category=c.as_str() data-bytes=b.to_string()>
                        <span class="swatch" style=format!("background:rgb({r},{g},{bl})")></span>
                        {format!("{} {}", c.as_str().replace('_', " "), format_bytes(b))}
                    </span>
                }
            })
            .collect_view();
        view! { <p class="sub" id="categories-at-peak">"At the peak: " {chips}</p> }
    });
    view! {
        <section class="card" id="summary">
            <h2>{overview.file_name.clone()}</h2>
            <p class="sub">
                {format!("{} · device {} · {}", s.source_format, overview.device, format_bytes(overview.file_bytes))}
            </p>
            <dl class="summary">
                {fields.into_iter().map(|(k, v)| view! { <div><dt>{k}</dt><dd>{v}</dd></div> }).collect_view()}
            </dl>
            {categories}
            {(s.dropped_events > 0).then(|| view! {
                <p class="warning">{format!("{} events were dropped by the recorder: totals after them come from the allocator's own counters, but per-layer counts are incomplete.", s.dropped_events)}</p>
            })}
            {warnings.into_iter().map(|w| view! { <p class="warning">{w}</p> }).collect_view()}
            {(!notes.is_empty()).then(|| view! {
                <ul class="import-notes" id="import-notes">{notes.into_iter().map(|n| view! { <li>{n}</li> }).collect_view()}</ul>
            })}
            {devices.map(|ds| view! {
                <h3>"Devices"</h3>
                <table id="devices" class="data">
                    <thead><tr><th>"device"</th><th>"peak allocated"</th><th>"at"</th><th>"peak reserved"</th><th>"events"</th></tr></thead>
                    <tbody>
                        {ds.into_iter().map(|d| view! {
                            <tr>
                                <td>{d.device}</td>
                                <td>{format_bytes(d.peak_allocated_bytes)}</td>
                                <td>{format_seconds(d.peak_time_s)}</td>
                                <td>{format_bytes(d.peak_reserved_bytes)}</td>
                                <td>{d.events.to_string()}</td>
                            </tr>
                        }).collect_view()}
                    </tbody>
                </table>
            })}
            {has_events.then(|| view! { <div id="leaks">
                <h3>"Leaks"</h3>
                <p class=if leaks.leaking { "warning" } else { "sub" }>
                    {if leaks.iterations < shared::analysis::leaks::MIN_ITERATIONS {
                        // The verdict already says how many were found, and from what.
                        leaks.verdict.clone()
                    } else {
                        format!("{} ({} iterations from {}, {} as warm-up)", leaks.verdict, leaks.iterations, leaks.iterations_from, leaks.warmup)
                    }}
                </p>
                {(leaks.leaking && !leaks.survivors.is_empty()).then(|| view! {
                    <table class="data">
                        <thead><tr><th>"never freed in"</th><th>"operator"</th><th>"frame"</th><th>"bytes"</th><th>"per iteration"</th><th>"iterations"</th></tr></thead>
                        <tbody>
                            {leaks.survivors.clone().into_iter().map(|g| view! {
                                <tr>
                                    <td>{g.layer}</td>
                                    <td>{g.op.unwrap_or_default()}</td>
                                    <td>{g.frame.unwrap_or_default()}</td>
                                    <td>{format_bytes(g.bytes)}</td>
                                    <td>{format_bytes(g.bytes_per_iteration as u64)}</td>
                                    <td>{g.iterations.to_string()}</td>
                                </tr>
                            }).collect_view()}
                        </tbody>
                    </table>
                })}
            </div> })}
        </section>
    }
}

/// Where a window of `span` seconds starting near `a` may start inside `full`. Not `clamp`:
/// rounding can make `span` a hair wider than `full`, and `clamp` panics when its bounds cross.
fn window_start(a: f64, span: f64, full: (f64, f64)) -> f64 {
    a.min(full.1 - span).max(full.0)
}

/// `w` zoomed by `factor` around `centre` (which stays under the pointer), within `full`.
fn zoomed(w: (f64, f64), factor: f64, centre: f64, full: (f64, f64)) -> (f64, f64) {
    let whole = full.1 - full.0;
    let span = ((w.1 - w.0) * factor).max(1e-7_f64.min(whole)).min(whole);
    let f = (centre - w.0) / (w.1 - w.0).max(1e-12);
    let a = window_start(centre - span * f, span, full);
    (a, a + span)
}

/// A timeline answer: window start and end, the buckets, the driver's samples.
type TimelineWindow = (f64, f64, Arc<Vec<shared::analysis::TimelinePoint>>, Arc<Vec<(f64, u64)>>);

/// The memory timeline with zoom, pan, hover and click.
#[component]
fn TimelineSection(overview: Arc<Overview>) -> impl IntoView {
    let state = state();
    let full = requests::full_window(&overview);
    let window = RwSignal::new(full);
    let data: RwSignal<Option<TimelineWindow>> = RwSignal::new(None);
    let mapping: StoredValue<Option<Mapping>> = StoredValue::new(None);
    let hover: RwSignal<Option<(f64, f64, Moment)>> = RwSignal::new(None);
    let selected: RwSignal<Option<(f64, Vec<Allocation>)>> = RwSignal::new(None);
    // One request in flight at a time; the latest window waits its turn.
    let in_flight = StoredValue::new(false);
    let queued: StoredValue<Option<(f64, f64)>> = StoredValue::new(None);
    let input_at: StoredValue<Option<f64>> = StoredValue::new(None);
    let canvas = NodeRef::<Canvas>::new();

    fn fetch(
        w: (f64, f64),
        canvas: NodeRef<Canvas>,
        data: RwSignal<Option<TimelineWindow>>,
        in_flight: StoredValue<bool>,
        queued: StoredValue<Option<(f64, f64)>>,
    ) {
        if in_flight.get_value() {
            queued.set_value(Some(w));
            return;
        }
        in_flight.set_value(true);
        let width = canvas.get_untracked().map_or(1200, |c| c.width());
        bridge::ask(&requests::timeline(w, width), move |r| {
            in_flight.set_value(false);
            if let Response::Timeline { start_s, end_s, points, driver } = r {
                data.set(Some((start_s, end_s, Arc::new(points), Arc::new(driver))));
            }
            if let Some(next) = queued.get_value() {
                queued.set_value(None);
                fetch(next, canvas, data, in_flight, queued);
            }
        });
    }
    Effect::new(move |_| {
        let w = window.get();
        if let Some(c) = canvas.get() {
            fit_canvas(&c, 340);
        }
        fetch(w, canvas, data, in_flight, queued);
    });
    let bands = (Arc::new(overview.phase_bands.clone()), Arc::new(overview.layer_bands.clone()));
    Effect::new(move |_| {
        let pal = state.palette();
        let sel = selected.with(|s| s.as_ref().map(|s| s.0));
        let Some(c) = canvas.get() else { return };
        data.with(|d| {
            let Some((a, b, points, driver)) = d else { return };
            fit_canvas(&c, 340);
            perf::mark("draw timeline");
            match charts::draw_timeline(&c, &pal, (*a, *b), points, driver, &bands.0, &bands.1, sel) {
                Ok(m) => {
                    mapping.set_value(Some(m));
                    // The highest allocated level drawn, for tests and the benchmark to read.
                    let top = points.iter().map(|p| p.allocated_max_bytes).max().unwrap_or(0);
                    let _ = c.set_attribute("data-max-allocated", &top.to_string());
                    perf::drawn("timeline");
                    if let Some(t) = input_at.get_value() {
                        input_at.set_value(None);
                        perf::frame(perf::now() - t);
                    }
                }
                Err(e) => state.error.set(Some(("timeline".into(), e))),
            }
        });
    });
    let zoom = move |factor: f64, centre: Option<f64>| {
        input_at.set_value(Some(perf::now()));
        window.update(|w| *w = zoomed(*w, factor, centre.unwrap_or((w.0 + w.1) / 2.0), full));
    };
    let pan = move |fraction: f64| {
        input_at.set_value(Some(perf::now()));
        window.update(|w| {
            let span = w.1 - w.0;
            let a = window_start(w.0 + span * fraction, span, full);
            *w = (a, a + span);
        });
    };
    // This section is replaced when another trace opens: its shortcuts go with it.
    let keys = window_event_listener(leptos::ev::keydown, move |ev| {
        if crate::is_typing(&ev) {
            return;
        }
        match ev.key().as_str() {
            "+" | "=" => zoom(0.5, None),
            "-" | "_" => zoom(2.0, None),
            "ArrowLeft" => pan(-0.2),
            "ArrowRight" => pan(0.2),
            "0" => {
                input_at.set_value(Some(perf::now()));
                window.set(full);
            }
            _ => {}
        }
    });
    on_cleanup(move || keys.remove());
    let drag: StoredValue<Option<(f64, (f64, f64))>> = StoredValue::new(None);
    let dragged = StoredValue::new(false);
    let on_wheel = move |ev: leptos::ev::WheelEvent| {
        let Some(m) = mapping.get_value() else { return };
        ev.prevent_default();
        let t = m.x_at(ev.offset_x() as f64);
        zoom(if ev.delta_y() < 0.0 { 0.8 } else { 1.25 }, Some(t));
    };
    let on_down = move |ev: leptos::ev::MouseEvent| {
        drag.set_value(Some((ev.offset_x() as f64, window.get_untracked())));
        dragged.set_value(false);
    };
    let on_move = move |ev: leptos::ev::MouseEvent| {
        let Some(m) = mapping.get_value() else { return };
        let (px, py) = (ev.offset_x() as f64, ev.offset_y() as f64);
        if let Some((x0, w0)) = drag.get_value().filter(|_| ev.buttons() & 1 == 1) {
            let dt = (px - x0) / (m.px.1 - m.px.0).max(1.0) * (w0.1 - w0.0);
            if dt != 0.0 {
                dragged.set_value(true);
                input_at.set_value(Some(perf::now()));
                let span = w0.1 - w0.0;
                let a = window_start(w0.0 - dt, span, full);
                window.set((a, a + span));
            }
            return;
        }
        if !m.contains(px, py) {
            hover.set(None);
            return;
        }
        let t = m.x_at(px);
        bridge::ask(&Request::At { t_s: t }, move |r| {
            if let Response::At(moment) = r {
                hover.set(Some((px, py, moment)));
            }
        });
    };
    let on_up = move |ev: leptos::ev::MouseEvent| {
        drag.set_value(None);
        if dragged.get_value() {
            return;
        }
        let Some(m) = mapping.get_value() else { return };
        if !m.contains(ev.offset_x() as f64, ev.offset_y() as f64) {
            return;
        }
        let t = m.x_at(ev.offset_x() as f64);
        bridge::ask(&Request::Allocations { t_s: t, limit: 25 }, move |r| {
            if let Response::Allocations { t_s, allocations } = r {
                selected.set(Some((t_s, allocations)));
            }
        });
    };
    let peak_t = overview.summary.peak_time_s;
    view! {
        <section class="card" id="timeline">
            <div class="card-head">
                <h2>"Memory timeline"</h2>
                <span class="hint">"wheel or +/− to zoom, drag or ←/→ to pan, 0 to reset, click to see what is live"</span>
                <span class="spacer"></span>
                <button class="small" on:click=move |_| {
                    let span = (full.1 - full.0) * 0.02;
                    input_at.set_value(Some(perf::now()));
                    window.set(((peak_t - span).max(full.0), (peak_t + span).min(full.1)));
                }>"Zoom to peak"</button>
                <button class="small" on:click=move |_| window.set(full)>"Reset"</button>
                {png_button(canvas, "timeline")}
            </div>
            <div class="chart-wrap">
                <canvas class="chart" id="timeline-canvas" node_ref=canvas on:wheel=on_wheel on:mousedown=on_down
                    on:mousemove=on_move on:mouseup=on_up on:mouseleave=move |_| hover.set(None)></canvas>
                {move || hover.get().map(|(x, y, m)| view! {
                    <div class="tooltip" style=format!("left:{}px;top:{}px", x + 14.0, y + 10.0)>
                        <b>{format_seconds(m.t_s)}</b><br />
                        "allocated " {format_bytes(m.allocated_bytes)}<br />
                        "reserved " {format_bytes(m.reserved_bytes)}<br />
                        {m.layer.map(|l| view! { "layer " <code>{l}</code><br /> })}
                        {m.op.map(|o| view! { "op " <code>{o}</code><br /> })}
                        {m.phase.filter(|p| *p != shared::Phase::Other).map(|p| p.as_str())}
                    </div>
                })}
            </div>
            <p class="sub">{move || { let w = window.get(); format!("{} – {} of {}", format_seconds(w.0), format_seconds(w.1), format_seconds(full.1)) }}</p>
            {move || selected.get().map(|(t, allocs)| view! {
                <div class="live-list" id="live-list">
                    <h3>{format!("Largest allocations live at {}", format_seconds(t))}
                        <button class="small" on:click=move |_| selected.set(None)>"×"</button></h3>
                    {if allocs.is_empty() {
                        view! { <p class="hint">"Nothing allocated in this trace is live then (memory from before recording is not listed)."</p> }.into_any()
                    } else {
                        view! {
                            <table class="data">
                                <thead><tr><th>"size"</th><th>"allocated"</th><th>"freed"</th><th>"lifetime"</th><th>"layer / op"</th><th>"stack (innermost first)"</th></tr></thead>
                                <tbody>
                                {allocs.into_iter().map(|a| {
                                    let life = a.free_s.map_or("until the end".to_owned(), |f| format_seconds(f - a.alloc_s));
                                    view! { <tr>
                                        <td class="num">{format_bytes(a.size_bytes)}</td>
                                        <td class="num">{format_seconds(a.alloc_s)}</td>
                                        <td class="num">{a.free_s.map_or("never".to_owned(), format_seconds)}</td>
                                        <td class="num">{life}</td>
                                        <td>{a.layer.unwrap_or_default()} " " <code>{a.op.unwrap_or_default()}</code>
                                            {a.pool.map(|p| view! { " " <span class="tag">{format!("pool {p}")}</span> })}
                                            {(!a.notes.is_empty()).then(|| view! { <div class="notes">{a.notes.join(" · ")}</div> })}</td>
                                        <td><details><summary>{a.stack.first().cloned().unwrap_or_else(|| "—".into())}</summary>
                                            <pre>{a.stack.join("\n")}</pre></details></td>
                                    </tr> }
                                }).collect_view()}
                                </tbody>
                            </table>
                        }.into_any()
                    }}
                </div>
            })}
        </section>
    }
}

/// A search's allocation events (sorted), how many allocations matched, and the query.
type Found = (Arc<Vec<u32>>, usize, String);

/// The Active Memory Timeline (memory_viz's main view): every allocation as its own band,
/// stacked in the order they were made; the smaller ones and what predates the trace in one
/// band at the bottom, so the top is the exact allocated total.
#[component]
fn ActiveSection(overview: Arc<Overview>) -> impl IntoView {
    let state = state();
    let full = requests::full_window(&overview);
    let window = RwSignal::new(full);
    let detail = RwSignal::new(requests::ACTIVE_DETAIL);
    let colour_by = RwSignal::new(charts::ColourBy::Layer);
    let data: RwSignal<Option<Arc<ActiveTimeline>>> = RwSignal::new(None);
    let mapping: StoredValue<Option<charts::ActiveMapping>> = StoredValue::new(None);
    let hover: RwSignal<Option<(f64, f64, usize)>> = RwSignal::new(None);
    let pinned: RwSignal<Option<(usize, Option<Allocation>)>> = RwSignal::new(None);
    let found: RwSignal<Option<Found>> = RwSignal::new(None);
    let canvas = NodeRef::<Canvas>::new();
    let search = move |ev: leptos::ev::Event| {
        let query = event_target_value(&ev);
        if query.trim().is_empty() {
            found.set(None);
            return;
        }
        bridge::ask(&Request::Find { query, limit: 0 }, move |r| match r {
            Response::Found(f) => found.set(Some((Arc::new(f.events), f.total, f.query))),
            Response::Error { message } => state.error.set(Some(("the search".into(), message))),
            _ => {}
        });
    };
    Effect::new(move |_| {
        let (w, d) = (window.get(), detail.get());
        let Some(c) = canvas.get() else { return };
        fit_canvas(&c, 360);
        bridge::ask(&requests::active(w, c.width(), d), move |r| match r {
            Response::Active(a) => {
                pinned.set(None);
                data.set(Some(Arc::new(*a)));
            }
            Response::Error { message } => state.error.set(Some(("active memory".into(), message))),
            _ => {}
        });
    });
    Effect::new(move |_| {
        let pal = state.palette();
        let (by, pin) = (colour_by.get(), pinned.with(|p| p.as_ref().map(|p| p.0)));
        let hits = found.get().map(|(e, _, _)| e);
        let Some(c) = canvas.get() else { return };
        data.with(|d| {
            let Some(a) = d else { return };
            fit_canvas(&c, 360);
            perf::mark("draw active");
            match charts::draw_active(&c, &pal, a, by, pin, hits.as_deref().map(Vec::as_slice)) {
                Ok(m) => {
                    mapping.set_value(Some(m));
                    // The highest total drawn and the bands, for tests and the benchmark.
                    let _ = c.set_attribute("data-max-allocated", &a.totals.iter().max().copied().unwrap_or(0).to_string());
                    let _ = c.set_attribute("data-bands", &a.bands.len().to_string());
                    perf::drawn("active");
                }
                Err(e) => state.error.set(Some(("active memory".into(), e))),
            }
        });
    });
    let band_at = move |px: f64, py: f64| -> Option<usize> {
        let (column, bytes) = mapping.get_value()?.at(px, py)?;
        data.with_untracked(|d| d.as_ref().and_then(|a| charts::active_band_at(a, column, bytes)))
    };
    let on_move = move |ev: leptos::ev::MouseEvent| {
        let (px, py) = (ev.offset_x() as f64, ev.offset_y() as f64);
        let band = band_at(px, py);
        // The band under the pointer, at once (the tooltip follows on the next render).
        if let Some(c) = canvas.get_untracked() {
            let _ = c.set_attribute("data-hover-band", &band.map_or(String::new(), |b| b.to_string()));
        }
        hover.set(band.map(|b| (px, py, b)));
    };
    let on_click = move |ev: leptos::ev::MouseEvent| {
        let Some(b) = band_at(ev.offset_x() as f64, ev.offset_y() as f64) else {
            pinned.set(None);
            return;
        };
        pinned.set(Some((b, None)));
        let Some(event_index) = data.with_untracked(|d| d.as_ref().and_then(|a| a.bands.get(b)).map(|x| x.event_index as usize)) else {
            return;
        };
        bridge::ask(&Request::Allocation { event_index }, move |r| {
            if let Response::Allocations { allocations, .. } = r {
                pinned.update(|p| {
                    if let Some(p) = p.as_mut().filter(|p| p.0 == b) {
                        p.1 = allocations.into_iter().next();
                    }
                });
            }
        });
    };
    let on_wheel = move |ev: leptos::ev::WheelEvent| {
        let Some(m) = mapping.get_value() else { return };
        ev.prevent_default();
        let t = m.plot.x_at(ev.offset_x() as f64);
        let factor = if ev.delta_y() < 0.0 { 0.8 } else { 1.25 };
        window.update(|w| *w = zoomed(*w, factor, t, full));
    };
    let tooltip = move || {
        let (x, y, b) = hover.get()?;
        let band = data.with(|d| d.as_ref().and_then(|a| a.bands.get(b).cloned()))?;
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
    };
    let select_colour = move |ev: leptos::ev::Event| {
        colour_by.set(match event_target_value(&ev).as_str() {
            "operator" => charts::ColourBy::Operator,
            "stack" => charts::ColourBy::Stack,
            "category" => charts::ColourBy::Category,
            _ => charts::ColourBy::Layer,
        })
    };
    let select_detail = move |ev: leptos::ev::Event| detail.set(event_target_value(&ev).parse().unwrap_or(2000));
    view! {
        <section class="card" id="active">
            <div class="card-head">
                <h2>"Active memory"</h2>
                <span class="hint">"every allocation as its own band, stacked as made; wheel to zoom, hover for size and lifetime, click to pin"</span>
                <span class="spacer"></span>
                <input type="search" id="active-search" placeholder="find: 0x address, file:line, module, metadata" on:change=search />
                <span class="hint" id="active-found">{move || found.get().map(|(_, n, q)| format!("{n} allocations match {q:?}"))}</span>
                <label>"colour by " <select id="active-colour" on:change=select_colour>
                    <option value="layer">"layer"</option><option value="operator">"operator"</option><option value="stack">"stack"</option>
                    <option value="category">"category"</option>
                </select></label>
                <label>" detail " <select id="active-detail" on:change=select_detail>
                    <option value="500">"500 largest"</option><option value="2000" selected>"2000 largest"</option>
                    <option value="10000">"10000 largest"</option><option value="50000">"50000 largest"</option>
                </select></label>
                <button class="small" on:click=move |_| window.set(full)>"Reset"</button>
                {png_button(canvas, "active")}
            </div>
            <div class="chart-wrap">
                <canvas class="chart" id="active-canvas" node_ref=canvas on:wheel=on_wheel on:mousemove=on_move on:click=on_click
                    on:mouseleave=move |_| hover.set(None)></canvas>
                {tooltip}
            </div>
            <p class="sub">{move || data.with(|d| d.as_ref().map(|a| format!(
                "{} – {}: {} allocations drawn one by one, {} smaller ones (and memory from before the trace) in the grey band",
                format_seconds(a.start_s), format_seconds(a.end_s), a.bands.len(), a.summarized
            )))}</p>
            {move || pinned.get().map(|(_, detail)| view! {
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
            })}
        </section>
    }
}

/// The flame graph (icicle) of memory by module path → op → stack.
#[component]
fn FlameSection(overview: Arc<Overview>) -> impl IntoView {
    let state = state();
    let flame = Arc::new(overview.flame.clone());
    let metric = RwSignal::new(FlameMetric::LiveAtPeak);
    let focus = RwSignal::new(0u32);
    let search = RwSignal::new(String::new());
    let boxes: StoredValue<Vec<FlameBox>> = StoredValue::new(Vec::new());
    let hover: RwSignal<Option<(f64, f64, u32)>> = RwSignal::new(None);
    let canvas = NodeRef::<Canvas>::new();
    let f2 = flame.clone();
    Effect::new(move |_| {
        let pal = state.palette();
        let (m, fo, q) = (metric.get(), focus.get(), search.get());
        let Some(c) = canvas.get() else { return };
        fit_canvas(&c, 100);
        let layout = charts::flame_layout(&f2, fo, m, c.width() as f64);
        let rows = layout.iter().map(|b| b.y).fold(0.0f64, f64::max) / charts::FLAME_ROW + 1.0;
        fit_canvas(&c, ((rows * charts::FLAME_ROW) as u32 + 4).clamp(60, 2400));
        perf::mark("draw flame");
        match charts::draw_flame(&c, &pal, &f2, &layout, &q) {
            Ok(()) => perf::drawn("flame"),
            Err(e) => state.error.set(Some(("flame graph".into(), e))),
        }
        boxes.set_value(layout);
    });
    let hit = move |x: f64, y: f64| {
        boxes.with_value(|b| b.iter().rev().find(|b| x >= b.x && x < b.x + b.w && y >= b.y && y < b.y + b.h).map(|b| b.node))
    };
    let f3 = flame.clone();
    let matched = move || {
        let q = search.get().to_lowercase();
        if q.is_empty() {
            return None;
        }
        let m = metric.get();
        // Bytes of the outermost matching nodes (a match inside a match is not counted twice).
        let mut total = 0u64;
        let mut inside: Vec<bool> = vec![false; f3.nodes.len()];
        let mut count = 0;
        for (i, n) in f3.nodes.iter().enumerate() {
            let parent_inside = n.parent.is_some_and(|p| inside[p as usize]);
            let is = n.name.to_lowercase().contains(&q);
            inside[i] = parent_inside || is;
            if is {
                count += 1;
                if !parent_inside {
                    total += m.of(n);
                }
            }
        }
        let root = m.of(&f3.nodes[0]).max(1);
        Some(format!("{count} matches, {} ({:.1} % of the root)", format_bytes(total), total as f64 * 100.0 / root as f64))
    };
    let f4 = flame.clone();
    let left_out = flame.nodes_left_out;
    view! {
        <section class="card" id="flame">
            <div class="card-head">
                <h2>"Flame graph"</h2>
                <select on:change=move |ev| metric.set(if event_target_value(&ev) == "total" { FlameMetric::TotalAllocated } else { FlameMetric::LiveAtPeak })>
                    <option value="live">"bytes live at the peak"</option>
                    <option value="total">"bytes allocated in total"</option>
                </select>
                <input type="search" id="flame-search" placeholder="search (/)" on:input=move |ev| search.set(event_target_value(&ev)) />
                <span class="hint">{matched}</span>
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
                {move || hover.get().map(|(x, y, n)| {
                    let node = &f4.nodes[n as usize];
                    let root = &f4.nodes[0];
                    let share = |v: u64, r: u64| if r == 0 { "—".to_owned() } else { pct(v as f64 / r as f64) };
                    view! {
                        <div class="tooltip" style=format!("left:{}px;top:{}px", x + 14.0, y + 10.0)>
                            <b>{node.name.clone()}</b>" (" {format!("{:?}", node.kind).to_lowercase()} ")"<br />
                            "live at peak " {format_bytes(node.live_at_peak_bytes)} " · " {share(node.live_at_peak_bytes, root.live_at_peak_bytes)}<br />
                            "allocated in total " {format_bytes(node.total_allocated_bytes)} " · " {share(node.total_allocated_bytes, root.total_allocated_bytes)}
                        </div>
                    }
                })}
            </div>
            <p class="sub">"Module path → operator → call stack (outermost frame first). Click a box to zoom into it."
                {(left_out > 0).then(|| format!(" {left_out} boxes under 0.01 % of the total are not drawn; their bytes stay in their parents."))}</p>
        </section>
    }
}

#[component]
fn RankChart(overview: Arc<Overview>) -> impl IntoView {
    let state = state();
    let canvas = NodeRef::<Canvas>::new();
    let mapping: StoredValue<Option<Mapping>> = StoredValue::new(None);
    let hover: RwSignal<Option<(f64, f64, usize)>> = RwSignal::new(None);
    let o = overview.clone();
    Effect::new(move |_| {
        let pal = state.palette();
        let Some(c) = canvas.get() else { return };
        fit_canvas(&c, 340);
        perf::mark("draw rank");
        match charts::draw_rank(&c, &pal, o.profile.as_ref(), &o.curves) {
            Ok(m) => {
                mapping.set_value(Some(m));
                perf::drawn("rank");
            }
            Err(e) => state.error.set(Some(("memory vs rank".into(), e))),
        }
    });
    let o2 = overview.clone();
    let notes = overview.profile.as_ref().map(|p| {
        let s = &p.sections;
        let r = |v: Option<usize>| v.map_or("—".to_owned(), |v| v.to_string());
        format!(
            "{} ranks per iteration; forward from {}, backward from {}, optimizer {}–{}; reference iteration {}.",
            p.nodes.len(),
            r(s.forward_start_rank),
            r(s.backward_start_rank),
            r(s.optimizer_start_rank),
            r(s.optimizer_end_rank),
            p.reference_iteration
        )
    });
    view! {
        <div class="card-head">
            <span class="hint">{notes}</span>
            <span class="spacer"></span>
            {png_button(canvas, "memory_vs_rank")}
        </div>
        <div class="chart-wrap">
            <canvas class="chart" id="rank-canvas" node_ref=canvas
                on:mousemove=move |ev: leptos::ev::MouseEvent| {
                    let Some(m) = mapping.get_value() else { return };
                    let (x, y) = (ev.offset_x() as f64, ev.offset_y() as f64);
                    hover.set(m.contains(x, y).then(|| (x, y, m.x_at(x).floor().max(0.0) as usize)));
                }
                on:mouseleave=move |_| hover.set(None)></canvas>
            {move || hover.get().and_then(|(x, y, rank)| {
                let p = o2.profile.as_ref()?;
                let n = p.nodes.get(rank)?;
                Some(view! {
                    <div class="tooltip" style=format!("left:{}px;top:{}px", x + 14.0, y + 10.0)>
                        <b>{format!("rank {} · {}", n.rank, n.node_name)}</b><br />
                        {format!("{} · {}", n.gtype.as_str(), n.node_type.map_or("—", |t| t.as_str()))}<br />
                        "layer " <code>{n.layer.clone()}</code><br />
                        "peak " {format_bytes(n.median_peak_mem_bytes)} " · before " {format_bytes(n.median_active_mem_bytes)}<br />
                        "run time " {format_seconds(n.median_run_time_s)}
                    </div>
                })
            })}
        </div>
    }
}

/// Fragmentation over time and per layer.
#[component]
fn FragmentationSection(overview: Arc<Overview>) -> impl IntoView {
    // Nothing reserved: a line says so, and nothing is asked or drawn.
    if !requests::draws_fragmentation(&overview) {
        let note = format!(
            "Nothing was reserved on {} in this trace (the CPU allocator caches nothing, or the file does not record reserved \
             memory): there is no fragmentation to show.",
            overview.device
        );
        return view! {
            <section class="card" id="fragmentation">
                <div class="card-head"><h2>"Fragmentation"</h2></div>
                <p class="sub">{note}</p>
            </section>
        }
        .into_any();
    }
    let state = state();
    let canvas = NodeRef::<Canvas>::new();
    let points: RwSignal<Option<Arc<Vec<shared::analysis::TimelinePoint>>>> = RwSignal::new(None);
    let full = requests::full_window(&overview);
    Effect::new(move |_| {
        let Some(c) = canvas.get() else { return };
        fit_canvas(&c, 220);
        bridge::ask(&requests::fragmentation(full, c.width()), move |r| {
            if let Response::Timeline { points: p, .. } = r {
                points.set(Some(Arc::new(p)));
            }
        });
    });
    Effect::new(move |_| {
        let pal = state.palette();
        let Some(c) = canvas.get() else { return };
        points.with(|p| {
            let Some(p) = p else { return };
            perf::mark("draw fragmentation");
            match charts::draw_fragmentation(&c, &pal, full, p) {
                Ok(_) => perf::drawn("fragmentation"),
                Err(e) => state.error.set(Some(("fragmentation".into(), e))),
            }
        });
    });
    let mut per_layer: Vec<(String, f64)> = overview.fragmentation.per_layer.iter().map(|(k, v)| (k.clone(), *v)).collect();
    per_layer.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    per_layer.truncate(25);
    let f = &overview.fragmentation;
    view! {
        <section class="card" id="fragmentation">
            <div class="card-head">
                <h2>"Fragmentation"</h2>
                <span class="hint">{format!("average {} · worst {} · reserved but unused at the peak {}", pct(f.avg_fragmentation), pct(f.max_fragmentation), format_bytes(f.unused_reserved_at_peak_bytes))}</span>
                <span class="spacer"></span>
                {png_button(canvas, "fragmentation")}
            </div>
            <div class="chart-wrap"><canvas class="chart" id="fragmentation-canvas" node_ref=canvas></canvas></div>
            <p class="sub">"(reserved − allocated) / reserved after each time bucket."</p>
            {(!per_layer.is_empty()).then(|| view! {
                <h3>"Most fragmented layers (mean over their events)"</h3>
                <div class="bars">
                    {per_layer.into_iter().map(|(name, v)| view! {
                        <div class="bar-row"><span class="bar-label" title=name.clone()>{name.clone()}</span>
                            <span class="bar"><span class="fill" style=format!("width:{:.1}%", v * 100.0)></span></span>
                            <span class="num">{pct(v)}</span></div>
                    }).collect_view()}
                </div>
            })}
        </section>
    }
    .into_any()
}

/// The allocator's segments and blocks at a chosen moment (snapshots).
#[component]
fn SegmentsSection(overview: Arc<Overview>) -> impl IntoView {
    let state = state();
    let canvas = NodeRef::<Canvas>::new();
    let duration = overview.duration_s.max(1e-9);
    let at = RwSignal::new(overview.summary.peak_time_s);
    let all: RwSignal<Option<(f64, Arc<Vec<shared::model::SegmentInfo>>)>> = RwSignal::new(None);
    // Which pool's segment map: `None` every pool, `Some(None)` the default pools, `Some(Some(k))` private pool k.
    let pool: RwSignal<Option<Option<u16>>> = RwSignal::new(None);
    Effect::new(move |_| {
        let t = at.get();
        bridge::ask(&requests::segments(t), move |r| {
            if let Response::Segments { t_s, segments: s, .. } = r {
                all.set(Some((t_s, Arc::new(s))));
            }
        });
    });
    let segments = Memo::new(move |_| {
        all.with(|a| {
            a.as_ref().map(|(t, s)| match pool.get() {
                None => (*t, s.clone()),
                Some(p) => (*t, Arc::new(s.iter().filter(|g| g.private_pool == p).cloned().collect())),
            })
        })
    });
    let private_pools: Vec<(u16, String)> =
        overview.summary.pools.iter().filter_map(|p| Some((p.index?, p.pool.clone()))).fold(Vec::new(), |mut v, (k, name)| {
            if !v.iter().any(|(j, _)| *j == k) {
                v.push((k, name));
            }
            v
        });
    let on_pool = move |ev: leptos::ev::Event| {
        let v = event_target_value(&ev);
        pool.set(match v.as_str() {
            "all" => None,
            "default" => Some(None),
            k => k.parse::<u16>().ok().map(Some),
        });
    };
    let pool_select = (!private_pools.is_empty()).then(|| {
        view! {
            <select id="segments-pool" on:change=on_pool>
                <option value="all" selected=true>"all pools"</option>
                <option value="default">"default pools"</option>
                {private_pools.into_iter().map(|(k, name)| view! { <option value=k.to_string()>{format!("private pool {name}")}</option> }).collect_view()}
            </select>
        }
    });
    let not_drawn = RwSignal::new(0usize);
    Effect::new(move |_| {
        let pal = state.palette();
        let Some(c) = canvas.get() else { return };
        segments.with(|s| {
            let Some((_, s)) = s else { return };
            const ROW: u32 = 12;
            fit_canvas(&c, (s.len() as u32 * ROW + 6).clamp(40, 600 * ROW));
            perf::mark("draw segments");
            match charts::draw_segments(&c, &pal, s, ROW) {
                Ok(n) => {
                    not_drawn.set(n);
                    perf::drawn("segments");
                }
                Err(e) => state.error.set(Some(("segments".into(), e))),
            }
        });
    });
    let stats = move || {
        segments.with(|s| {
            s.as_ref().map(|(t, s)| {
                let reserved: u64 = s.iter().map(|g| g.size_bytes).sum();
                let blocks = s.iter().flat_map(|g| &g.blocks);
                let allocated: u64 = blocks.clone().filter(|b| b.state == shared::model::BlockState::Allocated).map(|b| b.size_bytes).sum();
                let largest_free = blocks.filter(|b| b.state == shared::model::BlockState::Free).map(|b| b.size_bytes).max().unwrap_or(0);
                format!(
                    "At {}: {} segments, {} reserved, {} allocated, {} free inside segments (largest free block {}).",
                    format_seconds(*t),
                    s.len(),
                    format_bytes(reserved),
                    format_bytes(allocated),
                    format_bytes(reserved - allocated.min(reserved)),
                    format_bytes(largest_free)
                )
            })
        })
    };
    view! {
        <section class="card" id="segments">
            <div class="card-head">
                <h2>"Allocator segments"</h2>
                <input type="range" id="segments-time" min="0" max=duration.to_string() step=(duration / 1000.0).to_string()
                    prop:value=move || at.get().to_string()
                    on:input=move |ev| { if let Ok(v) = event_target_value(&ev).parse::<f64>() { at.set(v) } } />
                <button class="small" on:click=move |_| at.set(overview.summary.peak_time_s)>"At the peak"</button>
                {pool_select}
                <span class="spacer"></span>
                {png_button(canvas, "segments")}
            </div>
            <p class="sub" id="segments-stats">{stats}</p>
            <div class="chart-wrap"><canvas class="chart" id="segments-canvas" node_ref=canvas></canvas></div>
            <p class="sub">"One row per segment, scaled to the largest; blue blocks are allocated, grey is cached free space."
                {move || (not_drawn.get() > 0).then(|| format!(" {} more segments are not drawn.", not_drawn.get()))}</p>
        </section>
    }
}
