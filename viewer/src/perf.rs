//! Timing marks the benchmarks read from the page: `<body data-load-ms>` (file chosen → worker
//! answered with the overview), `data-first-screen-ms` (file chosen → the report's first screen
//! drawn and painted), `data-drawn-ms` (file chosen → every chart drawn) and
//! `window.__mtFrames` (milliseconds from each zoom or pan input to its redrawn frame) and
//! `data-worker-memory` (bytes of the worker's wasm memory, its peak); `data-warm` (ms since the page
//! started) once the hidden warm-up report ([`crate::messages::ToPage::Warmup`]) is drawn;
//! `window.__mtMarks`, the points in opening a file, the worker's stages among them.

use shared::explore::Overview;
use std::cell::RefCell;
use std::collections::BTreeSet;

#[derive(Default)]
struct Marks {
    opened_at: f64,
    expected: BTreeSet<Chart>,
    drawn: BTreeSet<Chart>,
    done: bool,
    /// Whether the first screen's painting was marked.
    first_screen: bool,
}

thread_local! {
    static MARKS: RefCell<Marks> = RefCell::new(Marks::default());
    /// The charts the warm-up report has still to draw; `None` when none is drawing.
    static WARMING: RefCell<Option<BTreeSet<Chart>>> = const { RefCell::new(None) };
    /// What runs (after the task that drew its last chart) once the warm-up report is drawn.
    static WARM_DRAWN: std::cell::Cell<Option<fn()>> = const { std::cell::Cell::new(None) };
}

/// A chart a report draws; it tells [`drawn`] when it has, and its time is
/// `data-drawn-{name}-ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Chart {
    Timeline,
    Active,
    Flame,
    Fragmentation,
    Rank,
    Segments,
    Pools,
    Ranks,
}

impl Chart {
    const ALL: [Chart; 8] =
        [Chart::Timeline, Chart::Active, Chart::Flame, Chart::Fragmentation, Chart::Rank, Chart::Segments, Chart::Pools, Chart::Ranks];

    /// The name in its marks (`drawn {name}`, `data-drawn-{name}-ms`).
    pub fn name(self) -> &'static str {
        match self {
            Chart::Timeline => "timeline",
            Chart::Active => "active",
            Chart::Flame => "flame",
            Chart::Fragmentation => "fragmentation",
            Chart::Rank => "rank",
            Chart::Segments => "segments",
            Chart::Pools => "pools",
            Chart::Ranks => "ranks",
        }
    }
}

/// Every chart a report of `o` draws.
fn charts_of(o: &Overview) -> BTreeSet<Chart> {
    let mut expected = BTreeSet::new();
    if o.summary.total_events > 0 {
        expected.extend([Chart::Timeline, Chart::Active, Chart::Flame]);
        if crate::messages::requests::draws_fragmentation(o) {
            expected.insert(Chart::Fragmentation);
        }
    }
    if o.profile.is_some() || !o.curves.is_empty() {
        expected.insert(Chart::Rank);
    }
    if o.has_segments {
        expected.extend([Chart::Segments, Chart::Pools]);
    }
    if o.ranks.is_some() {
        expected.insert(Chart::Ranks);
    }
    expected
}

/// The warm-up report of `o` is being drawn: its charts are not the page's; `drawn` runs
/// after the task that draws the last of them.
pub fn begin_warmup(o: &Overview, drawn: fn()) {
    WARMING.with(|w| *w.borrow_mut() = Some(charts_of(o)));
    WARM_DRAWN.with(|d| d.set(Some(drawn)));
}

/// Whether the warm-up report is drawing.
pub fn warming() -> bool {
    WARMING.with(|w| w.borrow().is_some())
}

/// A round of the warm-up is drawn, another follows.
pub fn pause_warmup() {
    WARMING.with(|w| w.borrow_mut().take());
}

/// The warm-up is over (drawn, or a file was chosen first).
pub fn end_warmup() {
    if WARMING.with(|w| w.borrow_mut().take()).is_some() {
        set_body("data-warm", &format!("{:.0}", now()));
    }
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
    if let Some(w) = web_sys::window() {
        let _ = js_sys::Reflect::set(&w, &"__mtMarks".into(), &js_sys::Array::new());
    }
    set_body("data-drawn-ms", "");
    set_body("data-first-screen-ms", "");
    // Each chart's time is this file's, not the last one's.
    for chart in Chart::ALL {
        set_body(&format!("data-drawn-{}-ms", chart.name()), "");
    }
}

