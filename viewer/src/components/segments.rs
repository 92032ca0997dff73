//! The allocator's segments and blocks at a chosen moment (snapshots): one row per segment,
//! blocks coloured by state, with a time slider, "At the peak", and a filter by pool; beside
//! them, when a `PYTORCH_CUDA_ALLOC_CONF` setting is picked, the segments the caching allocator
//! would have had under it at the same moment (`shared::whatif::segments_after`).

use crate::charts;
use crate::messages::requests;
use crate::state::{Errors, Theme};
use crate::widgets::png_button;
use crate::{bridge, dom::fit_canvas, perf};
use leptos::html::Canvas;
use leptos::prelude::*;
use shared::explore::{Overview, Response};
use shared::model::{BlockState, SegmentInfo};
use shared::units::{format_bytes, format_seconds};
use std::sync::Arc;

/// Height of a segment's row in pixels.
const ROW: u32 = 12;

/// Segments at a moment: the moment's time and the segments.
type Segments = (f64, Arc<Vec<SegmentInfo>>);

/// Which pool's segment map: `None` every pool, `Some(None)` the default pools, `Some(Some(k))`
/// private pool k.
type PoolFilter = Option<Option<u16>>;

/// The private pools of the trace, (index, name), each once.
fn private_pools(overview: &Overview) -> Vec<(u16, String)> {
    overview.summary.pools.iter().filter_map(|p| Some((p.index?, p.pool.clone()))).fold(Vec::new(), |mut v, (k, name)| {
        if !v.iter().any(|(j, _)| *j == k) {
            v.push((k, name));
        }
        v
    })
}

/// The pool picker, where the trace has private pools.
fn pool_select(overview: &Overview, pool: RwSignal<PoolFilter>) -> Option<impl IntoView> {
    let pools = private_pools(overview);
    let on_pool = move |ev: leptos::ev::Event| {
        pool.set(match event_target_value(&ev).as_str() {
            "all" => None,
            "default" => Some(None),
            k => k.parse::<u16>().ok().map(Some),
        });
    };
    (!pools.is_empty()).then(|| {
        view! {
            <select id="segments-pool" on:change=on_pool>
                <option value="all" selected=true>"all pools"</option>
                <option value="default">"default pools"</option>
                {pools.into_iter().map(|(k, name)| view! { <option value=k.to_string()>{format!("private pool {name}")}</option> }).collect_view()}
            </select>
        }
    })
}

/// Settings offered in the picker; any other can be typed.
const COMMON_SETTINGS: [&str; 4] =
    ["expandable_segments:True", "max_split_size_mb:128", "roundup_power2_divisions:4", "roundup_power2_divisions:[256:1,512:2,>:4]"];

/// "At t: n segments, reserved, allocated, free inside segments (largest free block)."
fn stats(t: f64, s: &[SegmentInfo]) -> String {
    format!("At {}: {}", format_seconds(t), map_stats(s))
}

/// "n segments, reserved, allocated, free inside segments (largest free block)."
fn map_stats(s: &[SegmentInfo]) -> String {
    let reserved: u64 = s.iter().map(|g| g.size_bytes).sum();
    let blocks = s.iter().flat_map(|g| &g.blocks);
    let allocated: u64 = blocks.clone().filter(|b| b.state == BlockState::Allocated).map(|b| b.size_bytes).sum();
    let largest_free = blocks.filter(|b| b.state == BlockState::Free).map(|b| b.size_bytes).max().unwrap_or(0);
    format!(
        "{} segments, {} reserved, {} allocated, {} free inside segments (largest free block {}).",
        s.len(),
        format_bytes(reserved),
        format_bytes(allocated),
        format_bytes(reserved - allocated.min(reserved)),
        format_bytes(largest_free)
    )
}

/// Asks for the segments at `at`'s moment whenever it changes, into `all`; returns those of
/// the pool chosen.
fn segments_of(at: RwSignal<f64>, pool: RwSignal<PoolFilter>) -> Memo<Option<Segments>> {
    let all: RwSignal<Option<Segments>> = RwSignal::new(None);
    Effect::new(move |_| {
        bridge::ask(&requests::segments(at.get()), move |r| {
            if let Response::Segments { t_s, segments: s, .. } = r {
                all.set(Some((t_s, Arc::new(s))));
            }
        });
    });
    of_pool(all, pool)
}

