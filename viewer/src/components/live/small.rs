//! One rank's small chart in the live view's multiples; a click draws that rank large.

use crate::perf;
use crate::server::ServerState;
use crate::state::Theme;
use leptos::prelude::*;
use shared::units::format_bytes;

/// One rank's small multiple.
#[component]
pub fn RankSmall(
    /// The server panel's state (every rank's points, for the shared scale).
    server: ServerState,
    /// The rank drawn.
    rank: u32,
    /// The rank drawn large, set by a click here.
    pick: RwSignal<Option<u32>>,
) -> impl IntoView {
    let theme = expect_context::<Theme>();
    let canvas = NodeRef::<leptos::html::Canvas>::new();
    Effect::new(move |_| {
        let pal = theme.palette();
        let Some(c) = canvas.get() else { return };
        server.live.with(|l| {
            let Some(l) = l else { return };
            let Some(points) = l.ranks.get(&rank) else { return };
            let all = || l.ranks.values().flatten();
            let t1 = all().map(|p| p[0] as f64 / 1e9).fold(1e-3, f64::max);
            let ymax = all().map(|p| p[1].max(p[2])).max().unwrap_or(0) as f64 * 1.02;
            let peak = points.iter().map(|p| p[1]).max().unwrap_or(0);
            // As wide as its own cell of the grid (`fit_canvas` takes the parent's width: the
            // whole row of them).
            let w = c.client_width().max(120) as u32;
            if c.width() != w {
                c.set_width(w);
            }
            if c.height() != 90 {
                c.set_height(90);
            }
            let _ = crate::charts::draw_live_small(&c, &pal, points, (t1, ymax), &format!("rank {rank} · peak {}", format_bytes(peak)));
        });
    });
    let selected = move || if pick.get() == Some(rank) { "live-small selected" } else { "live-small" };
    view! {
        <canvas node_ref=canvas class=selected data-rank=rank.to_string() height="90" title=format!("rank {rank}: click to draw it large")
            on:click=move |_| {
                pick.set(Some(rank));
                perf::set_body("data-live-pick", &rank.to_string());
            }></canvas>
    }
}
