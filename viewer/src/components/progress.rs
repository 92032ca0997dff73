//! The progress line: which file is opening and the stage it is at.

use leptos::prelude::*;

/// "Opening `name`: `stage`…" while a file opens.
#[component]
pub fn Progress(
    /// (file name, stage) while a file is being opened.
    #[prop(into)]
    loading: Signal<Option<(String, String)>>,
) -> impl IntoView {
    move || {
        loading.get().map(|(name, stage)| {
            view! {
                <section class="progress" role="status" id="progress">
                    <span class="spinner"></span>
                    "Opening " <b>{name}</b> ": " {stage} "…"
                </section>
            }
        })
    }
}
