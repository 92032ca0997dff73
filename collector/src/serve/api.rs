//! The HTTP API: request and answer types, and one handler per route. The OpenAPI document
//! (`docs.rs`) is derived from the `#[utoipa::path]` attributes here.

use super::error::{ApiError, ApiJson};
use super::fault::{blocking, Fault};
use super::jobs::{Distributed, Job, JobEvent, JobSpec, NodeEnd, NodeProgress};
use super::state::AppState;
use super::store::StoreError;
use axum::body::Body;
use axum::extract::{FromRequest, Path, Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use protocol::*;
use std::sync::Arc;

/// Stored trace `id`, read off the runtime (a bucket store asks the bucket); 404 when there is
/// none.
async fn find_stored(state: &Arc<AppState>, id: &str) -> Result<StoredTrace, ApiError> {
    let (st, id) = (state.clone(), id.to_owned());
    blocking(move || st.store.get(&id).map_err(ApiError::from)).await
}

/// `POST /api/trace/live`: registers a trace recorded outside the server; followers of
/// `/api/trace/{id}/events` see what its recorder posts to `/api/trace/live/{id}`, and it ends
/// when the recorder uploads the trace with `?trace_id={id}` (or posts an `error` line).
///
/// With `job` (a run of several nodes, each its own `collector trace --serve`): joins the
/// running live trace of that job (the same `trace_id` is answered), else starts it. Each
/// node uploads its part with `?trace_id={id}&node={node_rank}`; once every node's part (or
/// error) came, or `node_wait_s` after the first did, the parts' ranks are merged into the
/// one stored trace, the absent nodes' ranks named as missing.
#[utoipa::path(post, path = "/api/trace/live", tag = "tracing", request_body = LiveRequest,
    responses((status = 202, body = JobAccepted), (status = 422, body = ErrorBody)))]
pub async fn live_start(
    State(state): State<Arc<AppState>>,
    ApiJson(req): ApiJson<LiveRequest>,
) -> Result<(StatusCode, axum::Json<JobAccepted>), ApiError> {
    let short = |v: &str| !v.is_empty() && v.len() <= 200 && !v.chars().any(char::is_control);
    if !short(&req.model_name) {
        return Err(field("model_name", "1 to 200 printable characters"));
    }
    let device = req.device.unwrap_or_else(|| "external".into());
    if !short(&device) {
        return Err(field("device", "1 to 200 printable characters"));
    }
    let id = match req.job {
        Some(name) => {
            if !short(&name) {
                return Err(field("job", "1 to 200 printable characters"));
            }
            let nnodes = req.nnodes.unwrap_or(1);
            if !(1..=MAX_NODES).contains(&nnodes) {
                return Err(field("nnodes", format!("must be between 1 and {MAX_NODES}, got {nnodes}")));
            }
            let node_rank = req.node_rank.unwrap_or(0);
            if node_rank >= nnodes {
                return Err(field("node_rank", format!("must be between 0 and {} (nnodes {nnodes}), got {node_rank}", nnodes - 1)));
            }
            let max_wait = state.config.job_timeout.as_secs();
            let wait_s = req.node_wait_s.unwrap_or(DEFAULT_NODE_WAIT_S).min(max_wait);
            let wait = std::time::Duration::from_secs(wait_s);
            state.jobs.external_node(name, nnodes, node_rank, wait, req.model_name, device)?.id().to_owned()
        }
        None => {
            let id = state.store.new_id();
            state.jobs.external(id.clone(), req.model_name, device);
            id
        }
    };
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(JobAccepted {
            events_url: format!("/api/trace/{id}/events"),
            trace_url: format!("/api/trace/{id}"),
            trace_id: id,
            status: "running".into(),
        }),
    ))
}

/// Most nodes one live trace gathers.
const MAX_NODES: u32 = 4096;

/// How long the other nodes of a live trace are waited for, once the first node's part or
/// failure came, unless the request says.
const DEFAULT_NODE_WAIT_S: u64 = 300;

