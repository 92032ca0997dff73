//! Memory Tracer's native tool as a library: the commands behind the `collector` binary.
//!
//! Nothing here links libtorch: traces are read, analysed, converted and served, Python
//! programs traced through the shim they load, and models run in-process by the
//! `collector-capture` binary (the `capture` crate), which `collector` hands a typed job.

pub mod capture_binary;
pub mod cli;
pub mod commands;
pub mod mcp;
pub mod objects;
pub mod pyrun;
pub mod serve;
pub mod verify;
pub mod viewer_assets;
