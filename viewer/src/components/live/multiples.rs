//! The live view's small multiples: one chart per rank, on one shared scale.

use super::small::RankSmall;
use crate::perf;
use crate::server::ServerState;
use leptos::prelude::*;

/// One small chart per rank, all on one scale (the longest time, the highest memory of any
/// rank), in rank order; a click draws that rank large.
#[component]
pub fn RankMultiples(
    /// The server panel's state (the ranks so far).
    server: ServerState,
    /// The rank drawn large, set by a click on its chart.
    pick: RwSignal<Option<u32>>,
) -> impl IntoView {
    let ranks =
        Memo::new(move |_| server.live.with(|l| l.as_ref().map(|l| l.ranks.keys().copied().collect::<Vec<u32>>()).unwrap_or_default()));
    Effect::new(move |_| perf::set_body("data-live-multiples", &ranks.get().len().to_string()));
    view! {
        <div class="live-multiples" id="live-multiples">
            <For each=move || ranks.get() key=|r| *r let:rank>
                <RankSmall server=server rank=rank pick=pick />
            </For>
        </div>
    }
}
