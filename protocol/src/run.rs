//! The words of a run, as requests, command lines and trace children spell them: the mode
//! ([`Mode`]), the optimizer ([`OptimizerKind`]), the built-in models ([`MODEL_ZOO`]); and the
//! run of a built-in or TorchScript model ([`ModelRun`]) that `collector` hands to
//! `collector-capture` as one [`CaptureJob`] (the flags are `collector`'s, with the `clap`
//! feature, so one definition serves the command line and the handoff).

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The built-in models (`collector trace --model`, `POST /api/trace/memory`'s `model_name`).
pub const MODEL_ZOO: [&str; 9] = ["resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "vgg16", "transformer", "gpt", "mlp"];

/// The libtorch version `collector-capture` (built-in models, TorchScript) links (torch-sys
/// refuses any other). Traced Python programs may run any supported torch (`record`).
pub const TORCH_VERSION: &str = "2.11.0";

/// A built-in model's input shape, batch first, when none is given (what the server checks
/// requests against without loading libtorch; `capture/tests/shapes.rs` checks the models
/// agree).
pub fn default_shape(model: &str) -> Option<&'static [i64]> {
    Some(match model {
        "resnet18" | "resnet34" | "resnet50" | "resnet101" | "resnet152" | "vgg16" => &[8, 3, 224, 224],
        "transformer" => &[8, 512],
        "gpt" => &[8, 1024],
        "mlp" => &[64, 784],
        _ => return None,
    })
}

/// What to run: the model, its input and the loop (`collector trace --model`, `sweep`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct ModelRun {
    /// A built-in model: resnet18, resnet34, resnet50, resnet101, resnet152, vgg16,
    /// transformer, gpt, mlp.
    #[cfg_attr(feature = "clap", arg(long, default_value = "resnet18"))]
    pub model: String,
    /// Trace a TorchScript model file (torch.jit.script/trace + save) instead of a built-in one.
    #[cfg_attr(feature = "clap", arg(long, value_name = "FILE"))]
    pub torchscript: Option<PathBuf>,
    /// The full input shape, batch first: 8,3,224,224 (images), 8,512 (tokens), 64,784 (mlp).
    #[cfg_attr(feature = "clap", arg(long, value_delimiter = ',', num_args = 1..))]
    pub input_shape: Option<Vec<i64>>,
    /// Replaces the first dimension of the input shape.
    #[cfg_attr(feature = "clap", arg(long))]
    pub batch_size: Option<i64>,
    /// train (forward, backward, optimizer) or infer.
    #[cfg_attr(feature = "clap", arg(long, value_enum, default_value_t = Mode::Train))]
    pub mode: Mode,
    /// sgd (momentum 0.9), adam or adamw.
    #[cfg_attr(feature = "clap", arg(long, value_enum, default_value_t = OptimizerKind::Sgd))]
    pub optimizer: OptimizerKind,
    /// Learning rate.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 0.01))]
    pub lr: f64,
    /// Iterations to run (the first one warms the caching allocator up).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 3))]
    pub iterations: u32,
    /// Mixed precision (autocast) on CUDA.
    #[cfg_attr(feature = "clap", arg(long))]
    pub amp: bool,
    /// cpu, cuda or cuda:N. Default: the first GPU if there is one, else the CPU.
    #[cfg_attr(feature = "clap", arg(long))]
    pub device: Option<String>,
    /// Allocations and frees to keep (operators are bounded alike); later ones are dropped
    /// and counted.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 5_000_000))]
    pub max_events: u64,
    /// Do not track fragmentation (reported as 0, as the MemoryTracer API does).
    #[cfg_attr(feature = "clap", arg(long))]
    pub no_fragmentation: bool,
    /// Do not record operator input/output tensors (less overhead, no liveness analysis).
    #[cfg_attr(feature = "clap", arg(long))]
    pub no_tensors: bool,
    /// Record allocations, frees and layer scopes only, no operators (least overhead;
    /// backward memory is then attributed to phases, not layers).
    #[cfg_attr(feature = "clap", arg(long))]
    pub memory_only: bool,
    /// Transformer/GPT blocks or MLP hidden layers.
    #[cfg_attr(feature = "clap", arg(long))]
    pub layers: Option<i64>,
    /// Transformer/GPT/MLP width.
    #[cfg_attr(feature = "clap", arg(long))]
    pub width: Option<i64>,
    /// Attention heads.
    #[cfg_attr(feature = "clap", arg(long))]
    pub heads: Option<i64>,
    /// Vocabulary size (transformer, gpt).
    #[cfg_attr(feature = "clap", arg(long))]
    pub vocab: Option<i64>,
    /// Output classes (classifiers).
    #[cfg_attr(feature = "clap", arg(long))]
    pub classes: Option<i64>,
    /// Random seed.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 0))]
    pub seed: i64,
}

