//! The server's state: its configuration and caps, and what every handler shares (the store,
//! the job queue, the import isolation, the device). Below the API: it knows the layers it
//! holds and no HTTP.

use super::fault::Fault;
use super::{isolate, jobs, store};
use std::path::PathBuf;
use std::sync::Arc;

/// Largest JSON body a route accepts.
pub const JSON_BODY_LIMIT: usize = 64 * 1024;

pub use protocol::TORCH_VERSION;

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
        Self { max_events: 5_000_000, max_batch_size: 4096, max_input_elements: 1 << 28, max_iterations: 100, max_world_size: 8 }
    }
}

/// Everything `collector serve` is told.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The server's own folder: the traces (without `store`), its lock, temporary files and
    /// (with `store`) its cache of the bucket.
    pub data_dir: PathBuf,
    /// Object storage shared by several servers (`s3://BUCKET/PREFIX`, `gs://`, `az://`,
    /// `file://`) that holds the traces instead of `data_dir`.
    pub store: Option<String>,
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
    /// How long a client may take to send a request's headers (also how long an idle
    /// keep-alive connection stays open). Default is 15 s.
    pub header_timeout: std::time::Duration,
    /// How long a request body may go without sending a byte. Default is 30 s.
    pub body_timeout: std::time::Duration,
    /// Connections open at once; more are answered 503 and closed. Default is 256.
    pub max_connections: usize,
    /// Limits of the child processes that import uploads and write exports.
    pub isolation: isolate::IsolationLimits,
    /// Address-space limit (RLIMIT_AS) of CPU trace processes; `None`: no limit. Default is
    /// half the machine's memory plus [`libtorch_mappings_bytes`].
    pub trace_address_space_bytes: Option<u64>,
}

/// Address space a libtorch process maps without using it, what a CPU trace process's limit
/// adds to its memory budget: 4 GiB of libraries (about 2.9 GiB measured with torch 2.11), and
/// per core a thread's stack and malloc arena (64 MiB each, reserved, mostly untouched).
pub fn libtorch_mappings_bytes() -> u64 {
    let cores = std::thread::available_parallelism().map_or(8, |n| n.get() as u64);
    (4 << 30) + cores * (128 << 20)
}

/// The machine's memory (MemTotal), when /proc says.
pub fn physical_memory_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = info.lines().find_map(|l| l.strip_prefix("MemTotal:"))?.split_whitespace().next()?.parse().ok()?;
    Some(kib << 10)
}

impl ServeConfig {
    pub fn new(data_dir: PathBuf) -> Self {
        Self {
            data_dir,
            store: None,
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
            header_timeout: std::time::Duration::from_secs(15),
            body_timeout: std::time::Duration::from_secs(30),
            max_connections: 256,
            isolation: isolate::IsolationLimits::default(),
            trace_address_space_bytes: physical_memory_bytes().map(|m| m / 2 + libtorch_mappings_bytes()),
        }
    }
}

/// The default data directory: `$XDG_DATA_HOME/memory-tracer`, else
/// `~/.local/share/memory-tracer`, else `./memory-tracer-data`.
pub fn default_data_dir() -> PathBuf {
    dirs::data_dir().map_or_else(|| PathBuf::from("memory-tracer-data"), |d| d.join("memory-tracer"))
}

/// How many CUDA devices the driver reports (0 without a driver).
fn cuda_device_count() -> u32 {
    device::count().max(0) as u32
}

/// The server's shared state.
#[derive(Debug)]
pub struct AppState {
    pub config: ServeConfig,
    pub store: Arc<store::Store>,
    pub jobs: Arc<jobs::Jobs>,
    /// The default device.
    pub device: String,
    pub cuda_devices: u32,
    /// The children that import uploads and write exports, and the slots they run in.
    pub isolation: isolate::Isolation,
    /// SHA-256 of the token: requests' tokens are hashed and compared with it in constant
    /// time, so neither the bytes nor the length leak through timing.
    pub(super) token_digest: Option<[u8; 32]>,
    /// Whether models can be traced (`collector-capture` was found).
    pub tracing: bool,
    /// Stored traces opened for exploring over HTTP (`/api/trace/{id}/explore`).
    pub sessions: Sessions,
}

/// An explorer session of a stored trace: the trace imported natively once, its analyses,
/// and the overview the page draws first.
pub struct Explored {
    pub session: std::sync::Mutex<shared::explore::Session>,
    pub overview: Arc<shared::explore::Overview>,
}

impl std::fmt::Debug for Explored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Explored").finish_non_exhaustive()
    }
}

/// The stored traces open for exploring, most recent last; the oldest is closed when more than
/// [`Sessions::KEPT`] are open (each holds its trace in memory).
#[derive(Debug, Default)]
pub struct Sessions {
    open: std::sync::Mutex<std::collections::VecDeque<(String, Arc<Explored>)>>,
}

impl Sessions {
    pub const KEPT: usize = 2;

