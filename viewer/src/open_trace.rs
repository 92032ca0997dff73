//! The file picker and drop zone: reads the chosen file's bytes and imports them.

use crate::Loaded;
use leptos::prelude::*;
use wasm_bindgen::JsCast;

fn import_file(file: web_sys::File, on_loaded: WriteSignal<Loaded>) {
    let file_name = file.name();
    wasm_bindgen_futures::spawn_local(async move {
        let loaded = match wasm_bindgen_futures::JsFuture::from(file.array_buffer()).await {
            Ok(buf) => {
                let bytes = js_sys::Uint8Array::new(&buf).to_vec();
                match shared::import(&bytes, &shared::ImportOptions::default()) {
                    Ok(trace) => Loaded::Trace { file_name, trace: std::sync::Arc::new(trace) },
                    Err(e) => Loaded::Error { file_name, message: e.to_string() },
                }
            }
            Err(_) => Loaded::Error { file_name, message: "the browser could not read the file".into() },
        };
        on_loaded.set(loaded);
    });
}

/// File input and drop zone.
#[component]
pub fn OpenTrace(
    /// Receives the imported trace or the import error.
    on_loaded: WriteSignal<Loaded>,
) -> impl IntoView {
    let on_change = move |ev: leptos::ev::Event| {
        let input: Option<web_sys::HtmlInputElement> = ev.target().and_then(|t| t.dyn_into().ok());
        if let Some(file) = input.and_then(|i| i.files()).and_then(|f| f.get(0)) {
            import_file(file, on_loaded);
        }
    };
    let on_drop = move |ev: leptos::ev::DragEvent| {
        ev.prevent_default();
        if let Some(file) = ev.data_transfer().and_then(|d| d.files()).and_then(|f| f.get(0)) {
            import_file(file, on_loaded);
        }
    };
    view! {
        <section class="drop-zone" on:dragover=|ev: leptos::ev::DragEvent| ev.prevent_default() on:drop=on_drop>
            <label>"Open a trace: " <input type="file" id="trace-file" on:change=on_change /></label>
        </section>
    }
}
