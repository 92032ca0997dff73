//! Traces the server runs itself (`POST /api/trace/memory`, checked against its caps and
//! devices), its job list and its health.

use super::super::error::{ApiError, ApiJson};
use super::super::jobs::{Distributed, JobSpec};
use super::super::state::AppState;
use super::field;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use protocol::*;
use std::sync::Arc;

/// A trace request checked against the server's caps and devices.
trait Validate {
    /// Checks the fields against the server's caps; returns the job to run.
    fn validate(&self, state: &AppState) -> Result<JobSpec, ApiError>;
    /// The distributed part of the job, when `world_size` asks for one.
    fn distributed(&self, state: &AppState, torchscript: bool, device: &str) -> Result<Option<Distributed>, ApiError>;
}

impl Validate for TraceRequest {
    fn validate(&self, state: &AppState) -> Result<JobSpec, ApiError> {
        let caps = &state.config.caps;
        let torchscript = if super::super::jobs::MODELS.contains(&self.model_name.as_str()) {
            None
        } else {
            match state.torchscript_model(&self.model_name) {
                Some(p) => Some(p),
                None => {
                    return Err(field(
                        "model_name",
                        format!("unknown model `{}`; expected one of: {}", self.model_name, state.model_names().join(", ")),
                    ))
                }
            }
        };
        if torchscript.is_some() && self.input_shape.is_none() {
            return Err(field(
                "input_shape",
                format!("`{}` is a TorchScript model: give its full input shape, batch first", self.model_name),
            ));
        }
        if let Some(b) = self.batch_size {
            if !(1..=caps.max_batch_size).contains(&b) {
                return Err(field("batch_size", format!("must be between 1 and {}, got {b}", caps.max_batch_size)));
            }
        }
        let mut shape = None;
        if let (None, Some(b), Some(default)) = (&self.input_shape, self.batch_size, protocol::run::default_shape(&self.model_name)) {
            // The model's own shape with the batch replaced: capped like a given shape.
            let elements = default.iter().skip(1).try_fold(b as u64, |acc, &d| acc.checked_mul(d as u64));
            if elements.is_none_or(|n| n > caps.max_input_elements) {
                let mut full = default.to_vec();
                full[0] = b;
                return Err(field(
                    "batch_size",
                    format!(
                        "`{}`'s input at this batch size ({full:?}) is over this server's cap of {} elements",
                        self.model_name, caps.max_input_elements
                    ),
                ));
            }
        }
        if let Some(s) = &self.input_shape {
            if s.len() < 2 || s.len() > 8 {
                return Err(field("input_shape", format!("the full input shape, batch first: 2 to 8 dimensions, got {}", s.len())));
            }
            if let Some(d) = s.iter().find(|&&d| d < 1) {
                return Err(field("input_shape", format!("every dimension must be at least 1, got {d}")));
            }
            let mut full = s.clone();
            if let Some(b) = self.batch_size {
                full[0] = b;
            }
            let elements = full.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d as u64));
            match elements {
                Some(n) if n <= caps.max_input_elements => {}
                _ => {
                    return Err(field(
                        "input_shape",
                        format!("the input ({full:?}) is over this server's cap of {} elements", caps.max_input_elements),
                    ))
                }
            }
            shape = Some(full);
        }
        if !(1..=caps.max_events).contains(&self.max_events) {
            return Err(field("max_events", format!("must be between 1 and {}, got {}", caps.max_events, self.max_events)));
        }
        let iterations = self.iterations.unwrap_or(3);
        if !(1..=caps.max_iterations).contains(&iterations) {
            return Err(field("iterations", format!("must be between 1 and {}, got {iterations}", caps.max_iterations)));
        }
        let mode = self.mode.as_deref().unwrap_or("train");
        if !matches!(mode, "train" | "infer") {
            return Err(field("mode", format!("expected `train` or `infer`, got `{mode}`")));
        }
        let device = match self.device.as_deref() {
            None => state.device.clone(),
            Some(d) => device::parse(d).map_err(|e| field("device", e))?,
        };
        state.check_device(&device)?;
        let optimizer = self.optimizer.clone().unwrap_or_else(|| "sgd".into());
        if !matches!(optimizer.as_str(), "sgd" | "adam" | "adamw") {
            return Err(field("optimizer", format!("expected `sgd`, `adam` or `adamw`, got `{optimizer}`")));
        }
        let distributed = self.distributed(state, torchscript.is_some(), &device)?;
        Ok(JobSpec {
            model: self.model_name.clone(),
            torchscript,
            input_shape: shape,
            batch_size: if self.input_shape.is_none() { self.batch_size } else { None },
            device,
            mode: mode.to_owned(),
            iterations,
            max_events: self.max_events,
            fragmentation: self.enable_fragmentation,
            optimizer,
            distributed,
        })
    }

    /// The torchrun job a request with `world_size` ≥ 2 asks for.
    fn distributed(&self, state: &AppState, torchscript: bool, device: &str) -> Result<Option<Distributed>, ApiError> {
        let world = self.world_size.unwrap_or(1);
        let max = state.config.caps.max_world_size;
        if world < 1 || world > max {
            return Err(field("world_size", format!("must be between 1 and {max}, got {world}")));
        }
        if world == 1 {
            return match &self.strategy {
                Some(_) => Err(field("strategy", "needs `world_size` of 2 or more")),
                None => Ok(None),
            };
        }
        if torchscript {
            return Err(field(
                "world_size",
                format!("`{}` is a TorchScript model; distributed runs take built-in models", self.model_name),
            ));
        }
        let strategy = self.strategy.clone().unwrap_or_else(|| "ddp".into());
        if !matches!(strategy.as_str(), "ddp" | "fsdp") {
            return Err(field("strategy", format!("expected `ddp` or `fsdp`, got `{strategy}`")));
        }
        if device.starts_with("cuda") && world > state.cuda_devices {
            return Err(ApiError::unavailable(format!(
                "world_size {world} on CUDA needs {world} devices (one per rank); this server has {}",
                state.cuda_devices
            )));
        }
        Ok(Some(Distributed { world_size: world, strategy, python: state.config.python.clone() }))
    }
}

