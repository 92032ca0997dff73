//! Native capture: records from the C++ shim and their assembly into a [`shared::Trace`].
//!
//! `assemble` and `live` are pure data (the record layout is the `record` crate's): they serve the traces that
//! Python processes stream (`crate::pyrun`) and those `collector-capture` records in-process
//! (its `capture` module drives the shim linked into it).

pub mod assemble;
pub mod live;
