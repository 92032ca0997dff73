//! The error panel: the last failure and what can be done about it ("Merge anyway" for ranks
//! recorded far apart, "Upload to the server" for a file too large for the page); the trace
//! shown stays.

use crate::bridge;
use crate::state::Loader;
use leptos::prelude::*;

/// "Cannot open `what`" and why, while there is a failure to show.
#[component]
pub fn ErrorPanel(
    /// The failure shown, and what it offers (read), and the trace still shown.
    loader: Loader,
) -> impl IntoView {
    move || {
        loader.error.get().map(|(name, message)| {
            view! {
                <section class="error-panel" role="alert" id="error-panel">
                    <button class="close" title="Dismiss" on:click=move |_| loader.error.set(None)>"×"</button>
                    <h2>"Cannot open " {name.clone()}</h2>
                    <p>{message}</p>
                    {(loader.merge_anyway.get() == Some(name.clone())).then(|| view! {
                        <button id="merge-anyway" on:click=move |_| bridge::merge_anyway(loader)>"Merge anyway"</button>
                    })}
                    {(loader.offer_upload.get() == Some(name)).then(|| view! {
                        <button id="upload-to-server" on:click=move |_| bridge::upload_offered(loader)>"Upload to the server and open it there"</button>
                    })}
                    {move || loader.overview.get().map(|o| view! {
                        <p class="hint">"Still showing " {o.file_name.clone()} "."</p>
                    })}
                </section>
            }
        })
    }
}
