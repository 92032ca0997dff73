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

/// True when a key goes to a form field (the search box, a filter, the metric menu, a slider),
/// not to the page's shortcuts. A file input, a checkbox or a button takes no keys: keys
/// pressed while one has the focus (a trace just chosen) are the page's.
pub fn is_typing(ev: &web_sys::KeyboardEvent) -> bool {
    field_of(ev).is_some_and(|(tag, kind)| tag != "INPUT" || !NO_KEYS.contains(&kind.as_str()))
}

/// True when a key is typed as text: into a text field, a text area or editable content (a
/// menu or a slider takes keys, but no `?`).
pub fn takes_text(ev: &web_sys::KeyboardEvent) -> bool {
    field_of(ev).is_some_and(|(tag, kind)| tag == "TEXTAREA" || tag == "EDITABLE" || (tag == "INPUT" && TEXT.contains(&kind.as_str())))
}

/// Input types that take no keys.
const NO_KEYS: [&str; 7] = ["file", "checkbox", "radio", "button", "submit", "reset", "color"];

/// Input types typed into as text (`""`: no type, a text field).
const TEXT: [&str; 9] = ["", "text", "search", "number", "email", "password", "url", "tel", "date"];

/// The form field a key event went to: its tag (`EDITABLE` for editable content) and, for an
/// input, its type in lower case.
fn field_of(ev: &web_sys::KeyboardEvent) -> Option<(String, String)> {
    let el = ev.target().and_then(|t| t.dyn_into::<web_sys::HtmlElement>().ok())?;
    match el.tag_name().as_str() {
        t @ ("INPUT" | "TEXTAREA" | "SELECT") => Some((t.to_owned(), el.get_attribute("type").unwrap_or_default().to_ascii_lowercase())),
        _ if el.is_content_editable() => Some(("EDITABLE".to_owned(), String::new())),
        _ => None,
    }
}

/// Calls `f` with every key pressed on the page before any element has it (the window's
/// capture phase), so that a key stopped on its way up, or a key event that does not bubble,
/// still reaches the page's shortcuts. For the page's whole life.
pub fn on_every_key(f: impl Fn(web_sys::KeyboardEvent) + 'static) {
    let listener = wasm_bindgen::closure::Closure::<dyn Fn(web_sys::KeyboardEvent)>::new(f);
    if let Some(w) = web_sys::window() {
        let _ = w.add_event_listener_with_callback_and_bool("keydown", listener.as_ref().unchecked_ref(), true);
    }
    listener.forget();
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
