//! Tracing users' own Python programs: `collector trace -- python train.py ...`.
//!
//! The collector listens on a private Unix socket and starts the command with the
//! `memory_tracer` package's bootstrap on PYTHONPATH ([`package`]). Every Python process of the
//! command that imports torch loads the shim (built against the same libtorch), connects once
//! and streams its records while it runs ([`wire`]); the collector keeps each process's stream
//! and, when the command ends, assembles each into a [`Trace`] with the same code as
//! `collector trace --model` ([`record::assemble`]). A process that runs the recorder
//! fallback instead (PyTorch's own CUDA memory history, [`history`]) writes snapshots into
//! the socket's private folder and names them on its stream. The command's stdin, stdout and
//! stderr are its own; its exit status becomes the collector's. With `--serve URL` the run is
//! followed live and stored by a `collector serve` ([`client`]).

mod client;
pub mod history;
pub mod package;
pub mod wire;

use anyhow::Context;
use protocol::frames::{CaptureOptions, End, Hello};
use record::assemble::{self, Captured};
use record::live::{decimate, LiveDevice, LivePoint, LiveTotals, LIVE_POINTS_PER_REPORT};
use record::{self as ffi, MtCounters, MtDeviceStats};

use shared::model::{Device, EventType, SourceFormat, Totals, TraceMeta};
use shared::Trace;
use std::io::ErrorKind;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use wire::ProcessStream;

pub use client::{upload, LiveClient, NodeIdentity, Uploaded};

/// Which device's memory a trace keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceFilter {
    Cpu,
    /// CUDA memory (all CUDA devices of the process); the index picks whose counters to report.
    Cuda(Option<i8>),
}

impl std::str::FromStr for DeviceFilter {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "cuda" {
            return Ok(Self::Cuda(None)); // whichever CUDA device the program uses
        }
        match device::parse(s)?.strip_prefix("cuda:") {
            None => Ok(Self::Cpu),
            Some(n) => n.parse::<i8>().map(|n| Self::Cuda(Some(n))).map_err(|_| format!("device `{s}`: at most 127 CUDA devices")),
        }
    }
}

/// Which operators a traced program records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OpsMode {
    /// Every operator, with its tensors when asked (full fidelity: op names per allocation,
    /// activation liveness; costs about a microsecond per operator).
    All,
    /// Only autograd nodes: forward allocations take the module scope, backward ones the module
    /// whose forward made the node (sequence numbers), at a fraction of the cost.
    Backward,
    /// No operator callback: memory, module scopes, phases and iterations only.
    None,
}

impl std::str::FromStr for OpsMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "all" => Ok(Self::All),
            "backward" => Ok(Self::Backward),
            "none" => Ok(Self::None),
            _ => Err(format!("invalid --ops `{s}`; expected all, backward or none")),
        }
    }
}

/// Which capture a traced Python process runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum CaptureMode {
    /// The native capture when a capture library fits the process's torch (or can be built
    /// for it), else PyTorch's recorder.
    #[default]
    Auto,
    /// The native capture only: a process whose torch no library fits does not run (exit 97).
    Native,
    /// PyTorch's recorder (`torch.cuda.memory._record_memory_history`): CUDA memory only, no
    /// operators, the trace when the process ends.
    Recorder,
}

impl CaptureMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Native => "native",
            Self::Recorder => "recorder",
        }
    }
}

/// How to trace a program.
#[derive(Clone, Debug)]
pub struct PyOptions {
    pub max_events: u64,
    pub capture_tensors: bool,
    pub ops: OpsMode,
    /// Each nn.Module call opens a scope (its path); off: allocations keep their phase and
    /// iteration but no module (the cheapest capture).
    pub module_scopes: bool,
    /// A module path or class name whose every call is one iteration (programs without an
    /// optimizer).
    pub iteration_marker: Option<String>,
    /// Records the program may hold before the collector drains them; more are dropped and
    /// counted.
    pub buffer_records: u64,
    pub fragmentation: bool,
    /// None: CUDA memory when the process allocated any, else CPU memory.
    pub device: Option<DeviceFilter>,
    /// How long to wait for processes still streaming after the command exited.
    pub grace: Duration,
    /// How often the program's drain thread sends what was recorded.
    pub drain_interval_ms: u32,
    /// Which capture processes run. Default is [`CaptureMode::Auto`].
    pub capture: CaptureMode,
    /// Record who holds each storage (`CaptureOptions::holders`).
    pub holders: u8,
    /// The device ledger (`CaptureOptions::ledger`).
    pub ledger: bool,
}

