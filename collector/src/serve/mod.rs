//! `collector serve`: the tracing API (the seed service's contract), the persistent trace
//! store, live streams of running traces, and the viewer, in one process.
//!
//! [`router`] builds the whole app from an [`AppState`]; [`serve`] binds it. Handlers never
//! block the runtime: file I/O and imports run in `spawn_blocking`, tracing in child
//! processes (`jobs`).

pub mod api;
mod docs;
pub mod error;
pub mod jobs;
pub mod store;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use error::ApiError;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// Largest JSON body a route accepts.
pub const JSON_BODY_LIMIT: usize = 64 * 1024;

/// Whether this collector traces (built with libtorch).
pub const TRACING_BUILT: bool = cfg!(feature = "tracing");

pub use crate::TORCH_VERSION;

/// Caps on what one request may ask for (422 beyond them).
#[derive(Clone, Debug)]
pub struct Caps {
    pub max_events: u64,
    pub max_batch_size: i64,
    pub max_input_elements: u64,
    pub max_iterations: u32,
    /// Most processes of a distributed request (`world_size`).
    pub max_world_size: u32,
}

impl Default for Caps {
    fn default() -> Self {
        Self {
            max_events: 5_000_000,
            max_batch_size: 4096,
            max_input_elements: 1 << 28,
            max_iterations: 100,
            max_world_size: 8,
        }
    }
}

/// Everything `collector serve` is told.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    pub data_dir: PathBuf,
    /// The default device (`cpu`, `cuda:N`); `None`: the first GPU if there is one, else the CPU.
    pub device: Option<String>,
    /// Bearer token every API route requires (required for non-loopback binds).
    pub token: Option<String>,
    /// Origins allowed by CORS (`*` for any); empty: CORS off.
    pub cors_origins: Vec<String>,
    pub jobs_per_device: usize,
    pub max_queue: usize,
    pub job_timeout: std::time::Duration,
    /// How long answers in flight may take once the server is asked to stop.
    pub shutdown_grace: std::time::Duration,
    pub max_traces: usize,
    pub max_store_bytes: u64,
    pub max_upload_bytes: u64,
    pub max_decompressed_bytes: u64,
    pub caps: Caps,
    /// TorchScript models requests may name: `DIR/<name>.pt` is `"model_name": "<name>"`.
    pub models_dir: Option<PathBuf>,
    /// The binary that runs traces (default: this one).
    pub collector_exe: Option<PathBuf>,
    /// The Python with torch that runs distributed requests under torchrun.
    pub python: PathBuf,
}

impl ServeConfig {
    pub fn new(data_dir: PathBuf) -> Self {
        Self {
            data_dir,
            device: None,
            token: None,
            cors_origins: Vec::new(),
            jobs_per_device: 1,
            max_queue: 32,
            job_timeout: std::time::Duration::from_secs(600),
            shutdown_grace: std::time::Duration::from_secs(10),
            max_traces: 1000,
            max_store_bytes: 20 << 30,
            max_upload_bytes: 2 << 30,
            max_decompressed_bytes: 4 << 30,
            caps: Caps::default(),
            models_dir: None,
            collector_exe: None,
            python: std::env::var_os("MEMORY_TRACER_PYTHON").map_or_else(|| PathBuf::from("python3"), PathBuf::from),
        }
    }
}

/// The default data directory: `$XDG_DATA_HOME/memory-tracer`, else
/// `~/.local/share/memory-tracer`, else `./memory-tracer-data`.
pub fn default_data_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("memory-tracer");
    }
    match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        Some(h) => PathBuf::from(h).join(".local/share/memory-tracer"),
        None => PathBuf::from("memory-tracer-data"),
    }
}

/// `cpu`, `cuda` or `cuda:N` → `cpu` / `cuda:N`.
pub fn parse_device(s: &str) -> Result<String, String> {
    let bad = || format!("unknown device `{s}`; expected cpu, cuda or cuda:N");
    match s {
        "cpu" => Ok("cpu".into()),
        "cuda" => Ok("cuda:0".into()),
        _ => {
            let n = s.strip_prefix("cuda:").ok_or_else(bad)?;
            n.parse::<u32>().ok().filter(|&n| n < 256).map(|n| format!("cuda:{n}")).ok_or_else(bad)
        }
    }
}

/// How many CUDA devices the driver reports (0 without a driver or without tracing).
fn cuda_device_count() -> u32 {
    #[cfg(feature = "tracing")]
    {
        crate::device::count().max(0) as u32
    }
    #[cfg(not(feature = "tracing"))]
    {
        0
    }
}

