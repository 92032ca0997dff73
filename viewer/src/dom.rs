//! The page's own helpers, below every view: sizing a canvas, downloads, keys typed into a
//! field, the address's query parameters, and running something after the current task.

use leptos::prelude::*;
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

/// Runs `f` after the task running now (a zero-delay timeout): after its effects, before the
/// next input.
pub fn after_this_task(f: impl FnOnce() + 'static) {
    after_ms(0, f);
}

/// Runs `f` after the next frame is painted (a zero-delay timeout from an animation frame's
/// callback, which runs just before that frame is drawn).
pub fn after_next_frame(f: impl FnOnce() + 'static) {
    let frame = wasm_bindgen::closure::Closure::once_into_js(move || after_this_task(f));
    if let Some(w) = web_sys::window() {
        let _ = w.request_animation_frame(wasm_bindgen::JsCast::unchecked_ref(&frame));
    }
}

/// Runs `f` in `ms` milliseconds.
pub fn after_ms(ms: i32, f: impl FnOnce() + 'static) {
    let later = wasm_bindgen::closure::Closure::once_into_js(f);
    if let Some(w) = web_sys::window() {
        let _ = w.set_timeout_with_callback_and_timeout_and_arguments_0(wasm_bindgen::JsCast::unchecked_ref(&later), ms);
    }
}
