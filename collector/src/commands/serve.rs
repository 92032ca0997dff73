//! `collector serve` and its hidden import worker: flags to a `ServeConfig`, then the server.

use anyhow::Context;
use std::path::PathBuf;

/// `collector serve` options.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// Address to listen on. Anything but loopback needs --token.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port (0 picks a free one).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Where traces are stored, or with --store this server's own folder (its lock, temporary
    /// files and cache: two servers on one machine take two) [default: $XDG_DATA_HOME/memory-tracer
    /// or ~/.local/share/memory-tracer].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Keep the traces in object storage that several servers share: s3://BUCKET/PREFIX
    /// (credentials, endpoint and region from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    /// AWS_ENDPOINT_URL, AWS_REGION), gs://BUCKET/PREFIX, az://CONTAINER/PREFIX or
    /// file:///PATH. Servers given the same URL see the same traces.
    #[arg(long, value_name = "URL", env = "MEMORY_TRACER_STORE")]
    pub store: Option<String>,
    /// Device of requests that name none: cpu, cuda or cuda:N [default: the first GPU if there
    /// is one, else the CPU].
    #[arg(long)]
    pub device: Option<String>,
    /// A file holding the bearer token every API route then requires (required for
    /// non-loopback hosts); the token is never printed. Or set MEMORY_TRACER_TOKEN. Used
    /// instead of --token and MEMORY_TRACER_TOKEN when given.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// The token itself (visible to other users in the process list: prefer --token-file or
    /// MEMORY_TRACER_TOKEN).
    #[arg(long, env = "MEMORY_TRACER_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Print the viewer's URL with the token in it (`?token=`) at start.
    #[arg(long)]
    pub show_token: bool,
    /// Allow cross-origin requests from this origin (repeat, or `*`); off by default.
    #[arg(long = "cors-origin")]
    pub cors_origins: Vec<String>,
    /// Traces run at the same time on one device.
    #[arg(long, default_value_t = 1)]
    pub jobs_per_device: usize,
    /// Trace requests that may wait; more get 429 with Retry-After.
    #[arg(long, default_value_t = 32)]
    pub max_queue: usize,
    /// A trace running longer is stopped (422).
    #[arg(long, default_value_t = 600)]
    pub job_timeout_s: u64,
    /// Once asked to stop (SIGTERM, Ctrl-C), how long answers in flight may take before the
    /// server kills running traces and exits.
    #[arg(long, default_value_t = 10)]
    pub shutdown_grace_s: u64,
    /// Stored traces kept; adding one more evicts the oldest.
    #[arg(long, default_value_t = 1000)]
    pub max_traces: usize,
    /// Store size (traces and exports), MiB; adding past it evicts the oldest traces.
    #[arg(long, default_value_t = 20480)]
    pub max_store_mb: u64,
    /// Largest upload, MiB (413 beyond).
    #[arg(long, default_value_t = 2048)]
    pub max_upload_mb: u64,
    /// Largest `max_events` a request may ask for (422 beyond).
    #[arg(long, default_value_t = 5_000_000)]
    pub max_events_cap: u64,
    /// Largest input (batch × sample elements) a request may ask for (422 beyond).
    #[arg(long, default_value_t = 1 << 28)]
    pub max_input_elements: u64,
    /// Connections open at once; more are answered 503 and closed.
    #[arg(long, default_value_t = 256)]
    pub max_connections: usize,
    /// Seconds a client may take to send a request's headers (and an idle keep-alive
    /// connection stays open).
    #[arg(long, default_value_t = 15)]
    pub header_timeout_s: u64,
    /// Seconds a request body may go without a byte.
    #[arg(long, default_value_t = 30)]
    pub body_timeout_s: u64,
    /// Uploads read and exports written at once (each in a child process); more wait.
    #[arg(long, default_value_t = 2)]
    pub max_imports: usize,
    /// Uploads and exports that may wait for one of --max-imports; more get 429.
    #[arg(long, default_value_t = 32)]
    pub import_queue: usize,
    /// Memory one upload's import (or one export) may use, MiB; past it the file is refused
    /// (422) and the server is untouched.
    #[arg(long, default_value_t = 4096)]
    pub import_memory_mb: u64,
    /// Seconds one import or export may take (422 beyond).
    #[arg(long, default_value_t = 300)]
    pub import_timeout_s: u64,
    /// Memory a CPU trace process may use, MiB (its address space is capped at this plus what
    /// libtorch maps unused: 4 GiB + 128 MiB per core; 0: no cap) [default: half the
    /// machine's memory]. CUDA trace processes are not capped (CUDA reserves far more address
    /// space than it uses).
    #[arg(long)]
    pub trace_memory_mb: Option<u64>,
    /// TorchScript models requests may name: `DIR/<name>.pt` is `"model_name": "<name>"`
    /// (train mode needs a scripted module with parameters; give `input_shape`).
    #[arg(long, value_name = "DIR")]
    pub models_dir: Option<PathBuf>,
    /// The Python with torch that runs distributed requests (`"world_size"`) under torchrun.
    /// Default: $MEMORY_TRACER_PYTHON, else `python3`.
    #[arg(long, value_name = "PATH")]
    pub python: Option<PathBuf>,
    /// Trace this built-in model once the server is up and open it live in the viewer.
    #[arg(long, value_name = "MODEL")]
    pub trace: Option<String>,
    /// Open the viewer in the default browser.
    #[arg(long)]
    pub open: bool,
}