/// Trace a model now, and store the trace.
///
/// Waits for the trace unless `?wait=false` (then answers 202 with the trace id; follow
/// `/api/trace/{id}/events`). Jobs run one per device at a time (`--jobs-per-device`) in a
/// bounded queue.
#[utoipa::path(post, path = "/api/trace/memory", tag = "tracing", params(WaitQuery), request_body = TraceRequest, responses(
    (status = 200, description = "The trace is stored", body = TraceResponse),
    (status = 202, description = "Queued (`?wait=false`)", body = JobAccepted),
    (status = 401, description = "Missing or wrong token", body = ErrorBody),
    (status = 422, description = "Invalid field, or the model failed (out of memory, bad shape)", body = ErrorBody),
    (status = 429, description = "The job queue is full; see Retry-After", body = ErrorBody),
    (status = 503, description = "CUDA asked for and not available, or tracing not built in", body = ErrorBody),
))]
pub async fn trace_memory(
    State(state): State<Arc<AppState>>,
    Query(q): Query<WaitQuery>,
    ApiJson(req): ApiJson<TraceRequest>,
) -> Result<Response, ApiError> {
    let spec = req.validate(&state)?;
    let id = state.store.new_id();
    let job = state.jobs.submit(id.clone(), spec)?;
    if q.wait == Some(false) {
        let accepted = JobAccepted {
            events_url: format!("/api/trace/{id}/events"),
            trace_url: format!("/api/trace/{id}"),
            trace_id: id,
            status: "queued".into(),
        };
        return Ok((StatusCode::ACCEPTED, axum::Json(accepted)).into_response());
    }
    let done = job.wait().await?;
    Ok(axum::Json(done).into_response())
}

/// Queues a trace as `POST /api/trace/memory?wait=false` does; returns its id.
pub fn start_job(state: &Arc<AppState>, req: TraceRequest) -> Result<String, ApiError> {
    let spec = req.validate(state)?;
    let id = state.store.new_id();
    state.jobs.submit(id.clone(), spec)?;
    Ok(id)
}

/// Trace jobs queued, running, and recently finished.
#[utoipa::path(get, path = "/api/jobs", tag = "tracing", responses((status = 200, body = JobsResponse), (status = 401, body = ErrorBody)))]
pub async fn jobs(State(state): State<Arc<AppState>>) -> axum::Json<JobsResponse> {
    let (running, queued) = state.jobs.counts();
    axum::Json(JobsResponse { jobs: state.jobs.rows(), running, queued })
}

/// Server health: device, version, CUDA, jobs and store.
#[utoipa::path(get, path = "/api/health", tag = "server", responses((status = 200, body = HealthResponse), (status = 401, body = ErrorBody)))]
pub async fn health(State(state): State<Arc<AppState>>) -> axum::Json<HealthResponse> {
    let (running, queued) = state.jobs.counts();
    let (traces, bytes) = state.store.usage();
    axum::Json(HealthResponse {
        status: "healthy".into(),
        device: state.device.clone(),
        version: env!("CARGO_PKG_VERSION").into(),
        cuda_available: state.cuda_devices > 0,
        cuda_device_count: state.cuda_devices,
        tracing_available: state.tracing,
        torch_version: state.tracing.then(|| super::super::state::TORCH_VERSION.to_owned()),
        jobs_running: running,
        jobs_queued: queued,
        stored_traces: traces,
        store_bytes: bytes,
        models: state.model_names(),
    })
}
