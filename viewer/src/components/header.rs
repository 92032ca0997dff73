//! The title bar: open a trace (several files: the ranks of one job), compare it with
//! another, export it, switch the theme, and the keyboard shortcuts.

use crate::bridge;
use crate::state::{Errors, Loader};
use leptos::prelude::*;
use shared::explore::{Request, Response};
use shared::units::format_bytes;
use wasm_bindgen::JsCast;

/// The files chosen in a file input's change event; the input is emptied so that the same
/// files can be chosen again.
fn chosen_files(ev: &leptos::ev::Event) -> Vec<web_sys::File> {
    let input: Option<web_sys::HtmlInputElement> = ev.target().and_then(|t| t.dyn_into().ok());
    let files = bridge::files_of(input.as_ref().and_then(|i| i.files()));
    if let Some(i) = input {
        i.set_value("");
    }
    files
}

/// Saves the shown trace in `format` (the worker writes it).
fn export_as(format: &'static str, errors: Errors) {
    bridge::ask(&Request::Export { format: format.into() }, move |r| match r {
        Response::Export { file_name, mime, text } => crate::dom::download_text(&file_name, &mime, &text),
        Response::Error { message } => errors.report("export", message),
        _ => {}
    })
}

/// Title bar: open, compare, exports, theme and help.
#[component]
pub fn Header(
    /// Opens the files chosen; the trace shown and the worker's memory are read from it.
    loader: Loader,
    /// The dark theme, switched here.
    dark: RwSignal<bool>,
    /// The shortcuts overlay, opened and closed here.
    help: RwSignal<bool>,
) -> impl IntoView {
    let errors = expect_context::<Errors>();
    let on_change = move |ev: leptos::ev::Event| bridge::open_files(loader, chosen_files(&ev));
    let on_compare = move |ev: leptos::ev::Event| {
        if let Some(file) = chosen_files(&ev).into_iter().next() {
            bridge::compare_file(loader, file);
        }
    };
    let export = move |format: &'static str| export_as(format, errors);
    let has_trace = move || loader.overview.get().is_some_and(|o| o.summary.total_events > 0 || o.profile.is_some());
    let memory = loader.worker_memory;
    view! {
        <header class="top">
            <h1>"Memory Tracer"</h1>
            <label class="button primary" title="Open a trace, or one file per rank of a job to merge them (o)">
                "Open trace…" <input type="file" id="trace-file" multiple on:change=on_change />
            </label>
            <label class="button" class:hidden=move || !has_trace() data-drop="compare" id="compare-drop"
                title="Compare the open trace with another: choose it, or drop it here">
                "Compare with…" <input type="file" id="compare-file" on:change=on_compare />
            </label>
            <nav class="exports" class:hidden=move || !has_trace()>
                "Export: "
                <button on:click=move |_| export("speedscope") title="speedscope JSON (speedscope.app)">"speedscope"</button>
                <button on:click=move |_| export("timeline") title="Memory Tracer timeline JSON">"timeline"</button>
                <button on:click=move |_| export("chrome") title="Chrome trace JSON (Perfetto)">"Perfetto"</button>
                <button on:click=move |_| export("csv") title="Every event as CSV">"events CSV"</button>
                <button on:click=move |_| export("layers_csv") title="The layer table as CSV">"layers CSV"</button>
            </nav>
            <span class="spacer"></span>
            <span class="memory" title="WebAssembly memory of the worker that holds the trace (it only grows, so this is its peak)">
                {move || (memory.get() > 0).then(|| format!("worker memory {}", format_bytes(memory.get())))}
            </span>
            <button on:click=move |_| dark.update(|d| *d = !*d) title="Dark or light (t)">
                {move || if dark.get() { "☀ light" } else { "☾ dark" }}
            </button>
            <button on:click=move |_| help.update(|h| *h = !*h) title="Keyboard shortcuts (?)">"?"</button>
        </header>
    }
}