/// The server's shared state.
#[derive(Debug)]
pub struct AppState {
    pub config: ServeConfig,
    pub store: store::Store,
    pub jobs: jobs::Jobs,
    /// The default device.
    pub device: String,
    pub cuda_devices: u32,
}

impl AppState {
    /// Opens the store and checks the device.
    pub fn new(config: ServeConfig) -> anyhow::Result<Arc<Self>> {
        use anyhow::Context;
        let cuda_devices = cuda_device_count();
        let device = match &config.device {
            Some(d) => parse_device(d).map_err(anyhow::Error::msg)?,
            None if cuda_devices > 0 => "cuda:0".into(),
            None => "cpu".into(),
        };
        let store = store::Store::open(
            &config.data_dir,
            store::StoreLimits {
                max_traces: config.max_traces.max(1),
                max_bytes: config.max_store_bytes,
            },
        )
        .with_context(|| format!("cannot open the trace store in {}", config.data_dir.display()))?;
        let exe = if TRACING_BUILT {
            Some(match &config.collector_exe {
                Some(p) => p.clone(),
                None => std::env::current_exe().context("cannot find this collector's binary to run traces with")?,
            })
        } else {
            None
        };
        let jobs = jobs::Jobs::new(exe, config.jobs_per_device, config.max_queue, config.job_timeout);
        let state = Arc::new(Self {
            config,
            store,
            jobs,
            device,
            cuda_devices,
        });
        if let Err(e) = state.check_device(&state.device) {
            anyhow::bail!("--device {}: {}", state.device, e.detail);
        }
        Ok(state)
    }

    /// 503 when `device` is a CUDA device this machine does not have.
    pub fn check_device(&self, device: &str) -> Result<(), ApiError> {
        if let Some(n) = device.strip_prefix("cuda:") {
            let n: u32 = n.parse().unwrap_or(u32::MAX);
            if self.cuda_devices == 0 {
                return Err(ApiError::unavailable(format!("CUDA is not available on this server ({device} was asked for); use \"device\": \"cpu\"")));
            }
            if n >= self.cuda_devices {
                return Err(ApiError::unavailable(format!("{device} was asked for, but this server has {} CUDA device(s)", self.cuda_devices)));
            }
        }
        Ok(())
    }

    /// The TorchScript file of `name` in `--models-dir`, when there is one. Names are plain
    /// ([`store::is_plain_name`]), so no request reaches another folder.
    pub fn torchscript_model(&self, name: &str) -> Option<PathBuf> {
        let dir = self.config.models_dir.as_ref()?;
        let path = dir.join(format!("{name}.pt"));
        (store::is_plain_name(name) && path.is_file()).then_some(path)
    }

    /// Every model a request may name: the built-in ones, then `--models-dir`'s.
    pub fn model_names(&self) -> Vec<String> {
        let mut names: Vec<String> = jobs::MODELS.iter().map(|m| (*m).to_owned()).collect();
        if let Some(dir) = &self.config.models_dir {
            let mut extra: Vec<String> = std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.strip_suffix(".pt").map(str::to_owned))
                .filter(|n| self.torchscript_model(n).is_some())
                .collect();
            extra.sort();
            names.extend(extra);
        }
        names
    }

    pub fn import_options(&self) -> shared::ImportOptions {
        let mut o = shared::ImportOptions::default();
        o.max_decompressed_bytes = self.config.max_decompressed_bytes;
        o
    }

    /// Reads a stored trace back.
    pub fn load(&self, t: &store::StoredTrace) -> Result<shared::Trace, ApiError> {
        crate::commands::load_trace(&self.store.trace_path(t), &self.import_options()).map_err(|e| ApiError::internal("cannot read a stored trace", e))
    }
}

