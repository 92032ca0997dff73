//! The allocator's segments and blocks at a chosen moment (snapshots): one row per segment,
//! blocks coloured by state, with a time slider, "At the peak", and a filter by pool.

use crate::charts;
use crate::protocol::requests;
use crate::state::{Errors, Theme};
use crate::widgets::png_button;
use crate::{bridge, fit_canvas, perf};
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

/// "At t: n segments, reserved, allocated, free inside segments (largest free block)."
fn stats(t: f64, s: &[SegmentInfo]) -> String {
    let reserved: u64 = s.iter().map(|g| g.size_bytes).sum();
    let blocks = s.iter().flat_map(|g| &g.blocks);
    let allocated: u64 = blocks.clone().filter(|b| b.state == BlockState::Allocated).map(|b| b.size_bytes).sum();
    let largest_free = blocks.filter(|b| b.state == BlockState::Free).map(|b| b.size_bytes).max().unwrap_or(0);
    format!(
        "At {}: {} segments, {} reserved, {} allocated, {} free inside segments (largest free block {}).",
        format_seconds(t),
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
    Memo::new(move |_| {
        all.with(|a| {
            a.as_ref().map(|(t, s)| match pool.get() {
                None => (*t, s.clone()),
                Some(p) => (*t, Arc::new(s.iter().filter(|g| g.private_pool == p).cloned().collect())),
            })
        })
    })
}

/// The allocator's segments and blocks at a chosen moment.
#[component]
pub fn SegmentsSection(
    /// The trace's overview (its duration, peak and pools).
    overview: Arc<Overview>,
) -> impl IntoView {
    let (theme, errors) = (expect_context::<Theme>(), expect_context::<Errors>());
    let canvas = NodeRef::<Canvas>::new();
    let duration = overview.duration_s.max(1e-9);
    let peak_t = overview.summary.peak_time_s;
    let at = RwSignal::new(peak_t);
    let pool: RwSignal<PoolFilter> = RwSignal::new(None);
    let segments = segments_of(at, pool);
    let not_drawn = RwSignal::new(0usize);
    Effect::new(move |_| {
        let pal = theme.palette();
        let Some(c) = canvas.get() else { return };
        segments.with(|s| {
            let Some((_, s)) = s else { return };
            fit_canvas(&c, (s.len() as u32 * ROW + 6).clamp(40, 600 * ROW));
            perf::mark("draw segments");
            match charts::draw_segments(&c, &pal, s, ROW) {
                Ok(n) => {
                    not_drawn.set(n);
                    perf::drawn("segments");
                }
                Err(e) => errors.report("segments", e),
            }
        });
    });
    view! {
        <section class="card" id="segments">
            <div class="card-head">
                <h2>"Allocator segments"</h2>
                <input type="range" id="segments-time" min="0" max=duration.to_string() step=(duration / 1000.0).to_string()
                    prop:value=move || at.get().to_string()
                    on:input=move |ev| { if let Ok(v) = event_target_value(&ev).parse::<f64>() { at.set(v) } } />
                <button class="small" on:click=move |_| at.set(peak_t)>"At the peak"</button>
                {pool_select(&overview, pool)}
                <span class="spacer"></span>
                {png_button(canvas, "segments")}
            </div>
            <p class="sub" id="segments-stats">{move || segments.with(|s| s.as_ref().map(|(t, s)| stats(*t, s)))}</p>
            <div class="chart-wrap"><canvas class="chart" id="segments-canvas" node_ref=canvas></canvas></div>
            <p class="sub">"One row per segment, scaled to the largest; blue blocks are allocated, grey is cached free space."
                {move || (not_drawn.get() > 0).then(|| format!(" {} more segments are not drawn.", not_drawn.get()))}</p>
        </section>
    }
}
