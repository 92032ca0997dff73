//! The trace followed live: its state and iterations, and allocated (and reserved) memory
//! drawn as the server's events arrive. A job of several ranks (torchrun, on one node or
//! several) gets a rank picker (every rank overlaid, or one drawn large) and small multiples,
//! one chart per rank on one shared scale, each rank appearing as its first points arrive.
//! The finished trace opens in every view.
//!
//! - `picker.rs`: every rank overlaid on the large chart, or one alone.
//! - `multiples.rs`, `small.rs`: the small multiples, and one rank's chart among them.

mod multiples;
mod picker;
mod small;

use crate::perf;
use crate::server::ServerState;
use crate::state::Theme;
use leptos::prelude::*;
use multiples::RankMultiples;
use picker::RankPicker;
use shared::units::{format_bytes, format_seconds};

/// The followed trace: state, iterations, and allocated/reserved so far.
#[component]
pub fn LiveView(
    /// The server panel's state (the trace followed).
    server: ServerState,
) -> impl IntoView {
    let theme = expect_context::<Theme>();
    let canvas = NodeRef::<leptos::html::Canvas>::new();
    // The rank drawn large; `None`: every rank overlaid.
    let pick = RwSignal::new(None::<u32>);
    Effect::new(move |_| {
        let pal = theme.palette();
        let Some(c) = canvas.get() else { return };
        let picked = pick.get();
        server.live.with(|l| {
            let Some(l) = l else { return };
            crate::dom::fit_canvas(&c, 220);
            let drawn = match (l.ranks.is_empty(), picked.and_then(|r| l.ranks.get(&r))) {
                (true, _) => crate::charts::draw_live(&c, &pal, &l.points).is_ok().then_some(l.points.len()),
                (false, Some(points)) => crate::charts::draw_live(&c, &pal, points).is_ok().then_some(points.len()),
                (false, None) => crate::charts::draw_live_ranks(&c, &pal, &l.ranks).is_ok().then(|| l.ranks.values().map(Vec::len).sum()),
            };
            if let Some(n) = drawn.filter(|&n| n > 0) {
                perf::set_body("data-live-drawn", &n.to_string());
            }
        });
    });
    // Rebuilt when what is shown changes (another trace, its first rank, its end), not on every
    // batch of points: the picker stays open and the charts stay in place while they come.
    let shape = Memo::new(move |_| {
        server.live.with(|l| l.as_ref().map(|l| (l.trace_id.clone(), !l.ranks.is_empty(), l.state == "done" || l.state == "failed")))
    });
    move || {
        shape.get().map(|(_, several, finished)| {
            let summary = move || server.live.with(|l| l.as_ref().map(|l| live_summary(l, finished)));
            let error = move || server.live.with(|l| l.as_ref().and_then(|l| l.error.clone()));
            view! {
                <div class="live" id="live">
                    <p>{summary}</p>
                    {move || error().map(|e| view! { <p class="server-message" role="alert">{e}</p> })}
                    // Drawn while it runs; the finished trace opens in the views below.
                    {(several && !finished).then(|| view! { <RankPicker server=server pick=pick /> })}
                    {(!finished).then(|| view! { <canvas node_ref=canvas id="live-canvas" class="live-chart" height="220"></canvas> })}
                    {(several && !finished).then(|| view! { <RankMultiples server=server pick=pick /> })}
                </div>
            }
        })
    }
}

/// The line above the chart: which trace, its state, iterations, and memory so far (per rank
/// for a job of several ranks).
fn live_summary(l: &crate::server::Live, finished: bool) -> String {
    let mut s = format!("{} {}", if finished { "Followed" } else { "Following" }, l.trace_id);
    if !l.model.is_empty() {
        s.push_str(&format!(" · {} on {}", l.model, l.device));
    }
    s.push_str(&format!(" · {}", l.state));
    if l.iterations > 0 {
        s.push_str(&format!(" · iteration {}/{}", l.iterations_done, l.iterations));
    }
    if !l.points.is_empty() {
        let peak = l.points.iter().map(|p| p[1]).max().unwrap_or(0);
        let now = l.points.last().copied().unwrap_or([0; 3]);
        s.push_str(&format!(
            " · allocated {} (peak {}) at {} · {} updates",
            format_bytes(now[1]),
            format_bytes(peak),
            format_seconds(now[0] as f64 / 1e9),
            l.batches
        ));
    }
    if !l.ranks.is_empty() {
        let peaks: Vec<String> =
            l.ranks.iter().map(|(r, p)| format!("rank {r} peak {}", format_bytes(p.iter().map(|p| p[1]).max().unwrap_or(0)))).collect();
        s.push_str(&format!(" · {} ranks: {} · {} updates", peaks.len(), peaks.join(", "), l.batches));
    }
    s
}
