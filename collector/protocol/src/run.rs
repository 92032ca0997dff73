//! The words of a run, as requests, command lines and trace children spell them: the mode
//! ([`Mode`]) and the optimizer ([`OptimizerKind`]).

use serde::{Deserialize, Serialize};

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