/// `POST /api/trace/live/{trace_id}`: one progress line of a live trace, as
/// `collector trace --progress-json` prints them (`{"kind": "memory", "points": [[ns,
/// allocated, reserved], ...]}`, `started`, `iteration`, or `error` to end it). In a live trace
/// of several nodes an `error` line with `?node=K` ends that node's part only.
#[utoipa::path(post, path = "/api/trace/live/{trace_id}", tag = "tracing", params(("trace_id" = String, Path), LiveLineQuery),
    responses((status = 200, body = LiveAccepted), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn live_event(
    State(state): State<Arc<AppState>>,
    Path(trace_id): Path<String>,
    Query(q): Query<LiveLineQuery>,
    ApiJson(line): ApiJson<ChildLine>,
) -> Result<axum::Json<LiveAccepted>, ApiError> {
    let job = state.jobs.external_job(&trace_id).ok_or_else(|| ApiError::trace_not_found(&trace_id))?;
    if let ChildLine::Memory { points, .. } = &line {
        if points.len() > MAX_LIVE_POINTS {
            return Err(field("points", format!("at most {MAX_LIVE_POINTS} per line, got {}", points.len())));
        }
    }
    let status = if matches!(line, ChildLine::Error { .. }) { "failed" } else { "running" };
    match line {
        ChildLine::Error { detail, .. } if job.is_multi_node() => {
            let node = q.node.ok_or_else(|| field("node", "this live trace gathers several nodes: say which node failed (`?node=K`)"))?;
            let progress = job.node_end(node, NodeEnd::Failed(detail))?;
            let (st, j) = (state.clone(), job.clone());
            // The node's failure may complete the job: the merge runs without this answer waiting.
            tokio::spawn(async move {
                let _ = after_node_end(&st, &j, node, progress).await;
            });
        }
        line => state.jobs.external_line(job, line),
    }
    Ok(axum::Json(LiveAccepted { trace_id, status: status.into() }))
}

/// After node `node` of a live trace of several nodes ended: merges the parts when it was the
/// last (the stored trace's answer), else starts the wait for the others when it was the first
/// and answers that the part is kept (202).
async fn after_node_end(state: &Arc<AppState>, job: &Arc<Job>, node: u32, progress: NodeProgress) -> Result<Response, ApiError> {
    if progress.complete {
        let stored = merge_nodes(state, job.clone()).await?;
        return Ok(axum::Json(stored).into_response());
    }
    if progress.first {
        let (st, j, wait) = (state.clone(), job.clone(), progress.wait);
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            if j.claim_merge().is_some() {
                let _ = merge_nodes(&st, j).await;
            }
        });
    }
    let accepted = NodePartAccepted {
        trace_id: job.id().to_owned(),
        node,
        status: "waiting".into(),
        waiting_for: progress.waiting_for,
        wait_s: progress.wait.as_secs(),
    };
    Ok((StatusCode::ACCEPTED, axum::Json(accepted)).into_response())
}

/// Merges the parts of a live trace of several nodes (its merge claimed) into one trace in a
/// worker, stores it and ends the job with it (or with why not); the parts are removed.
async fn merge_nodes(state: &Arc<AppState>, job: Arc<Job>) -> Result<TraceResponse, Fault> {
    let parts = job.node_parts()?;
    // The label carries the part's name: a part of one process may say its rank only there.
    let files: Vec<(std::path::PathBuf, String)> =
        parts.parts.iter().map(|(k, (file, name))| (file.clone(), format!("node{k} ({})", name.replace('=', "_")))).collect();
    let absent = parts.absent();
    let name = parts.parts.values().next().map(|(_, name)| name.clone());
    let out = state.store.temp_path(&format!("{}.merged.mtrace.json", job.id()));
    let merged = async {
        if files.is_empty() {
            return Err(Fault::Rejected(format!("no node of job {} sent its part: {}", parts.job, absent.join("; "))));
        }
        let reason = if absent.is_empty() {
            "no node's part has it (its process streamed no trace on its node)".to_owned()
        } else {
            format!("no node's part has it ({})", absent.join("; "))
        };
        let slot = state.isolation.slot().await?;
        let info = state.isolation.merge(&slot, &files, &out, &reason, &absent, state.config.max_decompressed_bytes).await?;
        let (st, id, out) = (state.clone(), job.id().to_owned(), out.clone());
        blocking(move || {
            let (stored, evicted) = st.store.insert(&id, Origin::Uploaded, name, &out, ".mtrace.json", info).map_err(|e| match e {
                StoreError::TooLarge { .. } => Fault::Rejected(e.to_string()),
                e @ StoreError::Backend(_) => Fault::from(e),
                e => Fault::internal("cannot store the merged trace", e),
            })?;
            for e in &evicted {
                st.jobs.forget(e);
                st.sessions.forget(e);
            }
            Ok(TraceResponse::from(&stored))
        })
        .await
    }
    .await;
    for (file, _) in &files {
        let _ = tokio::fs::remove_file(file).await;
    }
    if merged.is_err() {
        let _ = tokio::fs::remove_file(&out).await;
    }
    state.jobs.external_end(job, merged.clone());
    merged
}

