//! Memory Tracer's native tool as a library: the commands behind the `collector` binary.
//!
//! Nothing here links libtorch: traces are read, analysed, converted and served, Python
//! programs traced through the shim they load, and models run in-process by the
//! `collector-capture` crate (`collector/capture`), which builds on this one.

pub mod analyze;
pub mod capture;
pub mod cli;
pub mod commands;
pub mod device;
pub mod plots;
pub mod pyrun;
pub mod read_ahead;
pub mod report;
pub mod serve;
pub mod verify;

/// The built-in models (`collector trace --model`, `POST /api/trace/memory`'s `model_name`).
pub const MODEL_ZOO: [&str; 9] = ["resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "vgg16", "transformer", "gpt", "mlp"];

/// The libtorch version `collector-capture` (built-in models, TorchScript) links (torch-sys
/// refuses any other). Traced Python programs may run any supported torch (`record`).
pub const TORCH_VERSION: &str = "2.11.0";
