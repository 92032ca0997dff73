//! Memory Tracer's viewer: open a trace in the browser (file picker or drag and drop) and see
//! its summary and top layers, computed by `shared` compiled to WebAssembly. Nothing is
//! uploaded anywhere.

mod open_trace;
mod summary_view;

use leptos::prelude::*;
pub use open_trace::OpenTrace;
pub use summary_view::SummaryView;

/// What the page shows: nothing yet, a loaded trace, or why the file could not be read.
#[derive(Clone)]
pub enum Loaded {
    Nothing,
    Trace { file_name: String, trace: std::sync::Arc<shared::Trace> },
    Error { file_name: String, message: String },
}

#[component]
pub fn App() -> impl IntoView {
    let (loaded, set_loaded) = signal(Loaded::Nothing);
    view! {
        <main class="app">
            <h1>"Memory Tracer"</h1>
            <OpenTrace on_loaded=set_loaded />
            {move || match loaded.get() {
                Loaded::Nothing => view! {
                    <p class="hint">"Drop a PyTorch memory snapshot (.pickle), a torch.profiler trace (.json, .json.gz), a DFTracer trace (.pfw, .pfw.gz) or a Memory Tracer trace here, or pick one."</p>
                }.into_any(),
                Loaded::Trace { file_name, trace } => view! { <SummaryView file_name trace /> }.into_any(),
                Loaded::Error { file_name, message } => view! {
                    <section class="error-panel" role="alert">
                        <h2>"Cannot open " {file_name}</h2>
                        <p>{message}</p>
                    </section>
                }.into_any(),
            }}
        </main>
    }
}
