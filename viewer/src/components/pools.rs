//! The Pools view: allocated and reserved memory per (device, pool, stream) over the whole
//! trace, one panel each (the default pool, every private pool of CUDA graphs and
//! `torch.cuda.MemPool`s, pinned host memory), with each pool's peaks and pinned host memory's
//! totals apart from the GPUs'. The segment map of each pool at any moment is the Allocator
//! segments view, filtered by pool.

use crate::charts;
use crate::messages::requests;
use crate::state::{Errors, Theme};
use crate::widgets::png_button;
use crate::{bridge, dom::fit_canvas, perf};
use leptos::html::Canvas;
use leptos::prelude::*;
use shared::analysis::pools::PoolCurve;
use shared::explore::{Overview, Response};
use shared::units::format_bytes;
use std::sync::Arc;

/// Height of one panel, in CSS pixels.
const PANEL: u32 = 100;

/// A pool's row: device, pool, stream and peaks.
fn pool_row(c: &PoolCurve) -> impl IntoView {
    view! {
        <tr class:private=c.private>
            <td>{c.device.clone()}</td>
            <td><code>{c.pool.clone()}</code>{if c.private { " private" } else { " default" }}</td>
            <td><code>{c.stream.clone()}</code></td>
            <td class="num" data-bytes=c.peak_allocated_bytes.to_string()>{format_bytes(c.peak_allocated_bytes)}</td>
            <td class="num" data-bytes=c.peak_reserved_bytes.to_string()>{format_bytes(c.peak_reserved_bytes)}</td>
        </tr>
    }
}

/// Reserved and allocated per (device, pool, stream): one panel each, on the trace's time axis.
#[component]
pub fn PoolsSection(
    /// The trace's overview (its pools' totals and pinned host memory).
    overview: Arc<Overview>,
) -> impl IntoView {
    let (theme, errors) = (expect_context::<Theme>(), expect_context::<Errors>());
    let canvas = NodeRef::<Canvas>::new();
    let curves: RwSignal<Option<(f64, Arc<Vec<PoolCurve>>)>> = RwSignal::new(None);
    Effect::new(move |_| {
        let Some(c) = canvas.get() else { return };
        fit_canvas(&c, PANEL);
        bridge::ask(&requests::pools(c.width()), move |r| match r {
            Response::Pools { end_s, curves: got } => curves.set(Some((end_s, Arc::new(got)))),
            Response::Error { message } => errors.report("the pools", message),
            _ => {}
        });
    });
    Effect::new(move |_| {
        let pal = theme.palette();
        let Some(c) = canvas.get() else { return };
        curves.with(|got| {
            let Some((end_s, got)) = got else { return };
            fit_canvas(&c, PANEL * got.len().max(1) as u32);
            match charts::draw_pool_curves(&c, &pal, *end_s, got) {
                Ok(()) => perf::drawn(perf::Chart::Pools),
                Err(e) => errors.report("the pools", e),
            }
        });
    });
    let rows = move || curves.with(|got| got.as_ref().map(|(_, got)| got.iter().map(pool_row).collect_view()));
    let s = &overview.summary;
    let host = s.pinned_host.map(|h| {
        format!(
            "Pinned host memory (its own allocator, not part of any GPU's numbers): peak {} allocated, {} reserved; {} allocated at the end.",
            format_bytes(h.peak_allocated_bytes),
            format_bytes(h.peak_reserved_bytes),
            format_bytes(h.final_allocated_bytes)
        )
    });
    let private = s.pools.iter().filter(|p| p.index.is_some()).count();
    view! {
        <section class="card" id="pools">
            <div class="card-head">
                <h2>"Pools"</h2>
                <span class="hint">{if private == 0 {
                    "Every allocation came from its device's default pool.".to_owned()
                } else {
                    format!("{private} private pools (CUDA graphs, torch.cuda.MemPool) beside the default pools.")
                }}</span>
                <span class="spacer"></span>
                {png_button(canvas, "pools")}
            </div>
            {host.map(|h| view! { <p class="sub" id="pools-host">{h}</p> })}
            <div class="chart-wrap"><canvas class="chart" id="pools-canvas" node_ref=canvas></canvas></div>
            <p class="sub">"One panel per device, pool and stream: reserved (line) and allocated (area) over the trace."</p>
            <table class="data" id="pools-table">
                <thead><tr><th>"device"</th><th>"pool"</th><th>"stream"</th><th>"peak allocated"</th><th>"peak reserved"</th></tr></thead>
                <tbody>{rows}</tbody>
            </table>
        </section>
    }
}
