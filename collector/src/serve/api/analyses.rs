//! What the server computes from a stored trace: leaks, advice, the diff of two, and the
//! viewer's overview and explore answers (cached per trace).

use super::super::error::{ApiError, ApiJson};
use super::super::fault::blocking;
use super::super::state::AppState;
use super::super::store::StoreError;
use super::{field, find_stored};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use protocol::*;
use std::sync::Arc;

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
    let defaults = shared::analysis::advice::AdviceOptions::default();
    let opts = shared::analysis::advice::AdviceOptions { budget_bytes: budget, top: q.top.unwrap_or(defaults.top), ..defaults };
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
async fn explored(state: &Arc<AppState>, trace_id: &str) -> Result<Arc<super::super::state::Explored>, ApiError> {
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