/// Asks for the segments at `at`'s moment under `setting` whenever either changes (nothing
/// while no setting is picked), into `all`, the setting's error into `error`; returns those of
/// the pool chosen.
fn simulated_of(
    at: RwSignal<f64>,
    pool: RwSignal<PoolFilter>,
    setting: RwSignal<String>,
    error: RwSignal<Option<String>>,
) -> Memo<Option<Segments>> {
    let all: RwSignal<Option<Segments>> = RwSignal::new(None);
    Effect::new(move |_| {
        let (t, conf) = (at.get(), setting.get());
        if conf.is_empty() {
            all.set(None);
            error.set(None);
            return;
        }
        bridge::ask(&requests::simulated_segments(t, &conf), move |r| {
            let Response::SimulatedSegments { t_s, alloc_conf, segments: s, error: e, .. } = r else { return };
            // An answer to a moment or setting since left behind is dropped.
            if t_s.to_bits() != at.get_untracked().to_bits() || alloc_conf != setting.get_untracked() {
                return;
            }
            all.set(e.is_none().then(|| (t_s, Arc::new(s))));
            error.set(e);
        });
    });
    of_pool(all, pool)
}

/// The segments of `all` in the pool chosen.
fn of_pool(all: RwSignal<Option<Segments>>, pool: RwSignal<PoolFilter>) -> Memo<Option<Segments>> {
    Memo::new(move |_| {
        all.with(|a| {
            a.as_ref().map(|(t, s)| match pool.get() {
                None => (*t, s.clone()),
                Some(p) => (*t, Arc::new(s.iter().filter(|g| g.private_pool == p).cloned().collect())),
            })
        })
    })
}

/// The largest segment of the maps shown (the simulated one only beside the recorded one):
/// the bytes the full width stands for in both, so that their bars compare.
fn shared_scale(segments: Memo<Option<Segments>>, simulated: Memo<Option<Segments>>, alone: Memo<bool>) -> Memo<u64> {
    let largest = |m: &Option<Segments>| m.as_ref().and_then(|(_, s)| s.iter().map(|g| g.size_bytes).max()).unwrap_or(0);
    Memo::new(move |_| {
        let recorded = segments.with(largest);
        if alone.get() {
            recorded
        } else {
            recorded.max(simulated.with(largest))
        }
    })
}

/// Draws `segments` on `canvas` at `scale` ([`shared_scale`]) whenever they, the scale or
/// (through `layout`) the canvas's width change; how many segments did not fit goes to
/// `not_drawn`.
fn draw_on(
    canvas: NodeRef<Canvas>,
    segments: Memo<Option<Segments>>,
    scale: Memo<u64>,
    layout: Option<Memo<bool>>,
    not_drawn: RwSignal<usize>,
) {
    let (theme, errors) = (expect_context::<Theme>(), expect_context::<Errors>());
    Effect::new(move |_| {
        if let Some(l) = layout {
            l.track();
        }
        let pal = theme.palette();
        let full_width_bytes = scale.get();
        let Some(c) = canvas.get() else { return };
        segments.with(|s| {
            let Some((_, s)) = s else { return };
            fit_canvas(&c, (s.len() as u32 * ROW + 6).clamp(40, 600 * ROW));
            perf::mark("draw segments");
            // The scale drawn, for the tests to read.
            let _ = c.set_attribute("data-full-width-bytes", &full_width_bytes.to_string());
            match charts::draw_segments(&c, &pal, s, ROW, full_width_bytes) {
                Ok(n) => {
                    not_drawn.set(n);
                    perf::drawn(perf::Chart::Segments);
                }
                Err(e) => errors.report("segments", e),
            }
        });
    });
}

/// The setting picker's example: the setting asked about most.
const SETTING_EXAMPLE: &str = "expandable_segments:True";