/// `GET /api/trace/{trace_id}/leaks`: growth of allocated memory across iterations after
/// warm-up and the allocations never freed, by layer and frame (`collector leaks --json`).
#[utoipa::path(get, path = "/api/trace/{trace_id}/leaks", tag = "traces", params(("trace_id" = String, Path)),
    responses((status = 200, description = "The leak report, as `collector leaks --json`"), (status = 404, body = ErrorBody)))]
pub async fn leaks(
    State(state): State<Arc<AppState>>,
    Path(trace_id): Path<String>,
) -> Result<axum::Json<shared::analysis::leaks::LeakReport>, ApiError> {
    let stored = find_stored(&state, &trace_id).await?;
    // Stored traces load in-process (they passed the limited import), a bounded number at once.
    let slot = state.isolation.slot().await?;
    let st = state.clone();
    let report = blocking(move || -> Result<_, ApiError> {
        let _slot = slot;
        let trace = st.load(&stored)?;
        Ok(shared::analysis::leaks::leaks(&trace, 20))
    })
    .await?;
    Ok(axum::Json(report))
}

/// `POST /api/trace/diff`: two stored traces compared (`collector diff --json`): each side's
/// peak and when, the change, layers by change, classes, operators on one side only, the
/// Compare chart's two curves, and notes.
#[utoipa::path(post, path = "/api/trace/diff", tag = "traces", request_body = DiffRequest,
    responses((status = 200, description = "The diff, as `collector diff --json`"), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn trace_diff(
    State(state): State<Arc<AppState>>,
    ApiJson(req): ApiJson<DiffRequest>,
) -> Result<axum::Json<shared::analysis::diff::TraceDiff>, ApiError> {
    let find = |id: String, name: &'static str| {
        let st = state.clone();
        blocking(move || {
            st.store.get(&id).map_err(|e| match e {
                StoreError::NotFound(_) => ApiError::new(StatusCode::NOT_FOUND, format!("Trace {id} not found (field `{name}`)")),
                e => ApiError::from(e),
            })
        })
    };
    let (a, b) = (find(req.a.clone(), "a").await?, find(req.b.clone(), "b").await?);
    let slot = state.isolation.slot().await?;
    let st = state.clone();
    let diff = blocking(move || -> Result<_, ApiError> {
        let _slot = slot;
        let ta = st.load(&a)?;
        let tb = if req.b == req.a { None } else { Some(st.load(&b)?) };
        shared::analysis::diff::diff_devices(&ta, req.device_a, tb.as_ref().unwrap_or(&ta), req.device_b).map_err(|e| {
            let shared::analysis::diff::DiffError::NoSuchDevice { side, .. } = &e;
            field(if *side == shared::analysis::diff::Side::A { "device_a" } else { "device_b" }, e)
        })
    })
    .await?;
    Ok(axum::Json(diff))
}

