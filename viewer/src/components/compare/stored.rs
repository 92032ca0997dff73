//! Two traces stored on the server, picked and compared there (`POST /api/trace/diff`), in
//! the Compare view.

use crate::server::{compare_stored, select_value, ServerState};
use crate::state::Loader;
use leptos::prelude::*;
use protocol::TraceRow;

/// Two stored traces to compare.
#[component]
pub fn StoredCompare(
    /// The stored traces to pick from (at least two).
    traces: Vec<TraceRow>,
    /// Shows the comparison.
    loader: Loader,
    /// Where a failure to compare is said.
    server: ServerState,
) -> impl IntoView {
    let options = move |pick: usize| {
        traces
            .iter()
            .enumerate()
            .map(|(k, t)| view! { <option value=t.trace_id.clone() selected=k == pick>{format!("{} ({})", t.trace_id, t.model_name)}</option> })
            .collect_view()
    };
    view! {
        <div class="trace-form" id="srv-compare-form">
            <label>"Compare " <select id="srv-compare-a">{options(0)}</select></label>
            <label>" with " <select id="srv-compare-b">{options(1)}</select></label>
            <button id="srv-compare" on:click=move |_| compare_stored(loader, server, select_value("srv-compare-a"), select_value("srv-compare-b"))>"Compare"</button>
        </div>
    }
}