/// `collector serve`.
pub fn serve_command(a: ServeArgs) -> anyhow::Result<()> {
    use crate::serve::{self, api, ServeConfig};
    let mut config = ServeConfig::new(a.data_dir.unwrap_or_else(serve::default_data_dir));
    config.store = a.store.filter(|s| !s.is_empty());
    config.device = a.device;
    config.token = match &a.token_file {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("cannot read the token file {}", path.display()))?;
            let token = text.trim().to_owned();
            anyhow::ensure!(!token.is_empty(), "the token file {} is empty", path.display());
            Some(token)
        }
        None => a.token.filter(|t| !t.is_empty()),
    };
    config.max_connections = a.max_connections.max(1);
    config.header_timeout = std::time::Duration::from_secs(a.header_timeout_s.max(1));
    config.body_timeout = std::time::Duration::from_secs(a.body_timeout_s.max(1));
    config.isolation = serve::isolate::IsolationLimits {
        memory_budget_bytes: a.import_memory_mb.max(1).saturating_mul(1 << 20),
        timeout: std::time::Duration::from_secs(a.import_timeout_s.max(1)),
        max_running: a.max_imports.max(1),
        max_waiting: a.import_queue,
    };
    if let Some(mb) = a.trace_memory_mb {
        config.trace_address_space_bytes = (mb > 0).then(|| mb.saturating_mul(1 << 20).saturating_add(serve::libtorch_mappings_bytes()));
    }
    config.cors_origins = a.cors_origins;
    config.jobs_per_device = a.jobs_per_device.max(1);
    config.max_queue = a.max_queue;
    config.job_timeout = std::time::Duration::from_secs(a.job_timeout_s.max(1));
    config.shutdown_grace = std::time::Duration::from_secs(a.shutdown_grace_s);
    config.max_traces = a.max_traces.max(1);
    config.max_store_bytes = a.max_store_mb.saturating_mul(1 << 20);
    config.max_upload_bytes = a.max_upload_mb.saturating_mul(1 << 20);
    config.caps.max_events = a.max_events_cap.max(1);
    config.caps.max_input_elements = a.max_input_elements.max(1);
    config.models_dir = a.models_dir;
    if let Some(p) = a.python {
        config.python = p;
    }
    let token = config.token.clone();
    let (host, port, open, trace, show_token) = (a.host, a.port, a.open, a.trace, a.show_token);
    if let Some(m) = &trace {
        anyhow::ensure!(
            protocol::MODEL_ZOO.contains(&m.as_str()),
            "--trace {m}: unknown model; built-in models: {}",
            protocol::MODEL_ZOO.join(", ")
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime")?;
    runtime.block_on(serve::serve(&host, port, config, move |addr, state| {
        let shown = if addr.ip().is_unspecified() { format!("127.0.0.1:{}", addr.port()) } else { addr.to_string() };
        let base = format!("http://{shown}/");
        let mut query = Vec::new();
        if let Some(model) = trace {
            let req = protocol::TraceRequest::of_model(&model, 5_000_000);
            match api::start_job(state, req) {
                Ok(id) => {
                    eprintln!("tracing {model} on {} as {id} ...", state.device);
                    query.push(format!("follow={id}"));
                }
                Err(e) => eprintln!("cannot trace {model}: {}", e.detail),
            }
        }
        // The token goes only where it was asked for: the browser --open starts, and the
        // printed URL with --show-token.
        let url_with = |token: Option<&str>| {
            let q: Vec<String> = token.map(|t| format!("token={}", encode_query(t))).into_iter().chain(query.iter().cloned()).collect();
            if q.is_empty() {
                base.clone()
            } else {
                format!("{base}?{}", q.join("&"))
            }
        };
        let url = url_with(token.as_deref());
        eprintln!("Memory Tracer is serving {} on {addr}", state.store.location());
        match &token {
            Some(_) if !show_token => {
                eprintln!("  viewer:   {} (add token=<your token> to the query; --show-token prints it)", url_with(None))
            }
            _ => eprintln!("  viewer:   {url}"),
        }
        eprintln!("  API docs: {base}api/docs (ReDoc: {base}api/redoc)");
        eprintln!("  stop with Ctrl-C");
        // $BROWSER, else the desktop's opener (xdg-open, WSL's wslview, macOS's open).
        if open {
            crate::serve::opening_browser(&url);
            if opener::open_browser(&url).is_err() {
                eprintln!("  (cannot open a browser here: open the viewer's URL yourself)");
            }
        }
    }))
}

/// A query parameter's value, percent-encoded.
fn encode_query(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
