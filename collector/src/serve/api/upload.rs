//! Uploads: a whole trace (streamed to disk, any format the importers read) or one node's
//! part of a distributed job.

use super::super::error::ApiError;
use super::super::fault::{blocking, Fault};
use super::super::jobs::{Job, NodeEnd};
use super::super::state::AppState;
use super::field;
use super::live::after_node_end;
use axum::extract::{FromRequest, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use protocol::*;
use std::sync::Arc;

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
