//! Memory Tracer's viewer: a single page that opens a trace (drop, file picker, `?trace=URL`,
//! or the trace a static report carries), imports and analyses it in a Web Worker with `shared`
//! compiled to WebAssembly, and draws every view. Nothing is uploaded anywhere.
//!
//! The page never holds the trace: the worker does, and answers small questions ("the
//! timeline between these times at this many pixels", "what is live here") as the user zooms,
//! hovers and clicks ([`shared::explore`]).
//!
//! Several files dropped or chosen at once are the ranks of one job: the worker merges them,
//! and the Ranks view shows them side by side. "Compare with…" compares the open trace with
//! another.
//!
//! Every view is a component in [`components`]; [`state`] says who gets which signals;
//! [`bridge`] talks to the worker (messages in [`protocol`]) and to `collector serve`
//! ([`server`]).

pub mod bridge;
pub mod charts;
pub mod components;
mod http;
pub mod perf;
pub mod protocol;
pub mod server;
pub mod state;
pub mod tables;
mod widgets;

pub use components::App;

use leptos::prelude::*;
use shared::explore::Overview;
use state::Loader;
use std::sync::Arc;
use wasm_bindgen::JsCast;

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

thread_local! {
    /// The page's loader, for the warm-up, which the worker starts rather than a component.
    static LOADER: std::cell::Cell<Option<Loader>> = const { std::cell::Cell::new(None) };
}

/// Keeps `loader` for the warm-up ([`begin_warmup`]); the root component calls it once.
pub fn keep_loader(loader: Loader) {
    LOADER.with(|s| s.set(Some(loader)));
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
    let Some(loader) = LOADER.with(|s| s.get()) else { return };
    if loader.overview.with_untracked(Option::is_some) || loader.loading.with_untracked(Option::is_some) {
        WARMUP.with(|w| w.borrow_mut().take());
        return;
    }
    perf::begin_warmup(&overview);
    loader.warmup.set(Some(overview));
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
    if let Some(loader) = LOADER.with(|s| s.get()) {
        loader.warmup.set(None);
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
    if let Some(loader) = LOADER.with(|s| s.get()) {
        if loader.warmup.with_untracked(Option::is_some) {
            loader.warmup.set(None);
        }
    }
}
