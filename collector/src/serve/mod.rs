//! `collector serve`: the tracing API (the seed service's contract), the persistent trace
//! store, live streams of running traces, and the viewer, in one process.
//!
//! [`router`] builds the whole app from an [`AppState`]; [`serve`] binds it. Handlers never
//! block the runtime: file I/O runs in `spawn_blocking`, imports of uploads and exports in
//! limited child processes (`isolate`), tracing in child processes (`jobs`).

// Layers, each importing only those above it in this list: store → isolate → jobs → state
// (the lower layers: no HTTP, their failures are `Fault`s) → error, api, docs (the API: the
// only code that knows status codes) → this module (the app: router, auth, viewer assets,
// the listener).
pub mod api;
mod docs;
pub mod error;
pub mod fault;
pub mod isolate;
pub mod jobs;
pub mod state;
pub mod store;

pub use state::*;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use error::ApiError;
use std::net::SocketAddr;
use std::sync::Arc;

/// Whether `given` is the token whose digest is `expected`: both are 32-byte digests, compared
/// with no early exit, so the time says nothing of the token's bytes or length.
fn token_matches(given: &str, expected: &[u8; 32]) -> bool {
    use subtle::ConstantTimeEq;
    sha256(given.as_bytes()).ct_eq(expected).into()
}

/// Requires the token on every API route when the server has one: `Authorization: Bearer`,
/// or `?access_token=` for clients that cannot set headers (EventSource, the viewer's fetch
/// of a trace URL).
async fn require_token(State(state): State<Arc<AppState>>, req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let Some(token) = state.token_digest.as_ref() else {
        return next.run(req).await;
    };
    let from_header = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim);
    #[derive(serde::Deserialize)]
    struct TokenQuery {
        access_token: Option<String>,
    }
    let from_query = axum::extract::Query::<TokenQuery>::try_from_uri(req.uri()).ok().and_then(|q| q.0.access_token);
    let ok = from_header.is_some_and(|t| token_matches(t, token)) || from_query.is_some_and(|t| token_matches(&t, token));
    if ok {
        next.run(req).await
    } else {
        ApiError::unauthorized().into_response()
    }
}

/// Whether a `Host` header names this machine's loopback: `localhost`, `127.x.x.x` or `[::1]`,
/// with or without a port.
pub fn is_loopback_authority(authority: &str) -> bool {
    let host = match authority.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((ip, port)) if port.is_empty() || port.strip_prefix(':').is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit())) => ip,
            _ => return false,
        },
        None => match authority.rsplit_once(':') {
            Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
            Some(_) => return false,
            None => authority,
        },
    };
    host.eq_ignore_ascii_case("localhost") || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// Why a state-changing request (POST, PUT, PATCH, DELETE) comes from another site, if it
/// does: an `Origin` that is neither this server (its `Host`) nor a `--cors-origin`, or, without
/// `Origin`, a browser's `Sec-Fetch-Site` of another site. Clients that send neither (curl,
/// scripts) are no browser a page could drive.
fn cross_site(headers: &axum::http::HeaderMap, cors_origins: &[String]) -> Option<String> {
    let allowed = |origin: &str| cors_origins.iter().any(|o| o == "*" || o.eq_ignore_ascii_case(origin));
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
        let authority = origin.split_once("://").map_or("", |(_, a)| a);
        if (!host.is_empty() && authority.eq_ignore_ascii_case(host)) || allowed(origin) {
            return None;
        }
        return Some(format!("Origin `{origin}`"));
    }
    match headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        Some(site @ ("cross-site" | "same-site")) if !cors_origins.iter().any(|o| o == "*") => Some(format!("Sec-Fetch-Site `{site}`")),
        _ => None,
    }
}

/// Refuses what a web page on another site could make a browser send: without a token, any
/// `Host` but loopback's (a DNS-rebinding page reaches 127.0.0.1 under its own name), and
/// always, state-changing requests from other origins (CSRF through forms, which need no CORS
/// preflight).
async fn guard_browsers(State(state): State<Arc<AppState>>, req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    if state.config.token.is_none() {
        if let Some(host) = req.headers().get(header::HOST) {
            let host = host.to_str().unwrap_or("");
            if !is_loopback_authority(host) {
                return ApiError::new(
                    StatusCode::FORBIDDEN,
                    format!(
                        "this server has no token, so it answers only requests addressed to localhost, 127.0.0.1 or [::1]; got Host `{}` (a page that renamed this machine, DNS rebinding, is refused): use a loopback address, or start the server with --token-file",
                        host.chars().take(100).collect::<String>()
                    ),
                )
                .into_response();
            }
        }
    }
    let changes = !matches!(*req.method(), axum::http::Method::GET | axum::http::Method::HEAD | axum::http::Method::OPTIONS);
    if changes {
        if let Some(what) = cross_site(req.headers(), &state.config.cors_origins) {
            return ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "cross-origin {} refused ({}): only this server's own page, clients without an Origin (curl, scripts) and --cors-origin origins may change its data",
                    req.method(),
                    what.chars().take(200).collect::<String>()
                ),
            )
            .into_response();
        }
    }
    next.run(req).await
}

