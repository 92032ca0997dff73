//! Memory vs rank: the graph profile's peak and active memory per operator rank of the
//! iteration, its sections shaded and its peak marked, and a sweep's curves overlaid.

use crate::charts::{self, Mapping};
use crate::state::{Errors, Theme};
use crate::widgets::png_button;
use crate::{dom::fit_canvas, perf};
use leptos::html::Canvas;
use leptos::prelude::*;
use shared::analysis::profile::GraphProfile;
use shared::explore::Overview;
use shared::units::{format_bytes, format_seconds};
use std::sync::Arc;

/// The profile's ranks per iteration and where its sections start; a section the iteration
/// does not have is said so (an inference loop has no backward and no optimizer step).
fn sections_note(p: &GraphProfile) -> String {
    let s = &p.sections;
    let from = |name: &str, start: Option<usize>| start.map_or_else(|| format!("no {name}"), |r| format!("{name} from {r}"));
    let optimizer = match (s.optimizer_start_rank, s.optimizer_end_rank) {
        (Some(a), Some(b)) => format!("optimizer {a}–{b}"),
        (start, _) => from("optimizer step", start),
    };
    format!(
        "{} ranks per iteration; {}, {}, {optimizer}; reference iteration {}.",
        p.nodes.len(),
        from("forward", s.forward_start_rank),
        from("backward", s.backward_start_rank),
        p.reference_iteration
    )
}

/// The operator at `rank` under the pointer: its layer, peak, memory before it and run time.
fn rank_tooltip(overview: &Overview, x: f64, y: f64, rank: usize) -> Option<impl IntoView> {
    let n = overview.profile.as_ref()?.nodes.get(rank)?;
    Some(view! {
        <div class="tooltip" style=format!("left:{}px;top:{}px", x + 14.0, y + 10.0)>
            <b>{format!("rank {} · {}", n.rank, n.node_name)}</b><br />
            {format!("{} · {}", n.gtype.as_str(), n.node_type.map_or("—", |t| t.as_str()))}<br />
            "layer " <code>{n.layer.clone()}</code><br />
            "peak " {format_bytes(n.median_peak_mem_bytes)} " · before " {format_bytes(n.median_active_mem_bytes)}<br />
            "run time " {format_seconds(n.median_run_time_s)}
        </div>
    })
}

/// The memory vs rank chart, with a tooltip per rank.
#[component]
pub fn RankChart(
    /// The trace's overview (its graph profile, or a sweep's curves).
    overview: Arc<Overview>,
) -> impl IntoView {
    let (theme, errors) = (expect_context::<Theme>(), expect_context::<Errors>());
    let canvas = NodeRef::<Canvas>::new();
    let mapping: StoredValue<Option<Mapping>> = StoredValue::new(None);
    let hover: RwSignal<Option<(f64, f64, usize)>> = RwSignal::new(None);
    let o = overview.clone();
    Effect::new(move |_| {
        let pal = theme.palette();
        let Some(c) = canvas.get() else { return };
        fit_canvas(&c, 340);
        perf::mark("draw rank");
        match charts::draw_rank(&c, &pal, o.profile.as_ref(), &o.curves) {
            Ok(m) => {
                mapping.set_value(Some(m));
                perf::drawn(perf::Chart::Rank);
            }
            Err(e) => errors.report("memory vs rank", e),
        }
    });
    let notes = overview.profile.as_ref().map(sections_note);
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
            {move || hover.get().and_then(|(x, y, rank)| rank_tooltip(&overview, x, y, rank))}
        </div>
    }
}
