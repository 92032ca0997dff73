//! The page's state, split by who needs it:
//!
//! - [`Loader`]: what opening a trace changes (the trace shown, the progress line, the error
//!   panel, the comparison). The transport ([`crate::bridge`]) writes it as the worker or the
//!   server answers and the root component shows it; the components that open or swap traces
//!   (the header, the rank picker, the server panel) get it as a prop, to hand to the bridge.
//! - [`Theme`] (context): the colours every chart draws in, read-only.
//! - [`Errors`] (context): where any view reports a failure, write-only.
//! - [`FirstScreen`] (context): a report's first screen, which its timeline says is drawn.
//!
//! The help overlay's and the theme's switches are the root's signals, given as props to the
//! header and the overlay.

use crate::charts::Palette;
use leptos::prelude::*;
use shared::analysis::diff::TraceDiff;
use shared::explore::Overview;
use std::sync::Arc;

/// What opening a trace changes (all fields are cheap `Copy` signals).
#[derive(Clone, Copy)]
pub struct Loader {
    /// The trace shown.
    pub overview: RwSignal<Option<Arc<Overview>>>,
    /// (file name, stage) while a file is being opened.
    pub loading: RwSignal<Option<(String, String)>>,
    /// (what, message) of the last failure; the trace shown stays.
    pub error: RwSignal<Option<(String, String)>>,
    /// The worker's wasm memory in bytes (its peak: it only grows).
    pub worker_memory: RwSignal<u64>,
    /// The comparison the Compare view shows.
    pub compare: RwSignal<Option<Arc<Comparison>>>,
    /// The name in the error panel of rank files refused as recorded far apart, which merge
    /// when asked again.
    pub merge_anyway: RwSignal<Option<String>>,
    /// The name of a file too large for the page, which the server that serves it can take.
    pub offer_upload: RwSignal<Option<String>>,
    /// The worker's warm-up snapshot, drawn out of sight before any file is chosen.
    pub warmup: RwSignal<Option<Arc<Overview>>>,
}

impl Loader {
    pub fn new() -> Self {
        Self {
            overview: RwSignal::new(None),
            loading: RwSignal::new(None),
            error: RwSignal::new(None),
            worker_memory: RwSignal::new(0),
            compare: RwSignal::new(None),
            merge_anyway: RwSignal::new(None),
            offer_upload: RwSignal::new(None),
            warmup: RwSignal::new(None),
        }
    }

    /// The write end of the error panel, for [`Errors`].
    pub fn errors(&self) -> Errors {
        Errors(self.error.write_only())
    }
}

impl Default for Loader {
    fn default() -> Self {
        Self::new()
    }
}

/// Where a view reports a failure (context): the error panel shows it, and the trace shown
/// stays.
#[derive(Clone, Copy)]
pub struct Errors(WriteSignal<Option<(String, String)>>);

impl Errors {
    /// Shows `message` in the error panel, titled "Cannot open `what`".
    pub fn report(&self, what: &str, message: String) {
        self.0.set(Some((what.to_owned(), message)));
    }
}

/// The theme the charts draw in (context).
#[derive(Clone, Copy)]
pub struct Theme {
    dark: Signal<bool>,
}

impl Theme {
    pub fn new(dark: impl Into<Signal<bool>>) -> Self {
        Self { dark: dark.into() }
    }

    /// The theme's colours; read in an effect, the effect draws again when the theme changes.
    pub fn palette(&self) -> Palette {
        if self.dark.get() {
            Palette::DARK
        } else {
            Palette::LIGHT
        }
    }
}

/// A comparison the page shows: A and B by name, and their diff.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    pub a: String,
    pub b: String,
    pub diff: TraceDiff,
    /// A is the trace open on the page (so the comparison goes when another opens); false for
    /// two traces stored on the server.
    pub of_open_trace: bool,
}

/// Whether the report's first screen (the summary and the timeline, what a window shows before
/// it is scrolled) is drawn and painted: the views below it are built then. The timeline
/// tells it when it has drawn ([`FirstScreen::drawn`]).
#[derive(Clone, Copy)]
pub struct FirstScreen(RwSignal<bool>);

impl FirstScreen {
    /// The report's first screen, whose views below are built when `rest_built` turns true.
    pub fn new(rest_built: RwSignal<bool>) -> Self {
        Self(rest_built)
    }

    /// The first screen's chart is drawn (or failed to): after the frame that paints it, the
    /// rest is built.
    pub fn drawn(self) {
        if self.0.try_get_untracked() != Some(false) {
            return;
        }
        crate::dom::after_next_frame(move || self.build_rest());
    }

    /// Builds the views below the first screen, unless they are, or the report is gone.
    pub fn build_rest(self) {
        if self.0.try_get_untracked() == Some(false) {
            crate::perf::first_screen_drawn();
            self.0.set(true);
        }
    }
}