/// The MCP tools' traces on this server: the stored ones, by id (paths are not read here).
struct StoredTraces(Arc<AppState>);

impl crate::mcp::Traces for StoredTraces {
    fn resolve(&self, trace: &str) -> Result<std::path::PathBuf, String> {
        let t = self.0.store.get(trace).map_err(|e| match e {
            store::StoreError::NotFound(_) => {
                format!("no stored trace `{trace}` on this server (GET /api/trace/list lists them; this server reads no paths)")
            }
            e => e.to_string(),
        })?;
        self.0.store.trace_path(&t).map_err(|e| e.to_string())
    }
}

/// The whole app: API and MCP tools (behind the token), docs, and the viewer at `/`.
pub fn router(state: Arc<AppState>) -> Router {
    let api = Router::new()
        .route("/api/health", get(api::health))
        .route("/api/trace/memory", post(api::trace_memory))
        .route("/api/trace/export", post(api::trace_export))
        .route("/api/trace/list", get(api::list))
        .route("/api/trace/download/{file}", get(api::download))
        .route("/api/trace/upload", post(api::upload).layer(DefaultBodyLimit::disable()))
        .route("/api/trace/live", post(api::live_start))
        .route("/api/trace/diff", post(api::trace_diff))
        .route("/api/trace/live/{trace_id}", post(api::live_event))
        .route("/api/trace/{trace_id}", get(api::get_trace).delete(api::delete))
        .route("/api/trace/{trace_id}/events", get(api::events))
        .route("/api/trace/{trace_id}/leaks", get(api::leaks))
        .route("/api/trace/{trace_id}/advice", get(api::advice))
        .route("/api/trace/{trace_id}/overview", get(api::overview))
        .route("/api/trace/{trace_id}/explore", post(api::explore))
        .route("/api/jobs", get(api::jobs))
        .nest_service("/mcp", crate::mcp::http_service(Arc::new(StoredTraces(state.clone())), state.import_options()))
        .layer(DefaultBodyLimit::max(JSON_BODY_LIMIT))
        .route_layer(axum::middleware::from_fn_with_state(state.clone(), require_token));
    let public = Router::new()
        .route("/api/openapi.json", get(docs::openapi_json))
        .route("/api/docs", get(docs::swagger))
        .route("/api/redoc", get(docs::redoc))
        .route("/api/docs/assets/{file}", get(docs::asset))
        .route("/", get(viewer_index))
        .route("/{file}", get(viewer_asset));
    let mut app = api
        .merge(public)
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "Not Found") })
        .method_not_allowed_fallback(|| async { ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed") })
        .layer(axum::middleware::from_fn_with_state(state.clone(), guard_browsers))
        .layer(tower_http::timeout::RequestBodyTimeoutLayer::new(state.config.body_timeout))
        .with_state(state.clone());
    if !state.config.cors_origins.is_empty() {
        use tower_http::cors::{AllowOrigin, Any, CorsLayer};
        let origins = &state.config.cors_origins;
        let allow = if origins.iter().any(|o| o == "*") {
            AllowOrigin::any()
        } else {
            AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
        };
        app = app.layer(CorsLayer::new().allow_origin(allow).allow_methods(Any).allow_headers(Any));
    }
    app
}

/// The viewer's page, told it is served by `collector serve` (it then lists the store, traces
/// models and follows running jobs).
async fn viewer_index() -> Response {
    let Some(html) = crate::viewer_assets::embedded()
        .ok()
        .and_then(|a| a.iter().find(|(n, _)| *n == "index.html"))
        .and_then(|(_, b)| std::str::from_utf8(b).ok())
    else {
        return ApiError::unavailable(
            "this collector was built without the viewer (build it with `cargo xtask check`, then rebuild the collector)",
        )
        .into_response();
    };
    let html = html.replacen("</head>", "<meta name=\"memory-tracer-server\" content=\"./\" />\n</head>", 1);
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-cache")], CROSS_ORIGIN_ISOLATED, html).into_response()
}

/// The headers that make the viewer's page cross-origin isolated, so that it may share memory
/// with its worker: the page then reads a chosen file into a ring the worker parses from
/// (`viewer/src/ring.rs`) instead of the worker stopping to read it. The page loads nothing
/// from other origins; its worker's fetches of traces elsewhere are CORS requests, which
/// `require-corp` lets through.
const CROSS_ORIGIN_ISOLATED: [(&str, &str); 2] =
    [("cross-origin-opener-policy", "same-origin"), ("cross-origin-embedder-policy", "require-corp")];

async fn viewer_asset(axum::extract::Path(file): axum::extract::Path<String>) -> Response {
    let found = crate::viewer_assets::embedded().ok().and_then(|a| a.iter().find(|(n, _)| *n == file && *n != "index.html"));
    match found {
        Some((name, bytes)) => {
            ([(header::CONTENT_TYPE, crate::objects::content_type(name))], CROSS_ORIGIN_ISOLATED, *bytes).into_response()
        }
        None if file == "index.html" => viewer_index().await,
        None => ApiError::new(StatusCode::NOT_FOUND, "Not Found").into_response(),
    }
}

/// Whether binding `host` exposes the server beyond this machine.
pub fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The process ids of `parent`'s children (Linux: from /proc).
pub fn child_pids(parent: u32) -> Vec<u32> {
    let parent = parent.to_string();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            (stat_field(pid, 1)? == parent).then_some(pid)
        })
        .collect()
}