/// The setting picker: free text, with the common settings offered; the variable it stands for
/// is its label, and the input is wide enough for its example.
fn setting_input(setting: RwSignal<String>) -> impl IntoView {
    view! {
        <label class="hint" for="segments-setting">"What if PYTORCH_CUDA_ALLOC_CONF ="</label>
        <input type="text" id="segments-setting" list="segments-settings" spellcheck="false"
            size=(SETTING_EXAMPLE.len() + 6).to_string() placeholder=SETTING_EXAMPLE
            title="Draws the segments PyTorch's caching allocator would have had at this moment under this setting, beside the recorded ones"
            on:change=move |ev| setting.set(event_target_value(&ev).trim().to_owned()) />
        <datalist id="segments-settings">
            {COMMON_SETTINGS.into_iter().map(|s| view! { <option value=s></option> }).collect_view()}
        </datalist>
    }
}

/// The simulated map beside the recorded one: its stats line and canvas, or the setting's error.
fn simulated_view(
    setting: RwSignal<String>,
    simulated: Memo<Option<Segments>>,
    alone: Memo<bool>,
    canvas: NodeRef<Canvas>,
) -> impl IntoView {
    let line = move || simulated.with(|s| s.as_ref().map(|(_, s)| format!("Under {}: {}", setting.get(), map_stats(s))));
    view! {
        <div class="chart-wrap" style:display=move || if alone.get() { "none" } else { "block" }>
            <p class="sub" id="segments-simulated-stats">{line}</p>
            <canvas class="chart" id="segments-simulated" node_ref=canvas></canvas>
        </div>
    }
}

/// The allocator's segments and blocks at a chosen moment.
#[component]
pub fn SegmentsSection(
    /// The trace's overview (its duration, peak and pools).
    overview: Arc<Overview>,
) -> impl IntoView {
    let (canvas, simulated_canvas) = (NodeRef::<Canvas>::new(), NodeRef::<Canvas>::new());
    let duration = overview.duration_s.max(1e-9);
    let peak_t = overview.summary.peak_time_s;
    let at = RwSignal::new(peak_t);
    let pool: RwSignal<PoolFilter> = RwSignal::new(None);
    let (setting, setting_error) = (RwSignal::new(String::new()), RwSignal::new(None::<String>));
    let segments = segments_of(at, pool);
    let simulated = simulated_of(at, pool, setting, setting_error);
    let (not_drawn, simulated_not_drawn) = (RwSignal::new(0usize), RwSignal::new(0usize));
    // The recorded map takes half the width while a simulated one is beside it.
    let alone = Memo::new(move |_| setting.with(String::is_empty) || setting_error.with(Option::is_some));
    let scale = shared_scale(segments, simulated, alone);
    draw_on(canvas, segments, scale, Some(alone), not_drawn);
    draw_on(simulated_canvas, simulated, scale, None, simulated_not_drawn);
    view! {
        <section class="card" id="segments">
            <div class="card-head">
                <h2>"Allocator segments"</h2>
                <input type="range" id="segments-time" min="0" max=duration.to_string() step=(duration / 1000.0).to_string()
                    prop:value=move || at.get().to_string()
                    on:input=move |ev| { if let Ok(v) = event_target_value(&ev).parse::<f64>() { at.set(v) } } />
                <button class="small" on:click=move |_| at.set(peak_t)>"At the peak"</button>
                {pool_select(&overview, pool)}
                {setting_input(setting)}
                <span class="spacer"></span>
                {png_button(canvas, "segments")}
            </div>
            {move || setting_error.get().map(|e| view! { <p class="warning" id="segments-setting-error">{format!("No simulated map under this setting: {e}")}</p> })}
            <div class="segment-maps">
                <div class="chart-wrap">
                    <p class="sub" id="segments-stats">{move || segments.with(|s| s.as_ref().map(|(t, s)| stats(*t, s)))}</p>
                    <canvas class="chart" id="segments-canvas" node_ref=canvas></canvas>
                </div>
                {simulated_view(setting, simulated, alone, simulated_canvas)}
            </div>
            <p class="sub">"One row per segment, on one scale (the largest segment shown spans the width, in both maps when two are side by side); blue blocks are allocated, grey is cached free space."
                {move || (not_drawn.get() > 0).then(|| format!(" {} more segments are not drawn.", not_drawn.get()))}
                {move || (simulated_not_drawn.get() > 0 && !setting.with(String::is_empty))
                    .then(|| format!(" {} more simulated segments are not drawn.", simulated_not_drawn.get()))}</p>
        </section>
    }
}