/// Constant-time comparison (the token is a secret).
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Requires the token on every API route when the server has one: `Authorization: Bearer`,
/// or `?access_token=` for clients that cannot set headers (EventSource, the viewer's fetch
/// of a trace URL).
async fn require_token(State(state): State<Arc<AppState>>, req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let Some(token) = state.config.token.as_deref() else {
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
    let ok = from_header.is_some_and(|t| same_secret(t.as_bytes(), token.as_bytes()))
        || from_query.is_some_and(|t| same_secret(t.as_bytes(), token.as_bytes()));
    if ok {
        next.run(req).await
    } else {
        ApiError::unauthorized().into_response()
    }
}

/// The whole app: API (behind the token), docs, and the viewer at `/`.
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
        .route("/api/jobs", get(api::jobs))
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

fn content_type(name: &str) -> &'static str {
    match name.rsplit('.').next() {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("wasm") => "application/wasm",
        Some("css") => "text/css; charset=utf-8",
        Some("json") => "application/json",
        Some("svg") => "image/svg+xml",
        Some("woff2") => "font/woff2",
        Some("ttf") => "font/ttf",
        Some("png") => "image/png",
        _ => "application/octet-stream",
    }
}

/// The viewer's page, told it is served by `collector serve` (it then lists the store, traces
/// models and follows running jobs).
async fn viewer_index() -> Response {
    let Some(html) = crate::report::viewer_assets().ok().and_then(|a| a.iter().find(|(n, _)| *n == "index.html")).and_then(|(_, b)| std::str::from_utf8(b).ok()) else {
        return ApiError::unavailable("this collector was built without the viewer (build it with `cargo xtask check`, then rebuild the collector)").into_response();
    };
    let html = html.replacen("</head>", "<meta name=\"memory-tracer-server\" content=\"./\" />\n</head>", 1);
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8"), (header::CACHE_CONTROL, "no-cache")], html).into_response()
}

async fn viewer_asset(axum::extract::Path(file): axum::extract::Path<String>) -> Response {
    let found = crate::report::viewer_assets().ok().and_then(|a| a.iter().find(|(n, _)| *n == file && *n != "index.html"));
    match found {
        Some((name, bytes)) => ([(header::CONTENT_TYPE, content_type(name))], *bytes).into_response(),
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
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // pid (comm) state ppid ...: the fields after the last ')'.
            let ppid = stat.rsplit(')').next()?.split_whitespace().nth(1)?;
            (ppid == parent).then(|| e.file_name().to_str()?.parse().ok()).flatten()
        })
        .collect()
}

/// Kills this process's children and waits for them (up to `wait` in all); returns how many
/// there were.
fn reap_children(wait: std::time::Duration) -> usize {
    let kids = child_pids(std::process::id());
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
    kids.len()
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

/// Binds `host:port` and serves until SIGINT or SIGTERM, then stops gracefully: no new
/// connections, answers in flight get `grace` to finish, trace children are killed and
/// reaped, `tmp/` is emptied, and it returns Ok (exit 0). Refuses non-loopback binds without a
/// token. `on_ready` gets the bound address (port 0 picks a free one).
pub async fn serve(host: &str, port: u16, config: ServeConfig, on_ready: impl FnOnce(SocketAddr, &Arc<AppState>)) -> anyhow::Result<()> {
    use anyhow::Context;
    if !is_loopback(host) && config.token.is_none() {
        anyhow::bail!("binding {host} exposes the server to the network: pass --token T (or set MEMORY_TRACER_TOKEN) so every API call needs `Authorization: Bearer T`");
    }
    let state = AppState::new(config)?;
    let listener = tokio::net::TcpListener::bind((host, port)).await.with_context(|| format!("cannot listen on {host}:{port}"))?;
    let addr = listener.local_addr()?;
    on_ready(addr, &state);
    let grace = state.config.shutdown_grace;
    let (stopping_tx, mut stopping) = tokio::sync::watch::channel(false);
    let server = axum::serve(listener, router(state.clone())).with_graceful_shutdown(async move {
        stop_signal().await;
        eprintln!("collector serve: stopping (answers in flight get {} s)", grace.as_secs());
        let _ = stopping_tx.send(true);
    });
    let grace_over = async {
        let _ = stopping.wait_for(|s| *s).await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        r = server => r.context("the server stopped")?,
        () = grace_over => eprintln!("collector serve: grace period over; closing the connections left"),
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
        assert_eq!(parse_device("cuda").as_deref(), Ok("cuda:0"));
        assert_eq!(parse_device("cuda:3").as_deref(), Ok("cuda:3"));
        assert!(parse_device("gpu").is_err());
        assert!(parse_device("cuda:-1").is_err());
    }

    #[test]
    fn tokens_compare_whole() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"ab"));
    }

    #[test]
    fn loopback_hosts() {
        assert!(is_loopback("127.0.0.1") && is_loopback("::1") && is_loopback("localhost"));
        assert!(!is_loopback("0.0.0.0") && !is_loopback("192.168.1.2"));
    }
}
