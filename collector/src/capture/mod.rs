//! Native capture: records from the C++ shim and their assembly into a [`shared::Trace`].
//!
//! `ffi` (the record layout), `assemble` and `live` are pure data and always built; they serve traces
//! streamed from Python processes too (`crate::pyrun`). `session` drives the shim linked into
//! this binary and needs the `tracing` feature (libtorch).

pub mod assemble;
pub mod ffi;
pub mod live;
#[cfg(feature = "tracing")]
mod session;
#[cfg(feature = "tracing")]
pub use session::*;