fn field(name: &str, why: impl std::fmt::Display) -> ApiError {
    ApiError::unprocessable(format!("field `{name}`: {why}"))
}

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
        let torchscript = if super::jobs::MODELS.contains(&self.model_name.as_str()) {
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

/// Export a stored trace (speedscope, timeline, Chrome/Perfetto, CSV, native, DFTracer).
#[utoipa::path(post, path = "/api/trace/export", tag = "traces", request_body = ExportRequest, responses(
    (status = 200, body = ExportResponse),
    (status = 401, body = ErrorBody),
    (status = 404, description = "Unknown trace", body = ErrorBody),
    (status = 422, description = "Unknown format", body = ErrorBody),
    (status = 429, description = "Too many imports and exports at once; see Retry-After", body = ErrorBody),
))]
pub async fn trace_export(
    State(state): State<Arc<AppState>>,
    ApiJson(req): ApiJson<ExportRequest>,
) -> Result<axum::Json<ExportResponse>, ApiError> {
    use shared::export::ExportFormat;
    let format = ExportFormat::from_name(&req.format).ok_or_else(|| {
        let names: Vec<&str> = ExportFormat::ALL.iter().map(|f| f.name()).collect();
        field("format", format!("unknown format `{}`; expected one of: {}", req.format, names.join(", ")))
    })?;
    let stored = find_stored(&state, &req.trace_id).await?;
    let name = format.name();
    let (st, id) = (state.clone(), stored.trace_id.clone());
    let existing = blocking(move || st.store.existing_export(&id, name).map_err(ApiError::from)).await?;
    let export = match existing {
        Some(e) => e,
        None => {
            // Written by a child process with a memory limit, as uploads are read.
            let slot = state.isolation.slot().await?;
            let file = super::store::Store::export_name(&stored.trace_id, format.extension());
            let tmp = state.store.temp_path(&file);
            // Removed if this request is dropped (its client went away) before the export is stored.
            let _tmp_guard = state.store.temp_guard(&tmp);
            let (st, t) = (state.clone(), stored.clone());
            let source = blocking(move || st.store.trace_path(&t).map_err(ApiError::from)).await?;
            let written = state.isolation.export(&slot, &source, name, &tmp, state.config.max_decompressed_bytes).await;
            drop(slot);
            if let Err(e) = written {
                let _ = tokio::fs::remove_file(&tmp).await;
                // Deleted while the worker read it: that is why it failed.
                let (st, id) = (state.clone(), stored.trace_id.clone());
                let gone = blocking(move || Ok::<_, ApiError>(matches!(st.store.get(&id), Err(StoreError::NotFound(_))))).await?;
                return Err(if gone { ApiError::trace_not_found(&stored.trace_id) } else { e.into() });
            }
            let st = state.clone();
            blocking(move || st.store.add_export(&stored.trace_id, name, file, &tmp).map_err(ApiError::from)).await?
        }
    };
    Ok(axum::Json(ExportResponse {
        trace_id: req.trace_id,
        format: name.to_owned(),
        download_url: format!("/api/trace/download/{}", export.file),
        file_size_bytes: export.file_size_bytes,
    }))
}

/// Streams a file the store opened (under its lock: a delete after this still lets it be read
/// whole).
async fn file_response(file: std::fs::File, content_type: &'static str, download_name: &str) -> Result<Response, ApiError> {
    let file = tokio::fs::File::from_std(file);
    let len = file.metadata().await.map_err(|e| ApiError::internal("cannot read a stored file", e))?.len();
    let body = Body::from_stream(tokio_util::io::ReaderStream::with_capacity(file, 256 * 1024));
    let mut r = Response::new(body);
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{download_name}\"")) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    Ok(r)
}

/// Download an export made by `POST /api/trace/export`. Only files the store made are served.
#[utoipa::path(get, path = "/api/trace/download/{file}", tag = "traces", params(("file" = String, Path, description = "The file name from `download_url`")), responses(
    (status = 200, description = "The file", content_type = "application/octet-stream"),
    (status = 401, body = ErrorBody),
    (status = 404, description = "No such export", body = ErrorBody),
))]
pub async fn download(State(state): State<Arc<AppState>>, Path(file): Path<String>) -> Result<Response, ApiError> {
    let st = state.clone();
    let name = file.clone();
    let opened = blocking(move || {
        st.store.open_export(&name).map_err(|e| match e {
            StoreError::NotFound(_) => ApiError::new(StatusCode::NOT_FOUND, format!("File {name} not found")),
            e => ApiError::from(e),
        })
    })
    .await?;
    let ct = if file.ends_with(".csv") {
        "text/csv; charset=utf-8"
    } else if file.ends_with(".gz") {
        "application/gzip"
    } else if file.ends_with(".tfevents") {
        "application/octet-stream"
    } else {
        "application/json"
    };
    file_response(opened, ct, &file).await
}