/// Field `n` of process `pid`'s /proc stat line after its command (`pid (comm) state ppid
/// ...`: 0 is the state, 1 the parent's pid), if the process exists.
fn stat_field(pid: u32, n: usize) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(stat.rsplit(')').next()?.split_whitespace().nth(n)?.to_owned())
}

/// The viewer's URL that `--open` handed to the desktop's opener. The processes that carry it
/// (`$BROWSER URL`, `xdg-open URL`, or the browser it became) are the user's, not traces: they
/// outlive the server.
static OPENED_URL: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Says that `url` goes to the user's browser now (see [`OPENED_URL`]).
pub fn opening_browser(url: &str) {
    let _ = OPENED_URL.set(url.to_owned());
}

/// Whether process `pid`'s arguments include `arg`.
fn runs_with_arg(pid: u32, arg: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.split(|&b| b == 0).any(|a| a == arg.as_bytes()))
}

/// Whether process `pid` has exited and waits to be reaped.
fn is_zombie(pid: u32) -> bool {
    stat_field(pid, 0).as_deref() == Some("Z")
}

/// Kills this process's children (the browser `--open` started excepted) and waits for them
/// (up to `wait` in all); returns how many of them were still running.
fn reap_children(wait: std::time::Duration) -> usize {
    let opened = OPENED_URL.get();
    let kids: Vec<u32> = child_pids(std::process::id()).into_iter().filter(|&k| !opened.is_some_and(|url| runs_with_arg(k, url))).collect();
    let running = kids.iter().filter(|&&k| !is_zombie(k)).count();
    let deadline = std::time::Instant::now() + wait;
    for &pid in &kids {
        let pid = pid as libc::pid_t;
        // SAFETY: kill(2) and waitpid(2) on this process's own child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        loop {
            let mut status = 0;
            // SAFETY: as above; WNOHANG never blocks.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r != 0 || std::time::Instant::now() > deadline {
                break; // reaped (r == pid), or already reaped elsewhere (r == -1)
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    running
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM (systemd, Docker, Kubernetes).
async fn stop_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

/// Answers a connection past `--max-connections`: 503 with Retry-After, then closed.
async fn refuse_connection(mut stream: tokio::net::TcpStream, max: usize) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = format!("{{\"detail\":\"this server has {max} connections open, its limit (--max-connections); retry shortly\"}}");
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await?;
        // Read what the client sent, so closing does not reset the connection before it has
        // read the answer.
        let mut sink = [0u8; 4096];
        let mut left = 64 * 1024usize;
        while left > 0 {
            let n = stream.read(&mut sink).await?;
            if n == 0 {
                break;
            }
            left = left.saturating_sub(n);
        }
        std::io::Result::Ok(())
    })
    .await;
}

