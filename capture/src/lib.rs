//! Memory Tracer's in-process capture: the built-in and TorchScript models run through
//! libtorch (tch) with the C++ shim linked in, recorded by a [`session::Session`], assembled
//! by `record::assemble`. What `collector trace --model`, `sweep` and
//! `overhead` run (the `collector-capture` binary), and the Rust `MemoryTracer` API
//! ([`tracer`]). The only crate of the workspace that links libtorch.

pub mod cli;
pub mod models;
pub mod run;
pub mod session;
pub use record::sys as shim;
pub mod sweep;
pub mod tracer;
