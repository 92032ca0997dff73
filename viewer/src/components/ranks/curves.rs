//! The Ranks view's small multiples: one allocated-memory panel per rank's device, all on the
//! same time axis and byte scale, the highest peak marked.

use crate::charts;
use crate::state::{Errors, Theme};
use crate::widgets::png_button;
use crate::{bridge, dom::fit_canvas, perf};
use leptos::html::Canvas;
use leptos::prelude::*;
use shared::explore::{RankCurve, RankSet, Request, Response};
use std::sync::Arc;

/// Height of one rank's panel, in CSS pixels.
fn panel_height(ranks: usize) -> u32 {
    if ranks <= 8 {
        110
    } else {
        70
    }
}

/// The small multiples, one panel per rank's device.
#[component]
pub fn RankCurves(
    /// The merged trace's ranks.
    ranks: Arc<RankSet>,
) -> impl IntoView {
    let (theme, errors) = (expect_context::<Theme>(), expect_context::<Errors>());
    let canvas = NodeRef::<Canvas>::new();
    let curves: RwSignal<Option<(f64, Arc<Vec<RankCurve>>)>> = RwSignal::new(None);
    let height = panel_height(ranks.devices.len()) * ranks.devices.len().max(1) as u32;
    Effect::new(move |_| {
        let Some(c) = canvas.get() else { return };
        fit_canvas(&c, height);
        bridge::ask(&Request::RankCurves { buckets: c.width().max(200) as usize }, move |r| match r {
            Response::RankCurves { end_s, curves: got } => curves.set(Some((end_s, Arc::new(got)))),
            Response::Error { message } => errors.report("the rank curves", message),
            _ => {}
        });
    });
    let highest = ranks.highest_device;
    Effect::new(move |_| {
        let pal = theme.palette();
        let Some(c) = canvas.get() else { return };
        curves.with(|got| {
            let Some((end_s, got)) = got else { return };
            fit_canvas(&c, height);
            match charts::draw_rank_curves(&c, &pal, *end_s, got, highest) {
                Ok(_) => perf::drawn(perf::Chart::Ranks),
                Err(e) => errors.report("the rank curves", e),
            }
        });
    });
    view! {
        <div class="card-head"><span class="spacer"></span>{png_button(canvas, "ranks")}</div>
        <div class="chart-wrap"><canvas class="chart" id="ranks-canvas" node_ref=canvas></canvas></div>
    }
}