/// List the stored traces.
#[utoipa::path(get, path = "/api/trace/list", tag = "traces", responses((status = 200, body = ListResponse), (status = 401, body = ErrorBody)))]
pub async fn list(State(state): State<Arc<AppState>>) -> Result<axum::Json<ListResponse>, ApiError> {
    // Rows only: the sidecars' layer statistics are not copied per request.
    let st = state.clone();
    let rows = move || {
        st.store.map_all(|t| TraceRow {
            trace_id: t.trace_id.clone(),
            model_name: t.info.model_name.clone(),
            origin: t.origin,
            original_name: t.original_name.clone(),
            created_unix_ms: t.created_unix_ms,
            file_size_bytes: t.file_size_bytes,
            total_events: t.info.total_events,
            peak_allocated_bytes: t.info.peak_allocated_bytes,
            peak_reserved_bytes: t.info.peak_reserved_bytes,
            device: t.info.device.clone(),
            source_format: t.info.source_format.clone(),
        })
    };
    let traces = blocking(move || rows().map_err(ApiError::from)).await?;
    Ok(axum::Json(ListResponse { active_traces: traces.iter().map(|t| t.trace_id.clone()).collect(), count: traces.len(), traces }))
}

/// Delete a stored trace, its exports and files.
#[utoipa::path(delete, path = "/api/trace/{trace_id}", tag = "traces", params(("trace_id" = String, Path)), responses(
    (status = 200, body = DeleteResponse),
    (status = 401, body = ErrorBody),
    (status = 404, body = ErrorBody),
))]
pub async fn delete(State(state): State<Arc<AppState>>, Path(trace_id): Path<String>) -> Result<axum::Json<DeleteResponse>, ApiError> {
    let st = state.clone();
    let id = trace_id.clone();
    let remaining = blocking(move || st.store.delete(&id).map_err(ApiError::from)).await?;
    state.jobs.forget(&trace_id);
    state.sessions.forget(&trace_id);
    Ok(axum::Json(DeleteResponse { message: format!("Trace {trace_id} deleted successfully"), remaining_traces: remaining }))
}

/// Download a stored trace as it is stored (what the viewer opens).
#[utoipa::path(get, path = "/api/trace/{trace_id}", tag = "traces", params(("trace_id" = String, Path)), responses(
    (status = 200, description = "The trace file (native JSON, or the uploaded file as sent)", content_type = "application/octet-stream"),
    (status = 401, body = ErrorBody),
    (status = 404, body = ErrorBody),
))]
pub async fn get_trace(State(state): State<Arc<AppState>>, Path(trace_id): Path<String>) -> Result<Response, ApiError> {
    let st = state.clone();
    let (t, opened) = blocking(move || st.store.open_trace(&trace_id).map_err(ApiError::from)).await?;
    let name = crate::report::safe_name(std::path::Path::new(t.original_name.as_deref().unwrap_or(&t.file)));
    file_response(opened, "application/octet-stream", &name).await
}

/// Store a trace file of any format the collector reads (snapshot pickle, profiler trace,
/// DFTracer, Memory Tracer; gzip or not): a raw body (`?filename=` optional) or a
/// `multipart/form-data` form with one file field. The file is checked by importing it.
/// `?trace_id=` ends that live trace with the file; with `&node=K` the file is node K's part of
/// a live trace of several nodes, merged with the others' once all came.
#[utoipa::path(post, path = "/api/trace/upload", tag = "traces", params(UploadQuery), request_body(content = Vec<u8>, content_type = "application/octet-stream"), responses(
    (status = 200, body = TraceResponse),
    (status = 202, description = "A node's part (`node`), kept until the other nodes' parts come", body = NodePartAccepted),
    (status = 401, body = ErrorBody),
    (status = 403, description = "Sent by another site's page (Origin) or to a non-loopback Host without a token", body = ErrorBody),
    (status = 408, description = "The body stopped arriving (--body-timeout-s)", body = ErrorBody),
    (status = 413, description = "Over --max-upload-mb", body = ErrorBody),
    (status = 422, description = "Not a trace the collector reads, or it needs more than --import-memory-mb to read", body = ErrorBody),
    (status = 429, description = "Too many imports and exports at once; see Retry-After", body = ErrorBody),
))]
pub async fn upload(State(state): State<Arc<AppState>>, Query(q): Query<UploadQuery>, req: Request) -> Result<Response, ApiError> {
    let live = match &q.trace_id {
        Some(t) => Some(state.jobs.external_job(t).ok_or_else(|| ApiError::trace_not_found(t))?),
        None => None,
    };
    match (live, q.node) {
        (Some(job), Some(node)) if job.is_multi_node() => upload_part(&state, job, node, q.filename, req).await,
        (Some(job), None) if job.is_multi_node() => {
            Err(field("node", format!("trace {} gathers the parts of several nodes: say whose part this is (`&node=K`)", job.id())))
        }
        (_, Some(_)) => {
            Err(field("node", "only a live trace of several nodes (`trace_id` of a `POST /api/trace/live` with `job`) takes parts"))
        }
        (live, None) => upload_whole(&state, live, q.filename, req).await.map(IntoResponse::into_response),
    }
}

