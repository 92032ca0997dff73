//! Memory Tracer's wire contract, in one place: every request and answer of `collector
//! serve`'s API, every row it lists, every live event it streams, and every line its child
//! processes print. The server, the trace and import children, and the viewer all
//! (de)serialise these types, so renaming a field breaks the build rather than the page.
//!
//! Depends on `shared` only (for the trace summary); compiles for wasm32. The `openapi`
//! feature derives utoipa's schemas for the server's OpenAPI document; `clap` lets command
//! lines take the run's words ([`Mode`], [`OptimizerKind`]) as value enums.

pub mod api;
pub mod frames;
pub mod jobs;
pub mod run;
pub mod summary;
pub mod trace;
pub mod worker;

pub use api::*;
pub use jobs::{is_out_of_memory, ChildLine, FailureClass, JobRow, JobState, LiveEvent};
pub use run::{CaptureJob, Mode, ModelRun, OptimizerKind, OverheadRun, MODEL_ZOO, TORCH_VERSION};
pub use summary::SummaryJson;
pub use trace::{trace_info, ExportFile, LayerStatsBody, Origin, StoredTrace, TraceInfo, TraceResponse};
pub use worker::WorkerAnswer;

/// The viewer's questions about an open trace and their answers (`POST
/// /api/trace/{id}/explore`): the same messages its worker answers, defined with the explorer.
pub use shared::explore::{Overview, Request as ExploreRequest, Response as ExploreResponse};

/// The body of every error answer of the API.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    /// What went wrong, and where: the field and why for 422, the trace id for 404.
    pub detail: String,
}
