//! Memory Tracer's viewer: a single page that opens a trace (drop, file picker, `?trace=URL`,
//! or the trace a static report carries), imports and analyses it in a Web Worker with `shared`
//! compiled to WebAssembly, and draws every view. Nothing is uploaded anywhere.
//!
//! The page never holds the trace: the worker does, and answers small questions ("the
//! timeline between these times at this many pixels", "what is live here") as the user zooms,
//! hovers and clicks ([`shared::explore`]).
//!
//! Several files dropped or chosen at once are the ranks of one job: the worker merges them,
//! and the Ranks view ([`ranks`]) shows them side by side. "Compare with…" compares the open
//! trace with another ([`compare`]).

// The 120-line limit on functions (ARCHITECTURE.md) does not hold here yet: the server panel
// is one component of 145 lines, until the views are split into components (issue 34).
#![allow(clippy::too_many_lines)]

mod answers;
pub mod bridge;
pub mod charts;
pub mod compare;
mod http;
pub mod perf;
mod pools;
pub mod protocol;
mod ranks;
pub mod server;
pub mod tables;
mod views;
mod widgets;

use leptos::prelude::*;
use shared::explore::Overview;
use std::sync::Arc;
use wasm_bindgen::JsCast;

/// The page's state, shared by every component (all fields are cheap `Copy` signals).
#[derive(Clone, Copy)]
pub struct AppState {
    pub overview: RwSignal<Option<Arc<Overview>>>,
    /// (file name, stage) while a file is being opened.
    pub loading: RwSignal<Option<(String, String)>>,
    /// (file name, message) of the last failure; the loaded trace stays.
    pub error: RwSignal<Option<(String, String)>>,
    pub worker_memory: RwSignal<u64>,
    pub dark: RwSignal<bool>,
    pub help: RwSignal<bool>,
    /// The comparison the Compare view shows.
    pub compare: RwSignal<Option<Arc<compare::Comparison>>>,
    /// The name in the error panel of rank files refused as recorded far apart, which merge
    /// when asked again.
    pub merge_anyway: RwSignal<Option<String>>,
    /// The worker's warm-up snapshot, drawn out of sight before any file is chosen.
    pub warmup: RwSignal<Option<Arc<Overview>>>,
    /// The name of a file too large for the page, which the server that serves it can take.
    pub offer_upload: RwSignal<Option<String>>,
}

impl AppState {
    fn new() -> Self {
        let prefers_light = window().match_media("(prefers-color-scheme: light)").ok().flatten().is_some_and(|m| m.matches());
        Self {
            overview: RwSignal::new(None),
            loading: RwSignal::new(None),
            error: RwSignal::new(None),
            worker_memory: RwSignal::new(0),
            dark: RwSignal::new(!prefers_light),
            help: RwSignal::new(false),
            compare: RwSignal::new(None),
            merge_anyway: RwSignal::new(None),
            warmup: RwSignal::new(None),
            offer_upload: RwSignal::new(None),
        }
    }

    /// Starts the clock ([`perf::begin_open`]) and shows `name` loading, the trace shown
    /// before staying until it is loaded. A caller that hands the worker its work sends it
    /// before this: ending the warm-up and drawing the progress then run while the worker
    /// reads.
    pub fn begin_loading(&self, name: &str) {
        perf::begin_open();
        end_warmup();
        bridge::clear_prefetched();
        self.error.set(None);
        self.merge_anyway.set(None);
        self.loading.set(Some((name.to_owned(), "starting".into())));
    }

    pub fn finish_loading(&self, overview: Overview) {
        perf::loaded(&overview);
        self.loading.set(None);
        // A comparison with the trace that was open is no longer about what is shown.
        if self.compare.with_untracked(|c| c.as_ref().is_some_and(|c| c.of_open_trace)) {
            self.compare.set(None);
        }
        self.overview.set(Some(Arc::new(overview)));
    }

    pub fn palette(&self) -> charts::Palette {
        if self.dark.get() {
            charts::Palette::DARK
        } else {
            charts::Palette::LIGHT
        }
    }
}

/// Width in CSS pixels of a canvas's parent, for sizing the canvas before drawing.
pub fn fit_canvas(canvas: &web_sys::HtmlCanvasElement, height: u32) {
    let w = canvas.parent_element().map_or(800, |p| p.client_width().max(320) as u32);
    if canvas.width() != w {
        canvas.set_width(w);
    }
    if canvas.height() != height {
        canvas.set_height(height);
    }
}

/// Saves `text` as a download named `file_name`.
pub fn download_text(file_name: &str, mime: &str, text: &str) {
    let parts = js_sys::Array::of1(&text.into());
    let opts = web_sys::BlobPropertyBag::new();
    opts.set_type(mime);
    let Ok(blob) = web_sys::Blob::new_with_str_sequence_and_options(&parts, &opts) else { return };
    if let Ok(url) = web_sys::Url::create_object_url_with_blob(&blob) {
        download_url(file_name, &url);
        let _ = web_sys::Url::revoke_object_url(&url);
    }
}