impl Default for PyOptions {
    fn default() -> Self {
        Self {
            max_events: 5_000_000,
            capture_tensors: true,
            ops: OpsMode::Backward,
            module_scopes: true,
            iteration_marker: None,
            buffer_records: 8_000_000,
            fragmentation: true,
            device: None,
            grace: Duration::from_secs(10),
            drain_interval_ms: 20,
            capture: CaptureMode::Auto,
            holders: 0,
            ledger: false,
        }
    }
}

impl PyOptions {
    /// What the traced process is asked to do (`MEMORY_TRACER_OPTIONS`).
    fn capture_options(&self) -> CaptureOptions {
        CaptureOptions {
            max_events: self.max_events,
            max_ops: self.max_events,
            capture_tensors: self.capture_tensors && self.ops == OpsMode::All,
            capture_ops: match self.ops {
                OpsMode::None => 0,
                OpsMode::All => 1,
                OpsMode::Backward => 2,
            },
            module_scopes: self.module_scopes,
            iteration_marker: self.iteration_marker.clone(),
            buffer_records: self.buffer_records,
            interval_ms: self.drain_interval_ms,
            capture: self.capture.as_str().to_owned(),
            holders: self.holders,
            ledger: self.ledger,
        }
    }
}

/// CLOCK_MONOTONIC, the clock the shim stamps records with (std::chrono::steady_clock).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

/// What running a command produced.
#[derive(Debug)]
pub struct Outcome {
    pub status: ExitStatus,
    /// One stream per process that connected, in connection order.
    pub processes: Vec<ProcessStream>,
    /// The collector was asked to stop (SIGINT or SIGTERM) while the command ran.
    pub interrupted: bool,
    /// The socket's folder, where recorder processes left their snapshots: kept until the
    /// outcome is dropped (after the traces are built).
    _dir: SocketDir,
}

impl Outcome {
    /// The exit code to pass on: the command's, or 128 + the signal that ended it.
    pub fn exit_code(&self) -> i32 {
        use std::os::unix::process::ExitStatusExt;
        self.status.code().unwrap_or_else(|| 128 + self.status.signal().unwrap_or(0))
    }
}

static SIGNALS: AtomicU32 = AtomicU32::new(0);
const GOT_INT: u32 = 1;
const GOT_TERM: u32 = 2;

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNALS.fetch_or(if sig == libc::SIGINT { GOT_INT } else { GOT_TERM }, Ordering::SeqCst);
}

