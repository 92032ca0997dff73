//! Memory Tracer's native tool as a library: the commands behind the `collector` binary.
//!
//! `convert`, `summary` and `analyze` need no libtorch; they read any trace format `shared`
//! imports.

pub mod analyze;
pub mod capture;
pub mod commands;
pub mod plots;
pub mod pyrun;
pub mod report;
pub mod serve;
pub mod verify;

/// The built-in models (`collector trace --model`, `POST /api/trace/memory`'s `model_name`).
pub const MODEL_ZOO: [&str; 9] = ["resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "vgg16", "transformer", "gpt", "mlp"];

/// The libtorch version the collector is built against (torch-sys refuses any other).
pub const TORCH_VERSION: &str = "2.11.0";

#[cfg(feature = "tracing")]
pub mod device;
#[cfg(feature = "tracing")]
pub mod models;
#[cfg(feature = "tracing")]
pub mod run;
#[cfg(feature = "tracing")]
pub mod sweep;
#[cfg(feature = "tracing")]
pub mod tracer;