pub fn download_url(file_name: &str, url: &str) {
    let doc = document();
    if let Some(a) = doc.create_element("a").ok().and_then(|a| a.dyn_into::<web_sys::HtmlAnchorElement>().ok()) {
        a.set_href(url);
        a.set_download(file_name);
        let _ = doc.body().map(|b| b.append_child(&a));
        a.click();
        a.remove();
    }
}

/// True when a key goes to a form field (the search box, a filter, the metric menu), not to
/// the page's shortcuts.
pub fn is_typing(ev: &web_sys::KeyboardEvent) -> bool {
    ev.target()
        .and_then(|t| t.dyn_into::<web_sys::HtmlElement>().ok())
        .is_some_and(|el| matches!(el.tag_name().as_str(), "INPUT" | "TEXTAREA" | "SELECT"))
}

/// The page address's query parameter `name`.
pub fn query_param(name: &str) -> Option<String> {
    let search = window().location().search().ok()?;
    web_sys::UrlSearchParams::new_with_str(&search).ok()?.get(name)
}

/// The trace to open at start: `?trace=URL`, or the one a static report names in
/// `<meta name="memory-tracer-trace">`.
fn initial_trace_url() -> Option<String> {
    query_param("trace")
        .or_else(|| document().query_selector("meta[name=memory-tracer-trace]").ok().flatten().and_then(|m| m.get_attribute("content")))
}

