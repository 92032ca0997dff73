//! Timing marks the benchmarks read from the page: `<body data-load-ms>` (file chosen → worker
//! answered with the overview), `data-drawn-ms` (file chosen → every chart drawn) and
//! `window.__mtFrames` (milliseconds from each zoom or pan input to its redrawn frame) and
//! `data-worker-memory` (bytes of the worker's wasm memory, its peak).

use shared::explore::Overview;
use std::cell::RefCell;
use std::collections::BTreeSet;

#[derive(Default)]
struct Marks {
    opened_at: f64,
    expected: BTreeSet<&'static str>,
    drawn: BTreeSet<&'static str>,
    done: bool,
}

thread_local! {
    static MARKS: RefCell<Marks> = RefCell::new(Marks::default());
}

pub fn now() -> f64 {
    web_sys::window().and_then(|w| w.performance()).map_or(0.0, |p| p.now())
}

pub fn set_body(name: &str, value: &str) {
    if let Some(body) = web_sys::window().and_then(|w| w.document()).and_then(|d| d.body()) {
        let _ = body.set_attribute(name, value);
    }
}

pub fn begin_open() {
    MARKS.with(|m| *m.borrow_mut() = Marks { opened_at: now(), ..Marks::default() });
    set_body("data-drawn-ms", "");
}

/// Every chart this overview will draw.
pub fn loaded(o: &Overview) {
    let ms = MARKS.with(|m| {
        let mut m = m.borrow_mut();
        m.expected = ["timeline", "active", "flame", "fragmentation"].into_iter().collect();
        if o.profile.is_some() || !o.curves.is_empty() {
            m.expected.insert("rank");
        }
        if o.has_segments {
            m.expected.insert("segments");
        }
        if o.ranks.is_some() {
            m.expected.insert("ranks");
        }
        if o.summary.total_events == 0 {
            m.expected.remove("timeline");
            m.expected.remove("active");
            m.expected.remove("fragmentation");
            m.expected.remove("flame");
        }
        (now() - m.opened_at, m.expected.is_empty())
    });
    set_body("data-load-ms", &format!("{:.1}", ms.0));
    if ms.1 {
        // Nothing to draw: the page is complete as it is.
        set_body("data-drawn-ms", &format!("{:.1}", ms.0));
    }
}

/// A chart finished drawing.
pub fn drawn(chart: &'static str) {
    let done = MARKS.with(|m| {
        let mut m = m.borrow_mut();
        m.drawn.insert(chart);
        if !m.done && !m.expected.is_empty() && m.expected.is_subset(&m.drawn) {
            m.done = true;
            Some(now() - m.opened_at)
        } else {
            None
        }
    });
    if let Some(ms) = done {
        set_body("data-drawn-ms", &format!("{ms:.1}"));
    }
}

/// A zoom or pan frame took `ms` from input to pixels.
pub fn frame(ms: f64) {
    let Some(w) = web_sys::window() else { return };
    let key = wasm_bindgen::JsValue::from_str("__mtFrames");
    let arr = js_sys::Reflect::get(&w, &key).ok().filter(|v| v.is_object()).unwrap_or_else(|| {
        let a: wasm_bindgen::JsValue = js_sys::Array::new().into();
        let _ = js_sys::Reflect::set(&w, &key, &a);
        a
    });
    use wasm_bindgen::JsCast;
    let _ = arr.unchecked_into::<js_sys::Array>().push(&ms.into());
    set_body("data-frame-ms", &format!("{ms:.2}"));
}