    /// The open session of `id`, made the most recent.
    pub fn get(&self, id: &str) -> Option<Arc<Explored>> {
        let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let k = open.iter().position(|(i, _)| i == id)?;
        let e = open.remove(k)?;
        let found = e.1.clone();
        open.push_back(e);
        Some(found)
    }

    pub fn insert(&self, id: &str, e: Arc<Explored>) {
        let mut open = self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        open.retain(|(i, _)| i != id);
        open.push_back((id.to_owned(), e));
        while open.len() > Self::KEPT {
            open.pop_front();
        }
    }

    /// Closes `id`'s session (its trace was deleted).
    pub fn forget(&self, id: &str) {
        self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner).retain(|(i, _)| i != id);
    }
}

impl AppState {
    /// Opens the store and checks the device.
    pub fn new(config: ServeConfig) -> anyhow::Result<Arc<Self>> {
        use anyhow::Context;
        let cuda_devices = cuda_device_count();
        let device = match &config.device {
            Some(d) => device::parse(d).map_err(anyhow::Error::msg)?,
            None if cuda_devices > 0 => "cuda:0".into(),
            None => "cpu".into(),
        };
        let limits = store::StoreLimits { max_traces: config.max_traces.max(1), max_bytes: config.max_store_bytes };
        let store = store::Store::open(&config.data_dir, config.store.as_deref(), limits).with_context(|| match &config.store {
            Some(url) => format!("cannot open the trace store {url} (with {} as this server's folder)", config.data_dir.display()),
            None => format!("cannot open the trace store in {}", config.data_dir.display()),
        })?;
        let collector = match &config.collector_exe {
            Some(p) => p.clone(),
            None => std::env::current_exe().context("cannot find this collector's binary to run traces and imports with")?,
        };
        // Models run in `collector-capture` (the trace children exec it); without it the server
        // stores, exports and serves traces only.
        let tracing = crate::capture_binary::binary().is_some();
        let exe = tracing.then(|| collector.clone());
        let store = Arc::new(store);
        let limits = jobs::JobLimits {
            per_device: config.jobs_per_device,
            max_queue: config.max_queue,
            timeout: config.job_timeout,
            address_space_bytes: config.trace_address_space_bytes,
        };
        let jobs = Arc::new(jobs::Jobs::new(exe, store.clone(), limits));
        let isolation = isolate::Isolation::new(collector, config.isolation.clone());
        let token_digest = config.token.as_deref().map(|t| sha256(t.as_bytes()));
        let state =
            Arc::new(Self { config, store, jobs, device, cuda_devices, isolation, token_digest, tracing, sessions: Sessions::default() });
        if let Err(e) = state.check_device(&state.device) {
            anyhow::bail!("--device {}: {e}", state.device);
        }
        Ok(state)
    }

    /// 503 when `device` is a CUDA device this machine does not have.
    pub fn check_device(&self, device: &str) -> Result<(), Fault> {
        if let Some(n) = device.strip_prefix("cuda:") {
            let n: u32 = n.parse().unwrap_or(u32::MAX);
            if self.cuda_devices == 0 {
                return Err(Fault::Unavailable(format!(
                    "CUDA is not available on this server ({device} was asked for); use \"device\": \"cpu\""
                )));
            }
            if n >= self.cuda_devices {
                return Err(Fault::Unavailable(format!(
                    "{device} was asked for, but this server has {} CUDA device(s)",
                    self.cuda_devices
                )));
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

    /// The explorer session of a stored trace, opened (imported natively, in this process)
    /// on first use. Blocking: run it off the async runtime.
    pub fn explore(&self, t: &protocol::StoredTrace) -> Result<Arc<Explored>, Fault> {
        if let Some(e) = self.sessions.get(&t.trace_id) {
            return Ok(e);
        }
        let path = self.store.trace_path(t)?;
        let file = std::fs::File::open(&path).map_err(|e| Fault::internal("cannot read a stored trace", e))?;
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        let name = t.original_name.clone().unwrap_or_else(|| t.file.clone());
        let file =
            traceio::read_ahead::ReadAhead::new(file).map_err(|e| Fault::internal("cannot start a thread to read a stored trace", e))?;
        let opened = shared::explore::Session::open_reader(&name, size, file, |_| {}).map_err(|e| Fault::Rejected(e.to_string()))?;
        let shared::explore::Opened::Trace(session, overview) = opened else {
            return Err(Fault::Rejected(format!("{name} is a sweep (curves only): open one of its traces")));
        };
        let e = Arc::new(Explored { session: std::sync::Mutex::new(*session), overview: Arc::new(*overview) });
        self.sessions.insert(&t.trace_id, e.clone());
        Ok(e)
    }

    /// Reads a stored trace back.
    pub fn load(&self, t: &protocol::StoredTrace) -> Result<shared::Trace, Fault> {
        traceio::files::load_trace(&self.store.trace_path(t)?, &self.import_options())
            .map_err(|e| Fault::internal("cannot read a stored trace", e))
    }
}

pub(super) fn sha256(bytes: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).into()
}
