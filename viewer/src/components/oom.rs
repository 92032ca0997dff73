//! Why a run ran out of memory, shown first when it did: the request that failed and what was
//! live by layer, phase and innermost frame (`shared::analysis::oom`).

use leptos::prelude::*;
use shared::analysis::oom::{OomGroup, OomReport};
use shared::units::format_bytes;
use std::sync::Arc;

/// A table of what was live, by `title`'s grouping; nothing when no group has any.
fn groups_table(title: &'static str, groups: Vec<OomGroup>) -> Option<impl IntoView> {
    (!groups.is_empty()).then(|| {
        view! {
            <table class="data">
                <thead><tr><th>{title}</th><th>"bytes"</th><th>"allocations"</th></tr></thead>
                <tbody>
                    {groups.into_iter().map(|g| view! {
                        <tr><td>{g.name}</td><td data-bytes=g.bytes.to_string()>{format_bytes(g.bytes)}</td><td>{g.allocations.to_string()}</td></tr>
                    }).collect_view()}
                </tbody>
            </table>
        }
    })
}

/// The out-of-memory explanation: the verdict, then what was live by layer, phase and frame.
#[component]
pub fn OomSection(
    /// The explanation of the first out-of-memory event.
    oom: Arc<OomReport>,
) -> impl IntoView {
    let free = oom.largest_free_block_bytes.map(|b| format!(" · largest free block {}", format_bytes(b)));
    view! {
        <section class="card oom" id="oom">
            <h2>"Out of memory"</h2>
            <p class="warning" id="oom-verdict">{oom.verdict.clone()}</p>
            <p class="sub">
                {format!(
                    "requested {} · allocated {} · reserved {} · reserved but unused {}",
                    format_bytes(oom.requested_bytes),
                    format_bytes(oom.allocated_bytes),
                    format_bytes(oom.reserved_bytes),
                    format_bytes(oom.unused_reserved_bytes)
                )}
                {free}
                {(oom.ooms > 1).then(|| format!(" · {} out-of-memory events, the last (the one the program saw last) explained", oom.ooms))}
            </p>
            <div class="oom-tables">
                {groups_table("live, by layer", oom.by_layer.clone())}
                {groups_table("by the phase that allocated it", oom.by_phase.clone())}
                {groups_table("by innermost frame", oom.by_frame.clone())}
            </div>
        </section>
    }
}
