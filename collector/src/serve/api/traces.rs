//! Stored traces: list, get, delete, export and download their exports.

use super::super::error::{ApiError, ApiJson};
use super::super::fault::blocking;
use super::super::state::AppState;
use super::super::store::StoreError;
use super::{field, find_stored};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use protocol::*;
use std::sync::Arc;

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
            let file = super::super::store::Store::export_name(&stored.trace_id, format.extension());
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
    let name = crate::viewer_assets::safe_name(std::path::Path::new(t.original_name.as_deref().unwrap_or(&t.file)));
    file_response(opened, "application/octet-stream", &name).await
}