/// Every chart this overview will draw.
pub fn loaded(o: &Overview) {
    let ms = MARKS.with(|m| {
        let mut m = m.borrow_mut();
        m.expected = charts_of(o);
        (now() - m.opened_at, m.expected.is_empty())
    });
    set_body("data-load-ms", &format!("{:.1}", ms.0));
    if ms.1 {
        // Nothing to draw: the page is complete as it is.
        set_body("data-drawn-ms", &format!("{:.1}", ms.0));
    }
}

/// The report's first screen (its summary and timeline) is drawn and painted
/// (`data-first-screen-ms`), unless it is the warm-up report's.
pub fn first_screen_drawn() {
    if warming() {
        return;
    }
    let ms = MARKS.with(|m| {
        let mut m = m.borrow_mut();
        let first = !m.first_screen && m.opened_at > 0.0;
        m.first_screen = true;
        first.then(|| now() - m.opened_at)
    });
    if let Some(ms) = ms {
        mark("first screen painted");
        set_body("data-first-screen-ms", &format!("{ms:.1}"));
    }
}

/// A chart finished drawing.
pub fn drawn(chart: Chart) {
    let warm_done = WARMING.with(|w| {
        let mut w = w.borrow_mut();
        let left = w.as_mut()?;
        left.remove(&chart);
        Some(left.is_empty())
    });
    match warm_done {
        Some(true) => {
            // After this effect: the report it belongs to goes.
            if let Some(then) = WARM_DRAWN.with(|d| d.get()) {
                crate::dom::after_this_task(then);
            }
            return;
        }
        Some(false) => return,
        None => {}
    }
    mark(&format!("drawn {}", chart.name()));
    let done = MARKS.with(|m| {
        let mut m = m.borrow_mut();
        if !m.done && !m.drawn.contains(&chart) {
            // When each chart was first drawn, for the benchmark's breakdown.
            set_body(&format!("data-drawn-{}-ms", chart.name()), &format!("{:.1}", now() - m.opened_at));
        }
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

/// The worker's stages of opening the file (when each began, ms since the epoch on its clock)
/// as marks `worker: STAGE` on the page's clock, and the ms it spent reading the file as
/// `<body data-worker-read-ms>`.
pub fn worker_stages(stages: &[(String, f64)], read_ms: f64) {
    let origin = web_sys::window().and_then(|w| w.performance()).map_or(0.0, |p| p.time_origin());
    for (stage, at) in stages {
        mark_at(&format!("worker: {stage}"), at - origin);
    }
    set_body("data-worker-read-ms", &format!("{read_ms:.1}"));
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

/// A point in opening a file, `window.__mtMarks` (`[label, ms since the file was chosen]`), for
/// the benchmark's breakdown of where the time goes: kept from choosing a file until every
/// chart is drawn (not while zooming, nor for the warm-up), the list restarted per file.
pub fn mark(label: &str) {
    mark_at(label, now());
}

/// A point in opening a file, at `page_ms` on the page's clock ([`now`]).
fn mark_at(label: &str, page_ms: f64) {
    let Some(w) = web_sys::window() else { return };
    let Some(at) = MARKS.with(|m| {
        let m = m.borrow();
        (m.opened_at > 0.0 && !m.done && !warming()).then(|| page_ms - m.opened_at)
    }) else {
        return;
    };
    let key = wasm_bindgen::JsValue::from_str("__mtMarks");
    let arr = js_sys::Reflect::get(&w, &key).ok().filter(|v| v.is_object()).unwrap_or_else(|| {
        let a: wasm_bindgen::JsValue = js_sys::Array::new().into();
        let _ = js_sys::Reflect::set(&w, &key, &a);
        a
    });
    use wasm_bindgen::JsCast;
    let pair = js_sys::Array::of2(&label.into(), &at.into());
    let _ = arr.unchecked_into::<js_sys::Array>().push(&pair);
}
