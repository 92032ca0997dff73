//! The live view's rank picker: every rank overlaid on the large chart, or one drawn alone.

use crate::perf;
use crate::server::ServerState;
use leptos::prelude::*;

/// Which rank the large chart draws: every rank overlaid, or one.
#[component]
pub fn RankPicker(
    /// The server panel's state (the ranks so far).
    server: ServerState,
    /// The rank drawn large; `None`: all overlaid.
    pick: RwSignal<Option<u32>>,
) -> impl IntoView {
    let ranks = move || server.live.with(|l| l.as_ref().map(|l| l.ranks.keys().copied().collect::<Vec<u32>>()).unwrap_or_default());
    let on_change = move |ev: leptos::ev::Event| {
        let v = event_target_value(&ev);
        pick.set(v.parse().ok());
        perf::set_body("data-live-pick", if v.is_empty() { "all" } else { &v });
    };
    view! {
        <label class="live-picker">
            "Ranks: "
            <select id="live-rank-picker" on:change=on_change prop:value=move || pick.get().map(|r| r.to_string()).unwrap_or_default()>
                <option value="">"all, overlaid"</option>
                {move || ranks().into_iter().map(|r| view! { <option value=r.to_string()>{format!("rank {r}")}</option> }).collect_view()}
            </select>
        </label>
    }
}