/// An upload stored as a trace of its own, or as the end of live trace `live`.
async fn upload_whole(
    state: &Arc<AppState>,
    live: Option<Arc<Job>>,
    name: Option<String>,
    req: Request,
) -> Result<axum::Json<TraceResponse>, ApiError> {
    let id = live.as_ref().map_or_else(|| state.store.new_id(), |j| j.id().to_owned());
    let tmp = state.store.temp_path(&format!("{id}.upload"));
    // A request dropped mid-way (the client gone) leaves no temporary file behind.
    let _tmp_guard = state.store.temp_guard(&tmp);
    let name = receive_upload(state, &tmp, name, req).await?;
    // The file is read in a child process with a memory limit (`isolate`): a hostile file
    // costs that child, never the server.
    let imported = async {
        let slot = state.isolation.slot().await?;
        let fallback = name.clone().unwrap_or_else(|| "uploaded trace".into());
        let what = name.as_deref().unwrap_or("the upload");
        state.isolation.import(&slot, &tmp, what, &fallback, state.config.max_decompressed_bytes).await
    }
    .await;
    let result = match imported {
        Ok(info) => {
            let st = state.clone();
            let tmp = tmp.clone();
            blocking(move || {
                let ext = name.as_deref().map(upload_ext).unwrap_or_default();
                let (stored, evicted) = st.store.insert(&id, Origin::Uploaded, name, &tmp, &ext, info).map_err(Fault::from)?;
                for e in &evicted {
                    st.jobs.forget(e);
                    st.sessions.forget(e);
                }
                Ok(axum::Json(TraceResponse::from(&stored)))
            })
            .await
        }
        Err(e) => Err(e),
    };
    if result.is_err() {
        let _ = tokio::fs::remove_file(&tmp).await;
    }
    if let Some(job) = live {
        state.jobs.external_end(job, result.as_ref().map(|r| r.0.clone()).map_err(Fault::clone));
    }
    Ok(result?)
}

/// Node `node`'s part of live trace `job` (of several nodes): kept unread in the store's
/// temporary folder until the merge reads every part in a worker; the last part is answered
/// with the merged trace, the others with what is still awaited (202).
async fn upload_part(state: &Arc<AppState>, job: Arc<Job>, node: u32, name: Option<String>, req: Request) -> Result<Response, ApiError> {
    let tmp = state.store.temp_path(&format!("{}.node{node}.upload", job.id()));
    let _tmp_guard = state.store.temp_guard(&tmp);
    let name = receive_upload(state, &tmp, name, req).await?;
    let part = state.store.temp_path(&format!("{}.node{node}.part", job.id()));
    if let Err(e) = tokio::fs::rename(&tmp, &part).await {
        let _ = tokio::fs::remove_file(&tmp).await;
        return Err(ApiError::internal("cannot keep the node's part", e));
    }
    let end = NodeEnd::Part(part.clone(), name.unwrap_or_else(|| format!("node{node}.mtrace.json")));
    let progress = match job.node_end(node, end) {
        Ok(p) => p,
        Err(e) => {
            let _ = tokio::fs::remove_file(&part).await;
            return Err(e.into());
        }
    };
    after_node_end(state, &job, node, progress).await
}

/// Writes an upload's body (raw, or a multipart form's file field) to `tmp`; the file's name
/// (`?filename=`, else the form's). Refuses empty and oversized bodies (nothing left in `tmp`).
async fn receive_upload(
    state: &AppState,
    tmp: &std::path::Path,
    mut name: Option<String>,
    req: Request,
) -> Result<Option<String>, ApiError> {
    let limit = state.config.max_upload_bytes;
    let is_multipart =
        req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("multipart/form-data"));
    let written = if is_multipart {
        let mut form = axum::extract::Multipart::from_request(req, &())
            .await
            .map_err(|e| ApiError::unprocessable(format!("invalid multipart body: {}", e.body_text())))?;
        let mut found = None;
        while let Some(f) = form.next_field().await.map_err(|e| multipart_error(&e, limit))? {
            if f.file_name().is_some() || f.name() == Some("file") {
                name = name.or_else(|| f.file_name().map(str::to_owned));
                found = Some(write_stream(tmp, f.map(|c| c.map_err(|e| multipart_error(&e, limit))), limit).await);
                break;
            }
        }
        found.unwrap_or_else(|| Err(field("file", "the form has no file field")))
    } else {
        let stream = req.into_body().into_data_stream().map(|c| c.map_err(|e| ApiError::body(&e)));
        write_stream(tmp, stream, limit).await
    };
    match written {
        Ok(0) => {
            let _ = tokio::fs::remove_file(tmp).await;
            Err(ApiError::unprocessable("the upload is empty: send a trace file as the body or as a form's file field"))
        }
        Ok(_) => Ok(name),
        Err(e) => {
            let _ = tokio::fs::remove_file(tmp).await;
            Err(e)
        }
    }
}