/// The overhead benchmark's run (`collector overhead`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[serde(deny_unknown_fields)]
pub struct OverheadRun {
    #[cfg_attr(feature = "clap", arg(long, default_value = "resnet50"))]
    pub model: String,
    /// The full input shape, batch first.
    #[cfg_attr(feature = "clap", arg(long, value_delimiter = ',', num_args = 1..))]
    pub input_shape: Option<Vec<i64>>,
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 32))]
    pub batch_size: i64,
    /// Steps of each kind (traced, untraced).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 20))]
    pub steps: u32,
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 5))]
    pub warmup: u32,
    /// cpu, cuda or cuda:N. Default: the first GPU if there is one, else the CPU.
    #[cfg_attr(feature = "clap", arg(long))]
    pub device: Option<String>,
    /// Do not record operator tensors.
    #[cfg_attr(feature = "clap", arg(long))]
    pub no_tensors: bool,
    /// Record allocations and frees only (no operator callback).
    #[cfg_attr(feature = "clap", arg(long))]
    pub memory_only: bool,
}

/// What `collector` hands `collector-capture` (as JSON, its one argument after `--job`): the
/// commands that run a model through libtorch in-process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case", deny_unknown_fields)]
pub enum CaptureJob {
    /// `collector trace --model`/`--torchscript`.
    Trace {
        run: ModelRun,
        /// The output file; default `<model or TorchScript file stem>.mtrace.json`.
        output: Option<PathBuf>,
        /// The export format's name; default from the output file name.
        format: Option<String>,
        /// How many layers the summary lists.
        top: usize,
        /// No progress bar.
        quiet: bool,
        /// Progress, live totals, the result and errors as [`crate::ChildLine`]s on stdout.
        progress_json: bool,
    },
    /// `collector sweep`.
    Sweep {
        run: ModelRun,
        /// Batch sizes to run, in order.
        batch_sizes: Vec<u64>,
        /// The folder for the traces, CSV, JSON and charts.
        output: PathBuf,
    },
    /// `collector overhead`.
    Overhead(OverheadRun),
}

/// Train (forward, backward, optimizer step) or infer (forward without autograd).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Train,
    #[cfg_attr(feature = "clap", value(alias = "inference", alias = "eval"))]
    Infer,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Train => "train",
            Mode::Infer => "infer",
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "train" => Ok(Mode::Train),
            "infer" | "inference" | "eval" => Ok(Mode::Infer),
            _ => Err(format!("unknown mode `{s}`; expected train or infer")),
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The optimizer of training runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum OptimizerKind {
    /// SGD with momentum 0.9.
    Sgd,
    Adam,
    Adamw,
}

impl OptimizerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            OptimizerKind::Sgd => "sgd",
            OptimizerKind::Adam => "adam",
            OptimizerKind::Adamw => "adamw",
        }
    }
}

impl std::str::FromStr for OptimizerKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sgd" => Ok(Self::Sgd),
            "adam" => Ok(Self::Adam),
            "adamw" => Ok(Self::Adamw),
            _ => Err(format!("unknown optimizer `{s}`; expected sgd, adam or adamw")),
        }
    }
}

impl std::fmt::Display for OptimizerKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
