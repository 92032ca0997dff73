//! The API in-process (`router(state).oneshot(..)`, no socket, no child process): request
//! validation, authentication, browser guards and the mapping of failures to status codes.
//! The job pipeline (trace children, uploads through the import worker) is tested against a
//! running server in `serve.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use collector::serve::{router, AppState, ServeConfig};
use protocol::{ErrorBody, HealthResponse, ListResponse};
use std::sync::Arc;
use tower::ServiceExt;

fn state(token: Option<&str>) -> (Arc<AppState>, std::path::PathBuf) {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!("mt-api-{}-{}", std::process::id(), N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)));
    let _ = std::fs::remove_dir_all(&dir);
    let mut config = ServeConfig::new(dir.clone());
    config.device = Some("cpu".into());
    config.token = token.map(str::to_owned);
    // Never started here: the in-process tests stop at validation.
    config.collector_exe = Some("/nonexistent/collector".into());
    (AppState::new(config).unwrap(), dir)
}

async fn call(state: &Arc<AppState>, req: Request<Body>) -> (StatusCode, axum::http::HeaderMap, Vec<u8>) {
    let resp = router(state.clone()).oneshot(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 24).await.unwrap().to_vec();
    (parts.status, parts.headers, bytes)
}

fn post_json(uri: &str, body: &str) -> Request<Body> {
    Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header(header::HOST, "127.0.0.1")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap()
}

fn get(uri: &str) -> Request<Body> {
    Request::builder().uri(uri).header(header::HOST, "localhost").body(Body::empty()).unwrap()
}

fn detail(body: &[u8]) -> String {
    serde_json::from_slice::<ErrorBody>(body).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(body))).detail
}

