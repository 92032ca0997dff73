//! Trace jobs on the wire: the lines a trace child prints ([`ChildLine`],
//! `collector trace --progress-json`), the events a job's followers receive ([`LiveEvent`],
//! Server-Sent Events), the job list's rows, and why a trace failed ([`FailureClass`]).

use crate::trace::{TraceInfo, TraceResponse};
use serde::{Deserialize, Serialize};

/// One line of `collector trace --progress-json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ChildLine {
    Started {
        iterations: u32,
    },
    Iteration {
        done: u32,
        of: u32,
        seconds: f64,
    },
    /// `[ns since start, allocated, reserved]`; `rank`: whose, in a torchrun job.
    Memory {
        points: Vec<[u64; 3]>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rank: Option<u32>,
    },
    Done {
        info: TraceInfo,
    },
    /// The run failed; `class` says how.
    Error {
        class: FailureClass,
        detail: String,
    },
}

/// What followers of a job receive (the SSE event name is `kind`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LiveEvent {
    Status {
        state: JobState,
        device: String,
        model: String,
    },
    Started {
        iterations: u32,
    },
    Iteration {
        done: u32,
        of: u32,
        seconds: f64,
    },
    /// `rank`: whose, in a torchrun job (each rank's points come separately).
    Memory {
        points: Vec<[u64; 3]>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rank: Option<u32>,
    },
    Done {
        trace: TraceResponse,
    },
    /// Named `failed`, not `error`: EventSource reserves `error` for its own connection errors.
    Failed {
        status: u16,
        detail: String,
    },
}

impl LiveEvent {
    pub fn kind(&self) -> &'static str {
        match self {
            LiveEvent::Status { .. } => "status",
            LiveEvent::Started { .. } => "started",
            LiveEvent::Iteration { .. } => "iteration",
            LiveEvent::Memory { .. } => "memory",
            LiveEvent::Done { .. } => "done",
            LiveEvent::Failed { .. } => "failed",
        }
    }

    pub fn is_terminal(&self) -> bool {
        matches!(self, LiveEvent::Done { .. } | LiveEvent::Failed { .. })
    }
}

/// Where a job is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Queued,
    Running,
    Done,
    Failed,
}

impl JobState {
    /// The name on the wire (`queued`, `running`, `done`, `failed`).
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Done => "done",
            JobState::Failed => "failed",
        }
    }
}

/// A row of `GET /api/jobs`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobRow {
    pub trace_id: String,
    pub state: JobState,
    pub model_name: String,
    pub device: String,
    pub iterations_done: u32,
    pub iterations: u32,
    /// Seconds since the request.
    pub age_s: f64,
    /// Why it failed.
    pub error: Option<String>,
    /// Ranks of a distributed job (1: one process).
    pub world_size: u32,
    /// `ddp` or `fsdp` for a distributed job.
    pub strategy: Option<String>,
}

/// Why a trace child failed (`ChildLine::Error`'s `class`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum FailureClass {
    /// CUDA was asked for and there is none.
    NoCuda,
    /// The request or the command line is wrong (a shape, a flag, a file).
    Invalid,
    /// The device ran out of memory.
    OutOfMemory,
    /// The model failed (libtorch raised, a TorchScript file is unusable).
    Model,
    /// The collector itself failed.
    Internal,
}

impl FailureClass {
    /// The class of a libtorch error message: out of memory when it says so (CUDA's and the
    /// CPU allocator's wording), else a model failure.
    pub fn of_torch_error(message: &str) -> Self {
        if is_out_of_memory(message) {
            Self::OutOfMemory
        } else {
            Self::Model
        }
    }
}

/// Whether a libtorch or Python error message says the allocator ran out of memory (CUDA's
/// caching allocator or the CPU's).
pub fn is_out_of_memory(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("out of memory")
        || m.contains("not enough memory")
        || m.contains("can't allocate memory")
        || m.contains("cannot allocate memory")
        || m.contains("outofmemoryerror")
}