/// From now on SIGINT and SIGTERM only set flags: the collector outlives the command to write
/// what it captured.
fn catch_signals() {
    // SAFETY: installs an async-signal-safe handler (one atomic OR) for two signals.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}

fn send_signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// A private folder for the socket (mode 0700) and the recorder's snapshots, removed on drop.
#[derive(Debug)]
struct SocketDir(PathBuf);

impl SocketDir {
    fn new() -> anyhow::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let dir = std::env::temp_dir().join(format!("memory-tracer-{}-{nanos}", std::process::id()));
        std::fs::DirBuilder::new().mode(0o700).create(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(Self(dir))
    }
}

impl Drop for SocketDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Reader {
    stream: UnixStream,
    handle: std::thread::JoinHandle<ProcessStream>,
}

/// Memory totals of the processes as they arrive, by rank (`None`: not a torchrun rank).
type LiveBuffer = Arc<Mutex<Vec<(Option<u32>, Vec<LivePoint>)>>>;

/// `live`: where to put memory totals as they arrive, timed from `t0`. Processes of a
/// torchrun job each add their rank's points; of other commands only the first process
/// (`first`), so a live view shows one curve per rank or the program's one.
fn spawn_reader(stream: UnixStream, live: LiveBuffer, first: bool, t0: u64) -> anyhow::Result<Reader> {
    stream.set_nonblocking(false)?;
    let read_side = stream.try_clone()?;
    let handle = std::thread::Builder::new().name("capture-reader".into()).spawn(move || {
        let mut totals = LiveTotals::new(t0, LiveDevice::Auto);
        wire::read_stream(std::io::BufReader::with_capacity(1 << 20, read_side), &mut |hello, recs| {
            let rank = hello.and_then(Hello::rank);
            if rank.is_none() && !first {
                return;
            }
            let points = totals.points(recs);
            if points.is_empty() {
                return;
            }
            let mut live = live.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match live.iter_mut().find(|(r, _)| *r == rank) {
                Some((_, v)) => v.extend(points),
                None => live.push((rank, points)),
            }
        })
    })?;
    Ok(Reader { stream, handle })
}

/// Runs `command` with the capture injected and collects every process's stream.
/// `on_live` gets memory points while the command runs (for live views).
pub fn run(command: &[String], opts: &PyOptions, on_live: &mut dyn FnMut(Option<u32>, &[LivePoint])) -> anyhow::Result<Outcome> {
    let Some(program) = command.first() else {
        anyhow::bail!("no command given after `--`; expected e.g. `collector trace -- python train.py`");
    };
    let pkg = package::python_path()?;
    let dir = SocketDir::new()?;
    let sock = dir.0.join("capture.sock");
    let listener = UnixListener::bind(&sock).with_context(|| format!("cannot listen on {}", sock.display()))?;
    listener.set_nonblocking(true)?;

    let mut pythonpath = std::env::join_paths([pkg.join("memory_tracer/_bootstrap"), pkg.clone()])?;
    if let Some(old) = std::env::var_os("PYTHONPATH").filter(|p| !p.is_empty()) {
        pythonpath.push(":");
        pythonpath.push(old);
    }
    let mut cmd = Command::new(program);
    cmd.args(&command[1..])
        .env("PYTHONPATH", pythonpath)
        .env("MEMORY_TRACER_SOCKET", &sock)
        // A struct of numbers, booleans and strings: serialising it cannot fail.
        .env("MEMORY_TRACER_OPTIONS", serde_json::to_string(&opts.capture_options()).unwrap_or_default());
    if let Ok(exe) = std::env::current_exe() {
        cmd.env("MEMORY_TRACER_COLLECTOR", exe);
    }
    let t0 = monotonic_ns();
    let mut child = cmd.spawn().map_err(|e| match e.kind() {
        ErrorKind::NotFound => anyhow::anyhow!("cannot run `{program}`: no such program (is it on PATH?)"),
        ErrorKind::PermissionDenied => anyhow::anyhow!("cannot run `{program}`: permission denied"),
        _ => anyhow::anyhow!("cannot run `{program}`: {e}"),
    })?;
    catch_signals();

    let live: LiveBuffer = Arc::new(Mutex::new(Vec::new()));
    let mut readers: Vec<Reader> = Vec::new();
    let accept = |readers: &mut Vec<Reader>| loop {
        match listener.accept() {
            Ok((stream, _)) => match spawn_reader(stream, live.clone(), readers.is_empty(), t0) {
                Ok(r) => readers.push(r),
                Err(e) => eprintln!("collector: cannot read a process's capture: {e:#}"),
            },
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                eprintln!("collector: accepting a capture connection failed: {e}");
                break;
            }
        }
    };
    let flush_live = |on_live: &mut dyn FnMut(Option<u32>, &[LivePoint])| {
        let ranks = std::mem::take(&mut *live.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        for (rank, points) in ranks {
            on_live(rank, &decimate(points, LIVE_POINTS_PER_REPORT));
        }
    };
    let mut interrupted_at: Option<Instant> = None;
    let mut forwarded_int = false;
    let mut forwarded_term = false;
    let status = loop {
        accept(&mut readers);
        flush_live(on_live);
        if let Some(status) = child.try_wait()? {
            break status;
        }
        let got = SIGNALS.load(Ordering::SeqCst);
        if got & GOT_TERM != 0 && !forwarded_term {
            send_signal(child.id(), libc::SIGTERM);
            forwarded_term = true;
        }
        if got & GOT_INT != 0 {
            // Ctrl-C reaches the whole process group; forward it only if the command did
            // not get it (kill -INT aimed at the collector alone).
            let at = *interrupted_at.get_or_insert_with(Instant::now);
            if !forwarded_int && at.elapsed() > Duration::from_secs(2) {
                send_signal(child.id(), libc::SIGINT);
                forwarded_int = true;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // Processes that outlive the command (grandchildren still finishing) get a grace period.
    let deadline = Instant::now() + opts.grace;
    loop {
        accept(&mut readers);
        flush_live(on_live);
        if readers.iter().all(|r| r.handle.is_finished()) || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut processes = Vec::new();
    for r in readers {
        let in_time = r.handle.is_finished();
        if !in_time {
            let _ = r.stream.shutdown(std::net::Shutdown::Both);
        }
        match r.handle.join() {
            Ok(mut p) => {
                if !in_time && p.end.is_none() {
                    p.error = Some(format!("still streaming {} s after the command exited; cut off", opts.grace.as_secs()));
                }
                p.snapshot_dir = Some(dir.0.clone());
                processes.push(p);
            }
            Err(_) => eprintln!("collector: a capture reader failed"),
        }
    }
    Ok(Outcome { status, processes, interrupted: SIGNALS.load(Ordering::SeqCst) != 0, _dir: dir })
}

/// Reads one process's stream from an inherited socket (`collector ingest --fd N`, what the
/// Python MemoryTracer API starts).
pub fn ingest_fd(fd: i32) -> anyhow::Result<ProcessStream> {
    use std::os::fd::FromRawFd;
    // SAFETY: fstat on a caller-given descriptor only reads; checks it is a socket before we
    // take ownership of it.
    let is_socket = unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstat(fd, &mut st) == 0 && (st.st_mode & libc::S_IFMT) == libc::S_IFSOCK
    };
    if fd < 0 || !is_socket {
        anyhow::bail!("--fd {fd} is not an open socket; expected the descriptor of the socket the capture writes to");
    }
    // SAFETY: the descriptor is an open socket handed to this process, owned from here on.
    let stream = unsafe { UnixStream::from_raw_fd(fd) };
    Ok(wire::read_stream(std::io::BufReader::with_capacity(1 << 20, stream), &mut |_, _| {}))
}

/// The process's rank under torchrun (its `RANK`), if it had one.
pub fn rank(p: &ProcessStream) -> Option<u64> {
    p.hello.as_ref().and_then(Hello::rank).map(u64::from)
}

/// The samples of CUDA device `index` in one of the end frame's lists (`[ts_ns, device, a, b]`,
/// on the shim's clock): (time from the capture's start, a, b).
fn samples_of(list: &[(u64, i64, u64, u64)], index: i8, start_ns: u64) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
    list.iter().filter(move |s| s.1 == i64::from(index)).map(move |&(ts, _, a, b)| (ts.saturating_sub(start_ns), a, b))
}

/// The driver's samples of CUDA device `index` (used and total bytes); they belong to the
/// trace's one device.
fn device_samples(end: Option<&End>, index: i8, start_ns: u64) -> Vec<shared::model::DeviceSample> {
    samples_of(end.map_or(&[][..], |e| &e.device_samples), index, start_ns)
        .map(|(ts_ns, used_bytes, total_bytes)| shared::model::DeviceSample { ts_ns, device: 0, used_bytes, total_bytes })
        .collect()
}

/// The ledger's NVML samples of CUDA device `index` (this process's bytes and the others'), on
/// the trace's one device.
fn process_samples(end: Option<&End>, index: i8, start_ns: u64) -> Vec<shared::model::ProcessSample> {
    samples_of(end.map_or(&[][..], |e| &e.process_samples), index, start_ns)
        .map(|(ts_ns, process_bytes, other_processes_bytes)| shared::model::ProcessSample {
            ts_ns,
            device: 0,
            process_bytes,
            other_processes_bytes,
        })
        .collect()
}

/// The distributed job a process belongs to: torchrun's run id and rendezvous address, the
/// same on every rank of every node of one job.
fn job_of(env: &std::collections::BTreeMap<String, String>) -> Option<String> {
    env.get("RANK")?;
    let get = |k: &str| env.get(k).map_or("", String::as_str);
    Some(format!("{}@{}:{}", get("TORCHELASTIC_RUN_ID"), get("MASTER_ADDR"), get("MASTER_PORT")))
}

/// The job's world size, as the process's `WORLD_SIZE`.
pub fn world_size(p: &ProcessStream) -> Option<u32> {
    p.hello.as_ref()?.world_size()
}

/// Whether the stream carries anything to build a trace from (a recorder process always
/// does: its trace says what it recorded, or why nothing).
pub fn has_capture(p: &ProcessStream) -> bool {
    p.hello.is_some() && (!p.records.is_empty() || history::is_recorder(p))
}

/// Which capture ran in the process, as the summary says it: `capture: native (torch 2.11,
/// library built for torch 2.11.0)` (or `built on first use for torch ...`),
/// or the recorder's note (its reason, what it cannot record).
pub fn capture_line(p: &ProcessStream) -> String {
    if history::is_recorder(p) {
        return history::capture_note(p.hello.as_ref().and_then(|h| h.reason.as_deref()).unwrap_or("no reason given"));
    }
    let torch = p.hello.as_ref().and_then(|h| h.torch_version.as_deref()).unwrap_or("unknown");
    let minor: Vec<&str> = torch.split(['.', '+']).take(2).collect();
    match p.hello.as_ref().and_then(|h| h.library.as_deref()) {
        Some(how) => format!("capture: native (torch {}, library {how})", minor.join(".")),
        None => format!("capture: native (torch {})", minor.join(".")),
    }
}

/// What a process told the collector without a capture (no torch, a torch the shim cannot
/// serve, a capture that failed to start), as one line each.
pub fn notes_text(p: &ProcessStream) -> Vec<String> {
    p.notes
        .iter()
        .filter(|n| n.kind != history::SNAPSHOT_NOTE)
        .map(|n| {
            let pid = n.pid.unwrap_or(0);
            let exe = n.executable.as_deref().unwrap_or("python");
            let detail = n.detail.as_deref();
            match n.kind.as_str() {
                "no_torch" => format!("process {pid} ({exe}) has no torch installed, so nothing of it was traced"),
                "torch_mismatch" => detail.unwrap_or("torch version mismatch").to_owned(),
                "capture_failed" => format!("process {pid}: the capture could not start: {}", detail.unwrap_or("unknown error")),
                "malformed" => format!("process {pid}: a note that does not read: {}", detail.unwrap_or("")),
                kind => format!("process {pid}: a note of kind `{kind}`{}", detail.map(|d| format!(": {d}")).unwrap_or_default()),
            }
        })
        .collect()
}

/// A short name for the program of a stream: the script, `-m module`, or the executable.
pub fn program_name(p: &ProcessStream) -> String {
    p.hello.as_ref().map_or_else(|| "python".into(), program_of)
}

/// [`program_name`] from a capture header.
fn program_of(hello: &Hello) -> String {
    let argv: Vec<&str> = hello.argv.iter().map(String::as_str).collect();
    let mut it = argv.iter().skip(1);
    while let Some(a) = it.next() {
        match *a {
            "-m" => return it.next().map_or_else(|| "python".into(), |m| format!("-m {m}")),
            "-c" => return "python -c".into(),
            "-X" | "-W" => {
                it.next();
            }
            _ if a.starts_with('-') => {}
            script => return Path::new(script).file_name().map_or_else(|| script.to_owned(), |f| f.to_string_lossy().into_owned()),
        }
    }
    argv.first().map_or_else(|| "python".into(), |s| (*s).to_owned())
}

fn counters_of(end: Option<&End>) -> MtCounters {
    let c = end.map(|e| e.counters).unwrap_or_default();
    MtCounters {
        mem_kept: c.mem_kept,
        mem_dropped: c.mem_dropped,
        op_kept: c.op_kept,
        op_dropped: c.op_dropped,
        peak_allocated: c.peak_allocated,
        peak_reserved: c.peak_reserved,
        buffer_dropped: c.buffer_dropped,
    }
}

/// How a trace's warning about frame fields this collector does not know begins.
pub const UNKNOWN_FIELDS: &str = "the capture sent fields this collector does not read";

/// Builds the trace of one process's stream.
pub fn build_trace(mut p: ProcessStream, opts: &PyOptions) -> Result<Trace, String> {
    let capture = capture_line(&p);
    let unknown = std::mem::take(&mut p.unknown_fields);
    let mut trace = if history::is_recorder(&p) { history::build_trace(p, opts)? } else { build_native_trace(p, opts)? };
    trace.meta.capture = Some(capture.strip_prefix("capture: ").unwrap_or(&capture).to_owned());
    if !unknown.is_empty() {
        trace.meta.warnings.push(format!(
            "{UNKNOWN_FIELDS}: {} (the traced program's memory_tracer package is newer than this collector?)",
            unknown.join(", ")
        ));
    }
    Ok(trace)
}

/// [`build_trace`] of a process the native capture recorded.
fn build_native_trace(mut p: ProcessStream, opts: &PyOptions) -> Result<Trace, String> {
    let Some(hello) = p.hello.take() else {
        return Err("the process sent no capture header".into());
    };
    let start_ns = hello.start_ns.ok_or("the capture header has no start_ns")?;
    let filter = opts.device.unwrap_or_else(|| {
        let mut per_device = std::collections::BTreeMap::<i8, u64>::new();
        for r in p.records.iter().filter(|r| r.kind == ffi::MT_MEM && r.device_type == 1) {
            *per_device.entry(r.device_index).or_default() += 1;
        }
        match per_device.iter().max_by_key(|(_, n)| **n) {
            Some((d, _)) => DeviceFilter::Cuda(Some(*d)),
            None => DeviceFilter::Cpu,
        }
    });
    let cuda_index = match filter {
        DeviceFilter::Cpu => None,
        DeviceFilter::Cuda(i) => Some(i.unwrap_or(0)),
    };
    // A CUDA trace keeps device memory only (host scalars and index tensors would interleave
    // another device's totals), a CPU trace host memory only.
    let keep_type: i8 = if cuda_index.is_some() { 1 } else { 0 };
    p.records.retain(|r| !(matches!(r.kind, ffi::MT_MEM | ffi::MT_OOM) && r.device_type != keep_type));

    let end = p.end.take();
    let cuda_entry = cuda_index.and_then(|i| end.as_ref()?.cuda.iter().find(|d| d.device == Some(i64::from(i))).cloned());
    let cuda_stats = cuda_entry.as_ref().map(|d| MtDeviceStats {
        allocated_current: d.allocated_current.unwrap_or(0),
        allocated_peak: d.allocated_peak.unwrap_or(0),
        reserved_current: d.reserved_current.unwrap_or(0),
        reserved_peak: d.reserved_peak.unwrap_or(0),
        num_alloc_retries: d.num_alloc_retries.unwrap_or(0),
        num_ooms: d.num_ooms.unwrap_or(0),
    });
    let base_totals = match cuda_index {
        None => vec![(Device { kind: "cpu".into(), index: 0, rank: None }, Totals::default())],
        Some(i) => {
            let base = hello.base_totals.iter().find(|d| d.device == i64::from(i)).copied().unwrap_or_default();
            vec![(
                Device { kind: "cuda".into(), index: i32::from(i), rank: None },
                Totals { allocated_bytes: base.allocated, reserved_bytes: base.reserved },
            )]
        }
    };

    let mut meta = TraceMeta::new(SourceFormat::MemoryTracer);
    meta.model = Some(program_of(&hello));
    meta.pytorch_version.clone_from(&hello.torch_version);
    meta.start_unix_ns = hello.start_unix_ns;
    meta.fragmentation_tracked = opts.fragmentation;
    if let Some(d) = &cuda_entry {
        meta.device_name.clone_from(&d.name);
        meta.device_total_memory_bytes = d.total_memory;
    } else if cuda_index.is_none() {
        meta.device_name = Some("CPU".into());
    }
    let captured = Captured {
        records: std::mem::take(&mut p.records),
        strings: std::mem::take(&mut p.strings),
        counters: counters_of(end.as_ref()),
        start_ns,
        base_totals,
        cuda_stats,
        holders: std::mem::take(&mut p.holders),
    };
    let mut trace = assemble::assemble(&captured, meta);
    report_env(&mut trace, &hello);
    if cuda_index.is_some() {
        record_allocator_settings(&mut trace, &hello, end.as_ref(), start_ns);
    }
    if let Some(i) = cuda_index {
        trace.device_samples = device_samples(end.as_ref(), i, start_ns);
        trace.ledger.process = process_samples(end.as_ref(), i, start_ns);
        trace.ledger.missing.extend(end.iter().flat_map(|e| e.ledger_missing.iter().cloned()));
        attach_private_pools(&mut trace, end.as_ref(), i);
    }
    match &end {
        Some(e) => {
            trace.meta.warnings.extend(e.notes.iter().cloned());
            trace.meta.compiled = e.compiled.clone();
            trace.meta.lines_unnamed = e.lines_unnamed.clone();
        }
        None => trace.meta.warnings.push(
            "the process ended without closing its capture (killed, crashed or os._exit): the trace holds what it streamed until then"
                .into(),
        ),
    }
    if let Some(e) = &p.error {
        trace.meta.warnings.push(format!("the capture stream was cut: {e}"));
    }
    if cuda_index.is_some() && cuda_stats.is_none() {
        trace.meta.warnings.push("the process did not report the CUDA allocator's own counters at its end".into());
    }
    Ok(trace)
}

/// Gives the allocations made inside a private pool's segment (CUDA graphs,
/// `torch.cuda.MemPool`; the segments the process reported at its end, `private_pools`) that
/// pool. A segment freed before the end is not known, nor is a pool's reserved memory over
/// time: the capture records allocations, not segments.
fn attach_private_pools(trace: &mut Trace, end: Option<&End>, index: i8) {
    let mut ranges: Vec<(u64, u64, shared::model::PoolId)> = end
        .map_or(&[][..], |e| &e.private_pools)
        .iter()
        .filter(|r| r.device == i64::from(index))
        .map(|r| (r.address, r.address.saturating_add(r.size), shared::model::PoolId(r.pool.0, r.pool.1)))
        .collect();
    if ranges.is_empty() {
        return;
    }
    ranges.sort_unstable();
    let ev = &trace.events;
    let mut pools: Vec<shared::model::PoolId> = Vec::new();
    let mut event_pools = Vec::new();
    for i in 0..ev.len() {
        if !matches!(ev.event_type(i), EventType::Alloc | EventType::Free | EventType::FreeCompleted) {
            continue;
        }
        let a = ev.address[i];
        let k = ranges.partition_point(|r| r.0 <= a);
        let Some(&(_, end, id)) = k.checked_sub(1).and_then(|k| ranges.get(k)) else { continue };
        if a >= end {
            continue;
        }
        let p = match pools.iter().position(|&q| q == id) {
            Some(p) => p,
            None => {
                pools.push(id);
                pools.len() - 1
            }
        };
        event_pools.push((i as u32, p as u16));
    }
    trace.pools = pools;
    trace.event_pools = event_pools;
    trace.meta.warnings.push(
        "private pools (CUDA graphs, MemPool) are known from their segments at the end of the run: allocations in segments freed earlier count in the default pool, and pools' reserved memory is not recorded".into(),
    );
}

/// The allocator settings the process ran under: PyTorch's own effective settings at the end
/// when the program changed none, else the environment's string with the changes after it
/// (each replayed from its time). Always an object, so that a trace of this capture says its
/// settings are known (an empty one: PyTorch's defaults).
fn record_allocator_settings(trace: &mut Trace, hello: &Hello, end: Option<&End>, start_ns: u64) {
    let allocator = end.and_then(|e| e.allocator.as_ref());
    let mut changes = allocator.map(|a| a.changes.clone()).unwrap_or_default();
    for c in &mut changes {
        c.ts_ns = c.ts_ns.saturating_sub(start_ns);
    }
    let effective = allocator.and_then(|a| a.settings.clone()).filter(|s| s.is_object());
    let env = &hello.alloc_conf_env;
    let mut from_env = || {
        // Releases differ on which variable wins when both are set; where they differ, say so.
        let (cuda, generic) = (env.get("PYTORCH_CUDA_ALLOC_CONF"), env.get("PYTORCH_ALLOC_CONF"));
        if let (Some(a), Some(b)) = (cuda, generic) {
            if a != b {
                trace.meta.warnings.push(format!(
                    "PYTORCH_CUDA_ALLOC_CONF ({a:?}) and PYTORCH_ALLOC_CONF ({b:?}) were both set: the replays start from PYTORCH_CUDA_ALLOC_CONF"
                ));
            }
        }
        let s = cuda.or(generic).or(env.get("PYTORCH_HIP_ALLOC_CONF")).cloned().unwrap_or_default();
        shared::model::allocator_settings_of_string(&s)
    };
    let settings = match effective {
        Some(e) if changes.iter().all(|c| c.settings.is_none()) => e,
        _ => from_env(),
    };
    trace.meta.allocator_settings = Some(settings);
    trace.meta.allocator_changes = changes;
}

/// The process's torchrun variables (numbers, as `env.RANK`, ...: `shared::model::RankVar`)
/// and job, from its header.
fn report_env(trace: &mut Trace, hello: &Hello) {
    for (k, v) in &hello.env {
        if let Ok(n) = v.parse::<u64>() {
            trace.meta.report_env(k, n);
        }
    }
    if !hello.env.is_empty() {
        trace.meta.job = job_of(&hello.env);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use shared::model::{EventRecord, Phase, StrId};

    /// Allocations inside a private pool's segment (as the process reported them at its end)
    /// take that pool, their frees too; others stay in the default pool; other devices' segments
    /// are ignored.
    #[test]
    fn allocations_in_private_segments_take_their_pool() {
        let mut t = Trace::new(TraceMeta::new(SourceFormat::MemoryTracer));
        let d = t.device_index(Device { kind: "cuda".into(), index: 0, rank: None });
        let s = t.stream_index("default");
        let push = |t: &mut Trace, ts, event_type, address| {
            t.events.push(EventRecord {
                ts_ns: ts,
                event_type,
                phase: Phase::Other,
                size_bytes: 512,
                address,
                layer: StrId::NONE,
                device: d,
                stream: s,
                totals: None,
            })
        };
        push(&mut t, 1, EventType::Alloc, 0x1000);
        push(&mut t, 2, EventType::Alloc, 0x20_0000);
        push(&mut t, 3, EventType::Free, 0x20_0000);
        push(&mut t, 4, EventType::Alloc, 0x40_0000);
        let end: End = serde_json::from_value(json!({"private_pools": [
            {"device": 0, "address": 0x20_0000, "size": 0x20_0000, "pool": [1, 0]},
            {"device": 1, "address": 0x40_0000, "size": 0x20_0000, "pool": [0, 2]}
        ]}))
        .unwrap();
        attach_private_pools(&mut t, Some(&end), 0);
        assert_eq!(t.pools, vec![shared::model::PoolId(1, 0)]);
        assert_eq!(t.event_pools, vec![(1, 0), (2, 0)]);
        assert!(t.meta.warnings.iter().any(|w| w.contains("known from their segments at the end")));
        // Nothing reported: nothing changes.
        let mut u = Trace::new(TraceMeta::new(SourceFormat::MemoryTracer));
        attach_private_pools(&mut u, Some(&End::default()), 0);
        assert!(u.pools.is_empty() && u.meta.warnings.is_empty());
    }

    /// A traced CUDA run's settings: PyTorch's effective ones when the program changed none,
    /// else the environment's with the changes (timed from the capture's start), which the
    /// what-if replays apply; a trace of this capture always says its settings are known.
    #[test]
    fn allocator_settings_come_from_the_run() {
        use protocol::frames::AllocatorEnd;
        use shared::model::AllocatorChange;
        let mut hello = Hello::default();
        hello.alloc_conf_env.insert("PYTORCH_CUDA_ALLOC_CONF".into(), "expandable_segments:True".into());
        let effective = json!({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "expandable_segments": true, "max_split_size": -1});
        let end = |changes: Vec<AllocatorChange>| End {
            allocator: Some(AllocatorEnd { settings: Some(effective.clone()), changes }),
            ..End::default()
        };
        let mut t = Trace::new(TraceMeta::new(SourceFormat::MemoryTracer));
        record_allocator_settings(&mut t, &hello, Some(&end(Vec::new())), 1000);
        assert_eq!(t.meta.allocator_settings.as_ref(), Some(&effective));
        let own = shared::whatif::own_settings(&t);
        assert!(own.known && own.conf.expandable());

        let change = AllocatorChange { ts_ns: 1500, settings: Some("max_split_size_mb:128".into()), memory_fraction: None, device: None };
        let fraction = AllocatorChange { ts_ns: 1600, settings: None, memory_fraction: Some(0.5), device: Some(0) };
        let mut t = Trace::new(TraceMeta::new(SourceFormat::MemoryTracer));
        record_allocator_settings(&mut t, &hello, Some(&end(vec![change, fraction])), 1000);
        assert_eq!(t.meta.allocator_settings, Some(json!({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})));
        assert_eq!(t.meta.allocator_changes.iter().map(|c| c.ts_ns).collect::<Vec<_>>(), [500, 600]);
        let own = shared::whatif::own_settings(&t);
        assert_eq!(own.conf.to_string(), "expandable_segments:True,max_split_size_mb:128");
        assert_eq!(own.info(0).description, "expandable_segments:True,max_split_size_mb:128; memory fraction 0.5");

        // Both variables, differing: said; no end frame: the environment alone.
        hello.alloc_conf_env.insert("PYTORCH_ALLOC_CONF".into(), "garbage_collection_threshold:0.8".into());
        let mut t = Trace::new(TraceMeta::new(SourceFormat::MemoryTracer));
        record_allocator_settings(&mut t, &hello, None, 0);
        assert!(t.meta.warnings[0].contains("were both set"), "{:?}", t.meta.warnings);
        let mut t = Trace::new(TraceMeta::new(SourceFormat::MemoryTracer));
        record_allocator_settings(&mut t, &Hello::default(), None, 0);
        assert_eq!(shared::whatif::own_settings(&t).info(0).description, "PyTorch's defaults");
    }
}
