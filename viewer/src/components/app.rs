//! The root component: makes the page's state and hands it out ([`crate::state`]), starts the
//! worker, opens the trace given at start, and takes the keyboard shortcuts and files dropped
//! anywhere on the page.

use super::{compare::CompareSection, error_panel::ErrorPanel, header::Header, help::Help, progress::Progress};
use super::{report::Report, server_panel::ServerPanel, welcome::Welcome};
use crate::state::{Errors, Loader, Theme};
use crate::{
    bridge,
    dom::{is_typing, on_every_key, query_param, takes_text},
    http,
};
use leptos::prelude::*;
use wasm_bindgen::JsCast;

/// The trace to open at start: `?trace=URL`, or the one a static report names in
/// `<meta name="memory-tracer-trace">`.
fn initial_trace_url() -> Option<String> {
    query_param("trace")
        .or_else(|| document().query_selector("meta[name=memory-tracer-trace]").ok().flatten().and_then(|m| m.get_attribute("content")))
}

/// Opens what the page was given: the trace a single-file report inlines (`window.__mtTrace`),
/// else [`initial_trace_url`]'s.
fn open_initial_trace(loader: Loader) {
    let inlined = js_sys::Reflect::get(&js_sys::global(), &"__mtTrace".into()).ok().filter(|v| v.is_object());
    if let Some(t) = inlined {
        let name = js_sys::Reflect::get(&t, &"name".into()).ok().and_then(|v| v.as_string()).unwrap_or_default();
        if let Some(bytes) = js_sys::Reflect::get(&t, &"bytes".into()).ok().and_then(|b| b.dyn_into::<js_sys::Uint8Array>().ok()) {
            bridge::open_bytes(loader, &name, bytes);
        }
    } else if let Some(url) = initial_trace_url() {
        bridge::open_url(loader, &url);
    }
}

/// The element with id `id`, as an HTML element.
fn html_element(id: &str) -> Option<web_sys::HtmlElement> {
    document().get_element_by_id(id).and_then(|e| e.dyn_into::<web_sys::HtmlElement>().ok())
}

/// The page's shortcuts (the help overlay lists them). A key typed into a form field is the
/// field's, but Escape leaves it (and closes the help), and `?` opens the help from anywhere
/// but a text field.
fn on_key(ev: &web_sys::KeyboardEvent, dark: RwSignal<bool>, help: RwSignal<bool>) {
    let key = ev.key();
    if key == "Escape" && help.get_untracked() {
        help.set(false);
    }
    if key == "?" && !takes_text(ev) {
        help.update(|h| *h = !*h);
        return;
    }
    if is_typing(ev) {
        if key == "Escape" {
            if let Some(el) = ev.target().and_then(|t| t.dyn_into::<web_sys::HtmlElement>().ok()) {
                let _ = el.blur();
            }
        }
        return;
    }
    match key.as_str() {
        "t" => dark.update(|d| *d = !*d),
        "o" => {
            if let Some(el) = html_element("trace-file") {
                el.click();
            }
        }
        "/" => {
            ev.prevent_default();
            if let Some(el) = html_element("flame-search") {
                let _ = el.focus();
            }
        }
        k @ ("1" | "2" | "3" | "4" | "5" | "6" | "7") => {
            let id =
                ["summary", "timeline", "flame", "rank", "tables", "fragmentation", "segments"][k.as_bytes()[0] as usize - b'1' as usize];
            if let Some(el) = document().get_element_by_id(id) {
                el.scroll_into_view();
            }
        }
        _ => {}
    }
}

/// A file dropped anywhere on the page (several: the ranks of one job); on a "Compare with…"
/// target, the file to compare with.
fn on_drop(ev: &web_sys::DragEvent, loader: Loader) {
    ev.prevent_default();
    let files = bridge::files_of(ev.data_transfer().and_then(|d| d.files()));
    let on_compare = ev
        .target()
        .and_then(|t| t.dyn_into::<web_sys::Element>().ok())
        .and_then(|e| e.closest("[data-drop=compare]").ok().flatten())
        .is_some();
    match (on_compare, files.as_slice()) {
        (true, [one]) => bridge::compare_file(loader, one.clone()),
        (true, [_, _, ..]) => loader.error.set(Some((
            "the comparison".into(),
            "expected one trace to compare with; several files dropped together are the ranks of one job (drop them outside “Compare with…” to merge them)".into(),
        ))),
        _ => bridge::open_files(loader, files),
    }
}

/// The page.
#[component]
pub fn App() -> impl IntoView {
    let loader = Loader::new();
    let prefers_light = window().match_media("(prefers-color-scheme: light)").ok().flatten().is_some_and(|m| m.matches());
    let dark = RwSignal::new(!prefers_light);
    let help = RwSignal::new(false);
    provide_context(Theme::new(dark));
    provide_context::<Errors>(loader.errors());
    crate::bridge::warmup::keep_loader(loader);
    if let Err(e) = bridge::start(loader) {
        loader.error.set(Some(("worker".into(), e)));
    }
    open_initial_trace(loader);
    Effect::new(move |_| {
        let theme = if dark.get() { "dark" } else { "light" };
        let _ = document().document_element().map(|e| e.set_attribute("data-theme", theme));
    });
    on_every_key(move |ev| on_key(&ev, dark, help));
    let _dragover = window_event_listener(leptos::ev::dragover, |ev| ev.prevent_default());
    let _drop = window_event_listener(leptos::ev::drop, move |ev| on_drop(&ev, loader));
    let close_compare = Callback::new(move |()| loader.compare.set(None));
    view! {
        <Header loader=loader dark=dark help=help />
        <main class="app">
            {http::base().map(|_| view! { <ServerPanel loader=loader /> })}
            <Progress loading=loader.loading />
            <ErrorPanel loader=loader />
            {move || loader.compare.get().map(|c| view! { <CompareSection comparison=c on_close=close_compare /> })}
            {move || match loader.overview.get() {
                None => view! { <Welcome /> }.into_any(),
                Some(o) => view! { <Report overview=o loader=loader /> }.into_any(),
            }}
            {move || loader.warmup.get().map(|o| view! {
                <div class="warmup" aria-hidden="true"><Report overview=o loader=loader /></div>
            })}
        </main>
        <Help open=help />
    }
}
