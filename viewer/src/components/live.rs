//! The trace followed live: its state and iterations, and allocated (and reserved) memory
//! drawn as the server's events arrive, one line per rank for a torchrun job. The finished
//! trace opens in every view.

use crate::perf;
use crate::server::ServerState;
use crate::state::Theme;
use leptos::prelude::*;
use shared::units::{format_bytes, format_seconds};

/// The followed trace: state, iterations, and allocated/reserved so far.
#[component]
pub fn LiveView(
    /// The server panel's state (the trace followed).
    server: ServerState,
) -> impl IntoView {
    let theme = expect_context::<Theme>();
    let canvas = NodeRef::<leptos::html::Canvas>::new();
    Effect::new(move |_| {
        let pal = theme.palette();
        let Some(c) = canvas.get() else { return };
        server.live.with(|l| {
            if let Some(l) = l {
                crate::fit_canvas(&c, 220);
                let drawn = if l.ranks.is_empty() {
                    crate::charts::draw_live(&c, &pal, &l.points).is_ok().then_some(l.points.len())
                } else {
                    crate::charts::draw_live_ranks(&c, &pal, &l.ranks).is_ok().then(|| l.ranks.values().map(Vec::len).sum())
                };
                if let Some(n) = drawn.filter(|&n| n > 0) {
                    perf::set_body("data-live-drawn", &n.to_string());
                }
            }
        });
    });
    move || {
        server.live.get().map(|l| {
            let peak = l.points.iter().map(|p| p[1]).max().unwrap_or(0);
            let now = l.points.last().copied().unwrap_or([0; 3]);
            let rank_peaks: Vec<String> =
                l.ranks.iter().map(|(r, p)| format!("rank {r} peak {}", format_bytes(p.iter().map(|p| p[1]).max().unwrap_or(0)))).collect();
            let finished = l.state == "done" || l.state == "failed";
            view! {
                <div class="live" id="live">
                    <p>
                        <b>{if finished { "Followed " } else { "Following " }}</b> <code>{l.trace_id.clone()}</code>
                        {(!l.model.is_empty()).then(|| format!(" · {} on {}", l.model, l.device))}
                        " · " <span class=format!("live-state {}", l.state)>{l.state.clone()}</span>
                        {(l.iterations > 0).then(|| format!(" · iteration {}/{}", l.iterations_done, l.iterations))}
                        {(!l.points.is_empty()).then(|| format!(
                            " · allocated {} (peak {}) at {} · {} updates",
                            format_bytes(now[1]), format_bytes(peak), format_seconds(now[0] as f64 / 1e9), l.batches
                        ))}
                        {(!rank_peaks.is_empty()).then(|| format!(" · {} ranks: {} · {} updates", rank_peaks.len(), rank_peaks.join(", "), l.batches))}
                    </p>
                    {l.error.clone().map(|e| view! { <p class="server-message" role="alert">{e}</p> })}
                    // Drawn while it runs; the finished trace opens in the views below.
                    {(!finished).then(|| view! { <canvas node_ref=canvas id="live-canvas" class="live-chart" height="220"></canvas> })}
                </div>
            }
        })
    }
}