/// Binds `host:port` and serves until SIGINT or SIGTERM, then stops gracefully: no new
/// connections, answers in flight get `grace` to finish, trace children are killed and
/// reaped, `tmp/` is emptied, and it returns Ok (exit 0). Refuses non-loopback binds without a
/// token. `on_ready` gets the bound address (port 0 picks a free one).
///
/// Connections are served by hyper directly (not `axum::serve`) for what axum does not
/// expose: a header read timeout (slowloris) and a cap on open connections.
pub async fn serve(host: &str, port: u16, config: ServeConfig, on_ready: impl FnOnce(SocketAddr, &Arc<AppState>)) -> anyhow::Result<()> {
    use anyhow::Context;
    if !is_loopback(host) && config.token.is_none() {
        anyhow::bail!("binding {host} exposes the server to the network: give a token (--token-file FILE, or MEMORY_TRACER_TOKEN) so every API call needs `Authorization: Bearer <token>`");
    }
    // Off the runtime: opening a bucket store asks the bucket.
    let state = tokio::task::spawn_blocking(move || AppState::new(config)).await.context("opening the server's state failed")??;
    let listener = tokio::net::TcpListener::bind((host, port)).await.with_context(|| format!("cannot listen on {host}:{port}"))?;
    let addr = listener.local_addr()?;
    on_ready(addr, &state);
    let grace = state.config.shutdown_grace;
    let max_connections = state.config.max_connections.max(1);
    let connections = Arc::new(tokio::sync::Semaphore::new(max_connections));
    let (stopping_tx, stopping_rx) = tokio::sync::watch::channel(false);
    let app = router(state.clone());
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(state.config.header_timeout);
    let accept = async {
        loop {
            let stream = match listener.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    // Out of descriptors and the like: wait instead of spinning.
                    eprintln!("collector serve: cannot accept a connection: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let Ok(permit) = connections.clone().try_acquire_owned() else {
                tokio::spawn(refuse_connection(stream, max_connections));
                continue;
            };
            let service = hyper_util::service::TowerToHyperService::new(app.clone());
            let conn = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            let mut stopping = stopping_rx.clone();
            tokio::spawn(async move {
                let mut conn = std::pin::pin!(conn);
                tokio::select! {
                    _ = conn.as_mut() => {}
                    () = async { let _ = stopping.wait_for(|s| *s).await; } => {
                        conn.as_mut().graceful_shutdown();
                        let _ = conn.await;
                    }
                }
                drop(permit);
            });
        }
    };
    tokio::select! {
        () = accept => {}
        () = stop_signal() => {}
    }
    drop(listener); // no new connections from here on
    eprintln!("collector serve: stopping (answers in flight get {} s)", grace.as_secs());
    let _ = stopping_tx.send(true);
    let all_closed = connections.acquire_many(max_connections as u32);
    if tokio::time::timeout(grace, all_closed).await.is_err() {
        eprintln!("collector serve: grace period over; closing the connections left");
    }
    // No trace starts from here on; the ones running are killed and reaped, so none
    // outlives the server, running or as a zombie.
    state.jobs.stop();
    let killed = reap_children(std::time::Duration::from_secs(5));
    if killed > 0 {
        eprintln!("collector serve: stopped {killed} running trace(s)");
    }
    state.store.clear_tmp();
    eprintln!("collector serve: stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_parse() {
        assert_eq!(device::parse("cuda").as_deref(), Ok("cuda:0"));
        assert_eq!(device::parse("cuda:3").as_deref(), Ok("cuda:3"));
        assert!(device::parse("gpu").is_err());
        assert!(device::parse("cuda:-1").is_err());
    }

    #[test]
    fn tokens_compare_whole() {
        let abc = sha256(b"abc");
        assert!(token_matches("abc", &abc));
        assert!(!token_matches("abd", &abc) && !token_matches("ab", &abc) && !token_matches("abcd", &abc) && !token_matches("", &abc));
    }

    #[test]
    fn loopback_authorities() {
        for ok in ["localhost", "localhost:8000", "127.0.0.1", "127.0.0.1:80", "[::1]", "[::1]:8000", "LOCALHOST:1", "127.1.2.3:9"] {
            assert!(is_loopback_authority(ok), "{ok}");
        }
        for bad in ["evil.example", "evil.example:8000", "localhost.evil.example", "127.0.0.1.nip.io", "[::2]:80", "0.0.0.0:80", "", "::1"]
        {
            assert!(!is_loopback_authority(bad), "{bad}");
        }
    }

    #[test]
    fn loopback_hosts() {
        assert!(is_loopback("127.0.0.1") && is_loopback("::1") && is_loopback("localhost"));
        assert!(!is_loopback("0.0.0.0") && !is_loopback("192.168.1.2"));
    }
}
