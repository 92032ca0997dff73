//! Memory Tracer's shared core: the trace data model, importers, analyses and exporters.
//!
//! This crate compiles for native targets and `wasm32-unknown-unknown` alike and does no I/O:
//! importers take bytes or `impl Read`, exporters take `impl Write`. The collector (native) and
//! the viewer (WebAssembly) both build on it.

pub mod allocator;
pub mod analysis;
pub mod explore;
pub mod export;
pub mod hash;
pub mod import;
pub mod model;
pub mod ranks;
pub mod report;
pub mod units;
pub mod whatif;

pub use import::{import, ImportError, ImportOptions};
pub use model::{EventType, MemoryEvent, Phase, Trace};