fn multipart_error(e: &axum::extract::multipart::MultipartError, limit: u64) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::too_large(format!("the upload is larger than this server's limit of {limit} bytes (--max-upload-mb)"))
    } else if ApiError::body(e).status == StatusCode::REQUEST_TIMEOUT {
        ApiError::body_timeout()
    } else {
        ApiError::unprocessable(format!("invalid multipart body: {}", e.body_text()))
    }
}

/// `.pickle`, `.json.gz`, ...: the upload's extension when it is plain, for downloads.
fn upload_ext(name: &str) -> String {
    let base = name.rsplit(['/', '\\']).next().unwrap_or(name);
    let ext = base.find('.').map_or("", |i| &base[i..]);
    let plain = ext.len() <= 24 && ext.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.') && !ext.contains("..");
    if plain {
        ext.to_ascii_lowercase()
    } else {
        String::new()
    }
}

async fn write_stream<E>(
    path: &std::path::Path,
    mut stream: impl futures_util::Stream<Item = Result<E, ApiError>> + Unpin,
    limit: u64,
) -> Result<u64, ApiError>
where
    E: AsRef<[u8]>,
{
    use tokio::io::AsyncWriteExt;
    let file = tokio::fs::File::create(path).await.map_err(|e| ApiError::internal("cannot create a file in the store", e))?;
    let mut w = tokio::io::BufWriter::with_capacity(1 << 20, file);
    let mut n = 0u64;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        let chunk = chunk.as_ref();
        n += chunk.len() as u64;
        if n > limit {
            return Err(ApiError::too_large(format!("the upload is larger than this server's limit of {limit} bytes (--max-upload-mb)")));
        }
        w.write_all(chunk).await.map_err(|e| ApiError::internal("cannot write the upload", e))?;
    }
    w.flush().await.map_err(|e| ApiError::internal("cannot write the upload", e))?;
    w.into_inner().sync_all().await.map_err(|e| ApiError::internal("cannot write the upload", e))?;
    Ok(n)
}

/// Follow a trace: Server-Sent Events while it is queued and runs (`status`, `started`,
/// `memory` batches of `[ns, allocated, reserved]`, `iteration`), ending with `done` (the
/// same body as `POST /api/trace/memory`) or `failed` (`{"status", "detail"}`). A stored trace
/// answers `done` at once. Late followers first get what was sent so far.
#[utoipa::path(get, path = "/api/trace/{trace_id}/events", tag = "tracing", params(("trace_id" = String, Path)), responses(
    (status = 200, description = "An event stream", content_type = "text/event-stream"),
    (status = 401, body = ErrorBody),
    (status = 404, body = ErrorBody),
))]
pub async fn events(State(state): State<Arc<AppState>>, Path(trace_id): Path<String>) -> Result<Response, ApiError> {
    let to_sse = |e: JobEvent| -> Result<Event, std::convert::Infallible> {
        let e = match e {
            JobEvent::Live(e) => e,
            JobEvent::Failed(f) => super::error::failed_event(&f),
        };
        Ok(Event::default().event(e.kind()).data(serde_json::to_string(&e).unwrap_or_else(|_| "{}".into())))
    };
    if let Some(job) = state.jobs.get(&trace_id) {
        let (history, rx) = job.follow();
        let ended = history.last().is_some_and(JobEvent::is_terminal);
        let live = futures_util::stream::unfold((rx, ended), |(mut rx, ended)| async move {
            if ended {
                return None;
            }
            loop {
                match rx.recv().await {
                    Ok(e) => {
                        let end = e.is_terminal();
                        return Some((e, (rx, end)));
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                }
            }
        });
        let stream = futures_util::stream::iter(history).chain(live).map(to_sse);
        return Ok(Sse::new(stream).keep_alive(KeepAlive::default()).into_response());
    }
    let t = find_stored(&state, &trace_id).await?;
    let done = JobEvent::Live(LiveEvent::Done { trace: TraceResponse::from(&t) });
    Ok(Sse::new(futures_util::stream::iter([done]).map(to_sse)).into_response())
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
        torch_version: state.tracing.then(|| super::state::TORCH_VERSION.to_owned()),
        jobs_running: running,
        jobs_queued: queued,
        stored_traces: traces,
        store_bytes: bytes,
        models: state.model_names(),
    })
}

