//! Native capture: records from the C++ shim and their assembly into a [`shared::Trace`].
//!
//! `ffi` (the record layout), `assemble` and `live` are pure data: they serve the traces that
//! Python processes stream (`crate::pyrun`) and those `collector-capture` records in-process
//! (its `capture` module drives the shim linked into it).

pub mod assemble;
pub mod ffi;
pub mod live;
