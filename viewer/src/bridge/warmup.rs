//! The hidden warm-up report: the worker answers a small snapshot as soon as it starts
//! ([`crate::messages::ToPage::Warmup`]), which the page draws out of sight a few times so the
//! wasm a file's first report runs is already optimised; a file opened first ends it.

use crate::dom::after_this_task;
use crate::perf;
use crate::state::Loader;
use leptos::prelude::*;
use shared::explore::Overview;
use std::sync::Arc;

thread_local! {
    /// The page's loader, for the warm-up, which the worker starts rather than a component.
    static LOADER: std::cell::Cell<Option<Loader>> = const { std::cell::Cell::new(None) };
}

/// Keeps `loader` for the warm-up ([`begin_warmup`]); the root component calls it once.
pub fn keep_loader(loader: Loader) {
    LOADER.with(|s| s.set(Some(loader)));
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
    perf::begin_warmup(&overview, warmup_drawn);
    loader.warmup.set(Some(overview));
}

/// The warm-up report is drawn (its next round follows, after this task) or a file was chosen
/// (the warm-up ends).
fn warmup_drawn() {
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
    super::forget_warmup_requests();
    if let Some(loader) = LOADER.with(|s| s.get()) {
        loader.warmup.set(None);
    }
    after_this_task(move || draw_warmup(overview));
}

/// Removes the warm-up report; its requests still in flight are forgotten.
pub fn end_warmup() {
    WARMUP.with(|w| w.borrow_mut().take());
    if perf::warming() {
        super::note_chart_widths();
    }
    perf::end_warmup();
    super::forget_warmup_requests();
    if let Some(loader) = LOADER.with(|s| s.get()) {
        if loader.warmup.with_untracked(Option::is_some) {
            loader.warmup.set(None);
        }
    }
}
