//! Memory Tracer's native tool as a library: the commands behind the `collector` binary.
//!
//! `convert` and `summary` need no libtorch; they read any trace format `shared` imports.

pub mod commands;
