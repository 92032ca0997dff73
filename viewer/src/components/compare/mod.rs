//! The Compare view: the open trace (A) and another (B), or two traces stored on the server,
//! side by side as `shared::analysis::diff` computed them ([`diff`], its chart in `chart.rs`).
//! Two stored traces are picked in [`stored`]; a merged trace's two ranks are compared in the
//! Ranks view ([`crate::components::ranks`]), also as a [`diff::DiffView`].

mod chart;
pub mod diff;
pub mod stored;

use crate::state::Comparison;
use diff::DiffView;
use leptos::prelude::*;
use std::sync::Arc;

/// The Compare card: what is compared with what, and the diff.
#[component]
pub fn CompareSection(
    /// The two traces and their diff.
    comparison: Arc<Comparison>,
    /// Closes the comparison.
    on_close: Callback<()>,
) -> impl IntoView {
    let c = comparison;
    view! {
        <section class="card" id="compare" data-drop="compare">
            <div class="card-head">
                <h2>"Compare"</h2>
                <span class="hint">"A " <b>{c.a.clone()}</b> " · B " <b>{c.b.clone()}</b> " · deltas are B − A"</span>
                <span class="spacer"></span>
                {c.of_open_trace.then(|| view! { <span class="hint">"drop another trace here to compare with it instead"</span> })}
                <button class="small" title="Close the comparison" on:click=move |_| on_close.run(())>"×"</button>
            </div>
            <DiffView diff=Arc::new(c.diff.clone()) labels=(c.a.clone(), c.b.clone()) id="compare" />
        </section>
    }
}
