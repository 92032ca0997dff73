//! Every component of the page, one per file; a file's other functions are plain view
//! helpers only its component uses. Three families have a folder each: [`live`], [`ranks`] and
//! [`compare`], the family's view in its `mod.rs`. Top to bottom as the page shows them:
//!
//! - [`app`]: the root: makes the page's state ([`crate::state`]), starts the worker, opens
//!   the trace given at start, the keyboard shortcuts and drop anywhere.
//! - [`header`]: the title bar: open a trace (or several ranks), compare, exports, theme, help.
//! - [`server_panel`]: server mode's panel (trace form, jobs, stored traces), with [`live`]
//!   (the followed trace drawn as it runs; a job's ranks in `live/picker.rs`,
//!   `live/multiples.rs` and `live/small.rs`) and [`compare::stored`] (two stored traces
//!   compared).
//! - [`progress`]: the line saying which file is opening and how far it got.
//! - [`error_panel`]: the last failure, with "Merge anyway" and "Upload to the server".
//! - [`compare`]: the Compare view around [`compare::diff`] (peaks, layers, classes,
//!   operators), whose chart is `compare/chart.rs`.
//! - [`welcome`]: the empty page. [`report`]: every view of a loaded trace, one after another:
//!   - [`oom`]: why the run ran out of memory, first when it did;
//!   - [`summary`]: peaks, counts, the importer's notes, devices, leaks;
//!   - [`ranks`]: a merged trace's ranks, with their curves (`ranks/curves.rs`) and the two
//!     most different compared (`ranks/diff.rs`);
//!   - [`timeline`]: the memory timeline (zoom, pan, hover, click for what is live);
//!   - [`active`]: the Active Memory Timeline, every allocation a band;
//!   - [`flame`]: the flame graph of memory by module path → operator → stack;
//!   - [`rank_chart`]: memory vs rank (operator order in the iteration);
//!   - [`tables`]: the layer and activation-liveness tables;
//!   - [`advice`]: what to change so the run needs less;
//!   - [`fragmentation`], [`segments`], [`pools`]: the allocator's view.
//! - [`help`]: the keyboard shortcuts overlay.
//!
//! Components read the theme ([`crate::state::Theme`]) and report failures
//! ([`crate::state::Errors`]) through context; everything else comes as props.

pub mod active;
pub mod advice;
pub mod app;
pub mod compare;
pub mod error_panel;
pub mod flame;
pub mod fragmentation;
pub mod header;
pub mod help;
pub mod live;
pub mod oom;
pub mod pools;
pub mod progress;
pub mod rank_chart;
pub mod ranks;
pub mod report;
pub mod segments;
pub mod server_panel;
pub mod summary;
pub mod tables;
pub mod timeline;
pub mod welcome;

pub use app::App;