/// `GET /api/trace/{trace_id}/advice?budget=6GiB`: what to change so the run needs less memory
/// (checkpointing which layers, AMP, a smaller batch, set_to_none, optimizer state,
/// expandable_segments), each with its predicted peak and extra time (`collector advise --json`).
#[utoipa::path(get, path = "/api/trace/{trace_id}/advice", tag = "traces", params(("trace_id" = String, Path), AdviceQuery),
    responses((status = 200, description = "The advice, as `collector advise --json`"), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn advice(
    State(state): State<Arc<AppState>>,
    Path(trace_id): Path<String>,
    query: Result<Query<AdviceQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<axum::Json<shared::analysis::advice::AdviceReport>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::unprocessable(format!("invalid query: {}", e.body_text())))?;
    let stored = find_stored(&state, &trace_id).await?;
    let budget = match q.budget.as_deref() {
        Some(text) => Some(shared::units::parse_size(text).map_err(|e| ApiError::unprocessable(format!("query parameter `budget`: {e}")))?),
        None => None,
    };
    let opts = shared::analysis::advice::AdviceOptions { budget_bytes: budget, top: q.top.unwrap_or(10), ..Default::default() };
    let slot = state.isolation.slot().await?;
    let st = state.clone();
    let report = blocking(move || -> Result<_, ApiError> {
        let _slot = slot;
        let trace = st.load(&stored)?;
        Ok(shared::analysis::advice::advise(&trace, &opts))
    })
    .await?;
    Ok(axum::Json(report))
}

/// The explorer session of stored trace `trace_id`: the open one, else imported now (in an
/// import slot, off the runtime).
async fn explored(state: &Arc<AppState>, trace_id: &str) -> Result<Arc<super::state::Explored>, ApiError> {
    let stored = find_stored(state, trace_id).await?;
    if let Some(e) = state.sessions.get(trace_id) {
        return Ok(e);
    }
    let slot = state.isolation.slot().await?;
    let st = state.clone();
    blocking(move || -> Result<_, ApiError> {
        let _slot = slot;
        Ok(st.explore(&stored)?)
    })
    .await
}

/// `GET /api/trace/{trace_id}/overview`: opens a stored trace for exploring here, imported by
/// the server (for files larger than a page can hold), and answers what the viewer draws first.
#[utoipa::path(get, path = "/api/trace/{trace_id}/overview", tag = "traces", params(("trace_id" = String, Path)),
    responses((status = 200, description = "The viewer's overview of the trace"), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn overview(State(state): State<Arc<AppState>>, Path(trace_id): Path<String>) -> Result<Response, ApiError> {
    let e = explored(&state, &trace_id).await?;
    Ok(axum::Json(&*e.overview).into_response())
}

/// `POST /api/trace/{trace_id}/explore`: one of the viewer's requests (a timeline window, the
/// state at a moment, the active memory bands, an export, ...) answered by the server's session
/// of the stored trace, opened on first use.
#[utoipa::path(post, path = "/api/trace/{trace_id}/explore", tag = "traces", params(("trace_id" = String, Path)),
    responses((status = 200, description = "The answer, as the viewer's worker gives it"), (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn explore(
    State(state): State<Arc<AppState>>,
    Path(trace_id): Path<String>,
    ApiJson(request): ApiJson<protocol::ExploreRequest>,
) -> Result<Response, ApiError> {
    let e = explored(&state, &trace_id).await?;
    let answer = blocking(move || -> Result<_, ApiError> {
        Ok(e.session.lock().unwrap_or_else(std::sync::PoisonError::into_inner).answer(&request))
    })
    .await?;
    Ok(axum::Json(answer).into_response())
}
