//! Memory Tracer's native tool as a library: the commands behind the `collector` binary.
//!
//! `convert`, `summary` and `analyze` need no libtorch; they read any trace format `shared`
//! imports.

pub mod analyze;
pub mod commands;
pub mod plots;
pub mod report;

#[cfg(feature = "tracing")]
pub mod capture;
#[cfg(feature = "tracing")]
pub mod models;
#[cfg(feature = "tracing")]
pub mod device;
#[cfg(feature = "tracing")]
pub mod run;
#[cfg(feature = "tracing")]
pub mod tracer;
#[cfg(feature = "tracing")]
pub mod sweep;
