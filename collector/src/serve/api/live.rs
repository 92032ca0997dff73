//! Traces recorded outside the server, followed live: a recorder registers one
//! (`POST /api/trace/live`), posts its lines, and followers read them as server-sent events
//! (`GET /api/trace/{id}/events`); a job of several nodes merges their parts when all are in.

use super::super::error::{ApiError, ApiJson};
use super::super::fault::{blocking, Fault};
use super::super::jobs::{Job, JobEvent, NodeEnd, NodeProgress};
use super::super::state::AppState;
use super::{field, find_stored};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use protocol::*;
use std::sync::Arc;

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
pub(super) async fn after_node_end(state: &Arc<AppState>, job: &Arc<Job>, node: u32, progress: NodeProgress) -> Result<Response, ApiError> {
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
            let (stored, evicted) = st
                .store
                .insert(&id, Origin::Uploaded, name, &out, ".mtrace.json", info)
                .map_err(|e| Fault::storing(e, "cannot store the merged trace"))?;
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
            JobEvent::Failed(f) => super::super::error::failed_event(&f),
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
