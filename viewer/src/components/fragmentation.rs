//! Fragmentation, (reserved − allocated) / reserved, over time and per layer; a trace that
//! reserves nothing (a CPU run) gets a line saying so instead.

use crate::charts;
use crate::messages::requests;
use crate::state::{Errors, Theme};
use crate::widgets::{percent, png_button};
use crate::{bridge, dom::fit_canvas, perf};
use leptos::html::Canvas;
use leptos::prelude::*;
use shared::analysis::TimelinePoint;
use shared::explore::{Overview, Response};
use shared::units::format_bytes;
use std::sync::Arc;

/// Layers listed, most fragmented first.
const LAYER_ROWS: usize = 25;

/// The card of a trace that reserved nothing.
fn nothing_reserved(device: &str) -> impl IntoView {
    let note = format!(
        "Nothing was reserved on {device} in this trace (the CPU allocator caches nothing, or the file does not record reserved \
         memory): there is no fragmentation to show."
    );
    view! {
        <section class="card" id="fragmentation">
            <div class="card-head"><h2>"Fragmentation"</h2></div>
            <p class="sub">{note}</p>
        </section>
    }
}

/// The most fragmented layers as bars.
fn layer_bars(overview: &Overview) -> Option<impl IntoView> {
    let mut per_layer: Vec<(String, f64)> = overview.fragmentation.per_layer.iter().map(|(k, v)| (k.clone(), *v)).collect();
    per_layer.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    per_layer.truncate(LAYER_ROWS);
    (!per_layer.is_empty()).then(|| {
        view! {
            <h3>"Most fragmented layers (mean over their events)"</h3>
            <div class="bars">
                {per_layer.into_iter().map(|(name, v)| view! {
                    <div class="bar-row"><span class="bar-label" title=name.clone()>{name.clone()}</span>
                        <span class="bar"><span class="fill" style=format!("width:{:.1}%", v * 100.0)></span></span>
                        <span class="num">{percent(v)}</span></div>
                }).collect_view()}
            </div>
        }
    })
}

/// Fragmentation over time and per layer.
#[component]
pub fn FragmentationSection(
    /// The trace's overview (its fragmentation statistics).
    overview: Arc<Overview>,
) -> impl IntoView {
    // Nothing reserved: a line says so, and nothing is asked or drawn.
    if !requests::draws_fragmentation(&overview) {
        return nothing_reserved(&overview.device).into_any();
    }
    let (theme, errors) = (expect_context::<Theme>(), expect_context::<Errors>());
    let canvas = NodeRef::<Canvas>::new();
    let points: RwSignal<Option<Arc<Vec<TimelinePoint>>>> = RwSignal::new(None);
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
        let pal = theme.palette();
        let Some(c) = canvas.get() else { return };
        points.with(|p| {
            let Some(p) = p else { return };
            perf::mark("draw fragmentation");
            match charts::draw_fragmentation(&c, &pal, full, p) {
                Ok(_) => perf::drawn(perf::Chart::Fragmentation),
                Err(e) => errors.report("fragmentation", e),
            }
        });
    });
    let f = &overview.fragmentation;
    let hint = format!(
        "average {} · worst {} · reserved but unused at the peak {}",
        percent(f.avg_fragmentation),
        percent(f.max_fragmentation),
        format_bytes(f.unused_reserved_at_peak_bytes)
    );
    view! {
        <section class="card" id="fragmentation">
            <div class="card-head">
                <h2>"Fragmentation"</h2>
                <span class="hint">{hint}</span>
                <span class="spacer"></span>
                {png_button(canvas, "fragmentation")}
            </div>
            <div class="chart-wrap"><canvas class="chart" id="fragmentation-canvas" node_ref=canvas></canvas></div>
            <p class="sub">"(reserved − allocated) / reserved after each time bucket."</p>
            {layer_bars(&overview)}
        </section>
    }
    .into_any()
}
