//! A diff's chart: A's and B's allocated memory on the diff's aligned x axis.

use crate::charts;
use crate::dom::fit_canvas;
use crate::state::{Errors, Theme};
use crate::widgets::png_button;
use leptos::html::Canvas;
use leptos::prelude::*;
use shared::analysis::diff::TraceDiff;
use std::sync::Arc;

/// A's and B's allocated memory on the diff's aligned x axis.
#[component]
pub fn DiffChart(
    /// What was compared (its aligned curves).
    diff: Arc<TraceDiff>,
    /// Names of A and B, for the legend.
    labels: (String, String),
    /// Prefix of the canvas's id (`{id}-canvas`).
    id: &'static str,
) -> impl IntoView {
    let (theme, errors) = (expect_context::<Theme>(), expect_context::<Errors>());
    let canvas = NodeRef::<Canvas>::new();
    let d = diff.clone();
    Effect::new(move |_| {
        let pal = theme.palette();
        let Some(c) = canvas.get() else { return };
        fit_canvas(&c, 300);
        if let Err(e) = charts::draw_diff_curves(&c, &pal, &d.curves, (&labels.0, &labels.1)) {
            errors.report("the comparison chart", e);
        }
    });
    view! {
        <div class="card-head">
            <h3>"Allocated memory, A and B"</h3>
            <span class="spacer"></span>
            {png_button(canvas, "compare")}
        </div>
        <div class="chart-wrap"><canvas class="chart" id=format!("{id}-canvas") node_ref=canvas></canvas></div>
    }
}
