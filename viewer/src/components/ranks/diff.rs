//! The two ranks whose peaks differ most, compared on demand (the diff runs in the worker)
//! and shown as a [`DiffView`].

use crate::bridge;
use crate::components::compare::diff::DiffView;
use crate::state::Errors;
use leptos::prelude::*;
use shared::analysis::diff::TraceDiff;
use shared::explore::{RankSet, Request, Response};
use std::sync::Arc;

/// The two most different ranks, and a button that compares them.
#[component]
pub fn MostDifferent(
    /// The merged trace's ranks (which two differ most).
    ranks: Arc<RankSet>,
) -> impl IntoView {
    let errors = expect_context::<Errors>();
    let (a, b) = ranks.most_different;
    let name = |k: u8| ranks.devices.iter().find(|d| d.device_index == k).map_or_else(|| format!("device {k}"), |d| d.device.clone());
    let labels = (name(a), name(b));
    let result: RwSignal<Option<Arc<TraceDiff>>> = RwSignal::new(None);
    let busy = RwSignal::new(false);
    let compare = move |_| {
        busy.set(true);
        bridge::ask(&Request::DiffDevices { a, b }, move |r| {
            busy.set(false);
            match r {
                Response::Diff(d) => result.set(Some(Arc::new(*d))),
                Response::Error { message } => errors.report("the rank comparison", message),
                _ => {}
            }
        });
    };
    let button_text = format!("Compare {} with {}", labels.0, labels.1);
    view! {
        <div class="card-head">
            <h3>"The two most different ranks"</h3>
            <span class="hint">"highest and lowest allocated peak"</span>
            <button id="rank-diff-button" on:click=compare disabled=move || busy.get()>{button_text}</button>
        </div>
        {move || result.get().map(|d| view! { <DiffView diff=d labels=labels.clone() id="rank-diff" /> })}
    }
}