#[tokio::test]
async fn health_and_list_answer_the_protocol_types() {
    let (s, dir) = state(None);
    let (status, _, body) = call(&s, get("/api/health")).await;
    assert_eq!(status, StatusCode::OK);
    let h: HealthResponse = serde_json::from_slice(&body).unwrap();
    assert_eq!(h.device, "cpu");
    assert_eq!(h.stored_traces, 0);
    assert!(h.models.iter().any(|m| m == "resnet18"), "{:?}", h.models);
    let (status, _, body) = call(&s, get("/api/trace/list")).await;
    assert_eq!(status, StatusCode::OK);
    let l: ListResponse = serde_json::from_slice(&body).unwrap();
    assert_eq!((l.count, l.traces.len()), (0, 0));
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn trace_requests_are_validated_field_by_field() {
    let (s, dir) = state(None);
    let cases = [
        (r#"{"model_name": "nope"}"#, "field `model_name`"),
        (r#"{"model_name": "resnet18", "batch_size": 0}"#, "field `batch_size`"),
        (r#"{"model_name": "resnet18", "max_events": 0}"#, "field `max_events`"),
        (r#"{"model_name": "resnet18", "device": "tpu"}"#, "field `device`"),
        (r#"{"model_name": "resnet18", "iterations": 100000}"#, "field `iterations`"),
        (r#"{"model_name": "resnet18", "world_size": 1000}"#, "field `world_size`"),
        (r#"{"model_name": "resnet18", "input_shape": [1, -3, 224, 224]}"#, "field `input_shape`"),
        (r#"{"model": "resnet18"}"#, "model_name"),
        (r#"{"model_name": 5}"#, "model_name"),
    ];
    for (body, expected) in cases {
        let (status, _, answer) = call(&s, post_json("/api/trace/memory", body)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {}", String::from_utf8_lossy(&answer));
        let d = detail(&answer);
        assert!(d.contains(expected), "{body}: {d}");
    }
    // Not JSON at all, and JSON of the wrong content type.
    let (status, _, answer) = call(&s, post_json("/api/trace/memory", "{")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(!detail(&answer).is_empty());
    let req =
        Request::builder().method(Method::POST).uri("/api/trace/memory").header(header::HOST, "localhost").body(Body::from("{}")).unwrap();
    assert_eq!(call(&s, req).await.0, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    // Over the JSON body limit.
    let big = format!(r#"{{"model_name": "{}"}}"#, "x".repeat(200_000));
    assert_eq!(call(&s, post_json("/api/trace/memory", &big)).await.0, StatusCode::PAYLOAD_TOO_LARGE);
    // CUDA on a CPU-only server: the device check's fault becomes 503.
    let (status, _, answer) = call(&s, post_json("/api/trace/memory", r#"{"model_name": "resnet18", "device": "cuda:0"}"#)).await;
    if s.cuda_devices == 0 {
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{}", String::from_utf8_lossy(&answer));
        assert!(detail(&answer).contains("CUDA"));
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn lookups_of_what_is_not_there_answer_404() {
    let (s, dir) = state(None);
    for uri in ["/api/trace/t-missing", "/api/trace/t-missing/leaks", "/api/trace/t-missing/advice", "/api/trace/t-missing/events"] {
        let (status, _, body) = call(&s, get(uri)).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{uri}");
        assert!(detail(&body).contains("t-missing"), "{uri}");
    }
    let (status, _, body) = call(&s, get("/api/trace/download/nothing.csv")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(detail(&body).contains("nothing.csv"));
    let (status, _, body) = call(&s, post_json("/api/trace/export", r#"{"trace_id": "t-missing", "format": "csv"}"#)).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{}", String::from_utf8_lossy(&body));
    let (status, _, body) = call(&s, post_json("/api/trace/diff", r#"{"a": "t-a", "b": "t-b"}"#)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(detail(&body).contains("field `a`"));
    let (status, _, _) = call(&s, get("/api/no-such-route")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let req = Request::builder().method(Method::DELETE).uri("/api/jobs").header(header::HOST, "localhost").body(Body::empty()).unwrap();
    assert_eq!(call(&s, req).await.0, StatusCode::METHOD_NOT_ALLOWED);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_token_guards_the_api_but_not_the_docs() {
    let (s, dir) = state(Some("sesame"));
    let (status, headers, body) = call(&s, get("/api/health")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(headers.get(header::WWW_AUTHENTICATE).unwrap(), "Bearer");
    assert!(detail(&body).contains("Authorization: Bearer"));
    let wrong = Request::builder().uri("/api/health").header(header::AUTHORIZATION, "Bearer sesam").body(Body::empty()).unwrap();
    assert_eq!(call(&s, wrong).await.0, StatusCode::UNAUTHORIZED);
    let right = Request::builder().uri("/api/health").header(header::AUTHORIZATION, "Bearer sesame").body(Body::empty()).unwrap();
    assert_eq!(call(&s, right).await.0, StatusCode::OK);
    let query = Request::builder().uri("/api/health?access_token=sesame").body(Body::empty()).unwrap();
    assert_eq!(call(&s, query).await.0, StatusCode::OK);
    // With a token, any Host is fine (the token is the guard).
    let far = Request::builder().uri("/api/openapi.json").header(header::HOST, "example.com").body(Body::empty()).unwrap();
    assert_eq!(call(&s, far).await.0, StatusCode::OK);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn without_a_token_browsers_elsewhere_are_refused() {
    let (s, dir) = state(None);
    // DNS rebinding: a page that renamed this machine.
    let rebound = Request::builder().uri("/api/health").header(header::HOST, "attacker.example").body(Body::empty()).unwrap();
    let (status, _, body) = call(&s, rebound).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(detail(&body).contains("attacker.example"));
    // A state-changing request from another site.
    let mut cross = post_json("/api/trace/live", r#"{"model_name": "train.py"}"#);
    cross.headers_mut().insert(header::ORIGIN, "https://evil.example".parse().unwrap());
    let (status, _, body) = call(&s, cross).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(detail(&body).contains("cross-origin"));
    // The same from a script (no Origin) is accepted.
    let (status, _, body) = call(&s, post_json("/api/trace/live", r#"{"model_name": "train.py"}"#)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{}", String::from_utf8_lossy(&body));
    let accepted: protocol::JobAccepted = serde_json::from_slice(&body).unwrap();
    assert_eq!(accepted.status, "running");
    // Its live lines are checked, and an error line ends it as failed.
    let too_many = serde_json::json!({"kind": "memory", "points": vec![[0u64, 0, 0]; protocol::MAX_LIVE_POINTS + 1]}).to_string();
    let uri = format!("/api/trace/live/{}", accepted.trace_id);
    let (status, _, body) = call(&s, post_json(&uri, &too_many)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(detail(&body).contains("field `points`"));
    let end =
        serde_json::to_string(&protocol::ChildLine::Error { class: protocol::FailureClass::Invalid, detail: "it broke".into() }).unwrap();
    let (status, _, body) = call(&s, post_json(&uri, &end)).await;
    assert_eq!(status, StatusCode::OK);
    let live: protocol::LiveAccepted = serde_json::from_slice(&body).unwrap();
    assert_eq!(live.status, "failed");
    let (_, _, body) = call(&s, get("/api/jobs")).await;
    let jobs: protocol::JobsResponse = serde_json::from_slice(&body).unwrap();
    let row = jobs.jobs.iter().find(|j| j.trace_id == accepted.trace_id).unwrap();
    assert_eq!(row.state, protocol::JobState::Failed);
    assert_eq!(row.error.as_deref(), Some("it broke"));
    let _ = std::fs::remove_dir_all(dir);
}