thread_local! {
    static STATE: std::cell::Cell<Option<AppState>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` after the task running now (a zero-delay timeout): after its effects, before the
/// next input.
pub fn after_this_task(f: impl FnOnce() + 'static) {
    let later = wasm_bindgen::closure::Closure::once_into_js(f);
    if let Some(w) = web_sys::window() {
        let _ = w.set_timeout_with_callback(wasm_bindgen::JsCast::unchecked_ref(&later));
    }
}

/// Times the hidden warm-up report is drawn. V8 runs wasm in its baseline compiler until a
/// function has run enough to be optimised: a file chosen after one warm-up round was drawn
/// in 161-194 ms, the same file opened again in 52-97 ms (ResNet-18 snapshot, 0.47 MB).
const WARMUP_ROUNDS: u32 = 3;

thread_local! {
    /// The warm-up report's overview and the rounds it has still to be drawn.
    static WARMUP: std::cell::RefCell<Option<(Arc<Overview>, u32)>> = const { std::cell::RefCell::new(None) };
}

/// Draws the worker's warm-up snapshot out of sight, unless a trace is open or opening (then
/// the first file is what warms the page up).
pub fn begin_warmup(overview: Overview) {
    let overview = Arc::new(overview);
    WARMUP.with(|w| *w.borrow_mut() = Some((overview.clone(), WARMUP_ROUNDS - 1)));
    draw_warmup(overview);
}

fn draw_warmup(overview: Arc<Overview>) {
    let Some(state) = STATE.with(|s| s.get()) else { return };
    if state.overview.with_untracked(Option::is_some) || state.loading.with_untracked(Option::is_some) {
        WARMUP.with(|w| w.borrow_mut().take());
        return;
    }
    perf::begin_warmup(&overview);
    state.warmup.set(Some(overview));
}

/// The warm-up report is drawn (its next round follows, after this task) or a file was chosen
/// (the warm-up ends).
pub fn warmup_drawn() {
    let next = WARMUP.with(|w| {
        let mut w = w.borrow_mut();
        match w.as_mut() {
            Some((o, left)) if *left > 0 => {
                *left -= 1;
                Some(o.clone())
            }
            _ => None,
        }
    });
    let Some(overview) = next else { return end_warmup() };
    perf::pause_warmup();
    bridge::forget_warmup_requests();
    if let Some(state) = STATE.with(|s| s.get()) {
        state.warmup.set(None);
    }
    after_this_task(move || draw_warmup(overview));
}

/// Removes the warm-up report; its requests still in flight are forgotten.
pub fn end_warmup() {
    WARMUP.with(|w| w.borrow_mut().take());
    if perf::warming() {
        bridge::note_chart_widths();
    }
    perf::end_warmup();
    bridge::forget_warmup_requests();
    if let Some(state) = STATE.with(|s| s.get()) {
        if state.warmup.with_untracked(Option::is_some) {
            state.warmup.set(None);
        }
    }
}

#[component]
pub fn App() -> impl IntoView {
    let state = AppState::new();
    provide_context(state);
    STATE.with(|s| s.set(Some(state)));
    if let Err(e) = bridge::start(state) {
        state.error.set(Some(("worker".into(), e)));
    }
    let inlined = js_sys::Reflect::get(&js_sys::global(), &"__mtTrace".into()).ok().filter(|v| v.is_object());
    if let Some(t) = inlined {
        let name = js_sys::Reflect::get(&t, &"name".into()).ok().and_then(|v| v.as_string()).unwrap_or_default();
        if let Some(bytes) = js_sys::Reflect::get(&t, &"bytes".into()).ok().and_then(|b| b.dyn_into::<js_sys::Uint8Array>().ok()) {
            bridge::open_bytes(state, &name, bytes);
        }
    } else if let Some(url) = initial_trace_url() {
        bridge::open_url(state, &url);
    }
    Effect::new(move |_| {
        let theme = if state.dark.get() { "dark" } else { "light" };
        let _ = document().document_element().map(|e| e.set_attribute("data-theme", theme));
    });
    let _keys = window_event_listener(leptos::ev::keydown, move |ev| {
        if is_typing(&ev) {
            if ev.key() == "Escape" {
                if let Some(el) = ev.target().and_then(|t| t.dyn_into::<web_sys::HtmlElement>().ok()) {
                    let _ = el.blur();
                }
            }
            return;
        }
        match ev.key().as_str() {
            "?" => state.help.update(|h| *h = !*h),
            "Escape" => state.help.set(false),
            "t" => state.dark.update(|d| *d = !*d),
            "o" => {
                if let Some(el) = document().get_element_by_id("trace-file").and_then(|e| e.dyn_into::<web_sys::HtmlElement>().ok()) {
                    el.click();
                }
            }
            "/" => {
                ev.prevent_default();
                if let Some(el) = document().get_element_by_id("flame-search").and_then(|e| e.dyn_into::<web_sys::HtmlElement>().ok()) {
                    let _ = el.focus();
                }
            }
            k @ ("1" | "2" | "3" | "4" | "5" | "6" | "7") => {
                let id = ["summary", "timeline", "flame", "rank", "tables", "fragmentation", "segments"]
                    [k.as_bytes()[0] as usize - b'1' as usize];
                if let Some(el) = document().get_element_by_id(id) {
                    el.scroll_into_view();
                }
            }
            _ => {}
        }
    });
    // Drop a file anywhere on the page (several: the ranks of one job); on a "Compare with…"
    // target, the file to compare with.
    let _dragover = window_event_listener(leptos::ev::dragover, |ev| ev.prevent_default());
    let _drop = window_event_listener(leptos::ev::drop, move |ev| {
        ev.prevent_default();
        let files = bridge::files_of(ev.data_transfer().and_then(|d| d.files()));
        let on_compare = ev
            .target()
            .and_then(|t| t.dyn_into::<web_sys::Element>().ok())
            .and_then(|e| e.closest("[data-drop=compare]").ok().flatten())
            .is_some();
        match (on_compare, files.as_slice()) {
            (true, [one]) => bridge::compare_file(state, one.clone()),
            (true, [_, _, ..]) => state.error.set(Some((
                "the comparison".into(),
                "expected one trace to compare with; several files dropped together are the ranks of one job (drop them outside “Compare with…” to merge them)".into(),
            ))),
            _ => bridge::open_files(state, files),
        }
    });
    view! {
        <views::Header />
        <main class="app">
            {http::base().map(|_| view! { <server::ServerPanel /> })}
            {move || state.loading.get().map(|(name, stage)| view! {
                <section class="progress" role="status" id="progress">
                    <span class="spinner"></span>
                    "Opening " <b>{name}</b> ": " {stage} "…"
                </section>
            })}
            {move || state.error.get().map(|(name, message)| view! {
                <section class="error-panel" role="alert" id="error-panel">
                    <button class="close" title="Dismiss" on:click=move |_| state.error.set(None)>"×"</button>
                    <h2>"Cannot open " {name.clone()}</h2>
                    <p>{message}</p>
                    {(state.merge_anyway.get() == Some(name.clone())).then(|| view! {
                        <button id="merge-anyway" on:click=move |_| bridge::merge_anyway(state)>"Merge anyway"</button>
                    })}
                    {(state.offer_upload.get() == Some(name)).then(|| view! {
                        <button id="upload-to-server" on:click=move |_| bridge::upload_offered(state)>"Upload to the server and open it there"</button>
                    })}
                    {move || state.overview.get().map(|o| view! {
                        <p class="hint">"Still showing " {o.file_name.clone()} "."</p>
                    })}
                </section>
            })}
            {move || state.compare.get().map(|c| view! { <compare::CompareSection comparison=c /> })}
            {move || match state.overview.get() {
                None => view! { <views::Welcome /> }.into_any(),
                Some(o) => view! { <views::Report overview=o /> }.into_any(),
            }}
            {move || state.warmup.get().map(|o| view! {
                <div class="warmup" aria-hidden="true"><views::Report overview=o /></div>
            })}
        </main>
        <views::Help />
    }
}
