//! Imports and exports of untrusted files in a child process with an address-space limit, so
//! a hostile upload (a pickle or gzip bomb, deep nesting) costs a bounded child its memory,
//! never the server.
//!
//! The server runs `collector serve-worker import|export|merge` (a hidden subcommand) for each
//! upload, export and merge of a job's nodes' parts. The worker caps its own address space
//! (`RLIMIT_AS` = what it has mapped at start, libtorch included, plus `--import-memory-mb`) and
//! CPU time before it reads a byte
//! of the file, then prints one JSON line: the trace's [`TraceInfo`] or why it failed. A child
//! that runs out of memory aborts; the server answers 422. At most `--max-imports` children
//! run at once and `--import-queue` more wait; beyond that requests get 429 with Retry-After.

use super::fault::Fault;
use protocol::{trace_info, TraceInfo, WorkerAnswer};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The most a worker may print (a trace's summary with its per-layer rows).
const MAX_WORKER_OUTPUT_BYTES: u64 = 64 << 20;

/// Limits of the import and export children.
#[derive(Clone, Debug)]
pub struct IsolationLimits {
    /// Memory a worker may map beyond what it has at start. Default is 4 GiB.
    pub memory_budget_bytes: u64,
    /// Wall-clock (and CPU) time of one import or export. Default is 300 s.
    pub timeout: Duration,
    /// Workers running at once. Default is 2.
    pub max_running: usize,
    /// Requests that may wait for a worker; more get 429. Default is 32.
    pub max_waiting: usize,
}

impl Default for IsolationLimits {
    fn default() -> Self {
        Self { memory_budget_bytes: 4 << 30, timeout: Duration::from_secs(300), max_running: 2, max_waiting: 32 }
    }
}

/// Runs imports and exports in limited children, a bounded number at a time.
#[derive(Debug)]
pub struct Isolation {
    exe: PathBuf,
    limits: IsolationLimits,
    slots: std::sync::Arc<Semaphore>,
    waiting: AtomicUsize,
}

/// A place among the running workers (or in-process loads of stored traces); freed on drop.
#[derive(Debug)]
pub struct Slot(#[allow(dead_code)] OwnedSemaphorePermit);

impl Isolation {
    pub fn new(exe: PathBuf, limits: IsolationLimits) -> Self {
        let running = limits.max_running.max(1);
        Self {
            exe,
            slots: std::sync::Arc::new(Semaphore::new(running)),
            limits: IsolationLimits { max_running: running, ..limits },
            waiting: AtomicUsize::new(0),
        }
    }

    pub fn limits(&self) -> &IsolationLimits {
        &self.limits
    }

    /// A worker slot: at once when one is free, after a wait when fewer than `max_waiting`
    /// wait, else 429 with Retry-After.
    pub async fn slot(&self) -> Result<Slot, Fault> {
        if let Ok(p) = self.slots.clone().try_acquire_owned() {
            return Ok(Slot(p));
        }
        let waiting = self.waiting.fetch_add(1, Ordering::SeqCst);
        struct Leave<'a>(&'a AtomicUsize);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let _leave = Leave(&self.waiting);
        if waiting >= self.limits.max_waiting {
            return Err(Fault::Busy {
                detail: format!(
                    "too many imports and exports at once ({} running, {waiting} waiting; --max-imports {}, --import-queue {}); retry later",
                    self.limits.max_running, self.limits.max_running, self.limits.max_waiting
                ),
                retry_after_s: (2 * (waiting as u64 + 1) / self.limits.max_running as u64).max(1),
            });
        }
        let p = self.slots.clone().acquire_owned().await.map_err(|e| Fault::internal("the import queue closed", e))?;
        Ok(Slot(p))
    }

    /// Imports `file` in a worker; its summary, or 422 saying why the file is refused. `what`
    /// names the file in errors; `model_fallback` names a trace that names no model.
    pub async fn import(
        &self,
        _slot: &Slot,
        file: &Path,
        what: &str,
        model_fallback: &str,
        max_decompressed_bytes: u64,
    ) -> Result<TraceInfo, Fault> {
        let mut cmd = self.command("import");
        // `--flag=value`: a name that starts with `-` stays a value.
        cmd.arg(format!("--what={what}"))
            .arg(format!("--model-name={model_fallback}"))
            .arg("--max-decompressed-bytes")
            .arg(max_decompressed_bytes.to_string())
            .arg("--")
            .arg(file);
        match self.run(cmd).await? {
            WorkerAnswer::Imported(info) => Ok(*info),
            _ => Err(Fault::internal("the import worker answered", "an unexpected line")),
        }
    }

    /// Writes `format` of the stored trace `file` to `out` in a worker; the bytes written.
    pub async fn export(&self, _slot: &Slot, file: &Path, format: &str, out: &Path, max_decompressed_bytes: u64) -> Result<u64, Fault> {
        let mut cmd = self.command("export");
        cmd.arg("--format")
            .arg(format)
            .arg("--max-decompressed-bytes")
            .arg(max_decompressed_bytes.to_string())
            .arg("--")
            .arg(file)
            .arg(out);
        match self.run(cmd).await? {
            WorkerAnswer::Exported { file_size_bytes } => Ok(file_size_bytes),
            _ => Err(Fault::internal("the export worker answered", "an unexpected line")),
        }
    }

    /// Merges the ranks of `parts` (each node's trace of a job of several nodes, `labels`
    /// naming them) into one trace written to `out` (own format) in a worker; its summary.
    /// Ranks of the job no part has are named missing with `missing_reason`; `absent` (why
    /// nodes sent no part) goes into the trace's warnings.
    pub async fn merge(
        &self,
        _slot: &Slot,
        parts: &[(PathBuf, String)],
        out: &Path,
        missing_reason: &str,
        absent: &[String],
        max_decompressed_bytes: u64,
    ) -> Result<TraceInfo, Fault> {
        let mut cmd = self.command("merge");
        cmd.arg(format!("--missing-reason={missing_reason}"));
        for a in absent {
            cmd.arg(format!("--absent={a}"));
        }
        cmd.arg("--max-decompressed-bytes").arg(max_decompressed_bytes.to_string()).arg("--out").arg(out).arg("--");
        for (file, label) in parts {
            let mut arg = std::ffi::OsString::from(format!("{label}="));
            arg.push(file);
            cmd.arg(arg);
        }
        match self.run(cmd).await? {
            WorkerAnswer::Imported(info) => Ok(*info),
            _ => Err(Fault::internal("the merge worker answered", "an unexpected line")),
        }
    }

    fn command(&self, what: &str) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.exe);
        cmd.args(["serve-worker", what, "--memory-budget-bytes"])
            .arg(self.limits.memory_budget_bytes.to_string())
            .arg("--cpu-seconds")
            .arg(self.limits.timeout.as_secs().max(1).to_string())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        die_with_parent(&mut cmd);
        cmd
    }

    async fn run(&self, mut cmd: tokio::process::Command) -> Result<WorkerAnswer, Fault> {
        let mut child = cmd.spawn().map_err(|e| Fault::internal("cannot start the import worker", e))?;
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            return Err(Fault::internal("cannot start the import worker", "no pipes"));
        };
        let read_out = async {
            let mut out = Vec::new();
            let n = stdout.take(MAX_WORKER_OUTPUT_BYTES + 1).read_to_end(&mut out).await;
            (n, out)
        };
        let read_err = async {
            let mut err = Vec::new();
            let _ = stderr.take(16 << 10).read_to_end(&mut err).await;
            err
        };
        let all = async {
            let ((_, out), err) = tokio::join!(read_out, read_err);
            let status = child.wait().await;
            (out, err, status)
        };
        let limit_s = self.limits.timeout.as_secs();
        let Ok((out, err, status)) = tokio::time::timeout(self.limits.timeout, all).await else {
            return Err(Fault::Rejected(format!(
                "the file took longer than this server's limit of {limit_s} s to read (--import-timeout-s)"
            )));
        };
        let status = status.map_err(|e| Fault::internal("cannot wait for the import worker", e))?;
        if out.len() as u64 > MAX_WORKER_OUTPUT_BYTES {
            return Err(Fault::Rejected(format!(
                "the trace's summary is larger than {} MiB (too many layers)",
                MAX_WORKER_OUTPUT_BYTES >> 20
            )));
        }
        let answer =
            std::str::from_utf8(&out).ok().and_then(|t| t.lines().rev().find_map(|l| serde_json::from_str::<WorkerAnswer>(l).ok()));
        match answer {
            Some(WorkerAnswer::Error(why)) => Err(Fault::Rejected(why)),
            Some(a) if status.success() => Ok(a),
            _ => Err(self.died(&status, &err)),
        }
    }

    /// Why a worker that printed no answer ended.
    fn died(&self, status: &std::process::ExitStatus, stderr: &[u8]) -> Fault {
        use std::os::unix::process::ExitStatusExt;
        let stderr = String::from_utf8_lossy(stderr);
        let budget_mib = self.limits.memory_budget_bytes >> 20;
        if stderr.contains("memory allocation of") || stderr.contains("capacity overflow") || stderr.contains("cannot allocate memory") {
            return Fault::Rejected(format!(
                "reading the file needs more memory than this server allows an import ({budget_mib} MiB, --import-memory-mb)"
            ));
        }
        if status.signal() == Some(libc::SIGXCPU) || status.signal() == Some(libc::SIGKILL) {
            return Fault::Rejected(format!(
                "the file took longer than this server's limit of {} s to read (--import-timeout-s)",
                self.limits.timeout.as_secs()
            ));
        }
        let how = match (status.code(), status.signal()) {
            (Some(c), _) => format!("exit status {c}"),
            (_, Some(s)) => format!("signal {s}"),
            _ => "an unknown status".into(),
        };
        let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").to_owned();
        eprintln!("collector serve: an import worker failed ({how}): {last}");
        Fault::Rejected(format!("the file could not be read: the import process failed ({how}; the server's log has its last line)"))
    }
}

/// Limits this process (a worker): address space = what is mapped now + `budget_bytes`, CPU
/// time `cpu_s`, no core dumps.
fn limit_self(budget_bytes: u64, cpu_s: u64) -> std::io::Result<()> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let mapped_kib: u64 =
        status.lines().find_map(|l| l.strip_prefix("VmSize:")).and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap_or(0);
    let set = |what, value: u64| -> std::io::Result<()> {
        let lim = libc::rlimit { rlim_cur: value as libc::rlim_t, rlim_max: value as libc::rlim_t };
        // SAFETY: setrlimit(2) on this process with a valid, initialised struct.
        if unsafe { libc::setrlimit(what, &lim) } == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    set(libc::RLIMIT_CORE, 0)?;
    set(libc::RLIMIT_CPU, cpu_s.max(1))?;
    set(libc::RLIMIT_AS, (mapped_kib << 10).saturating_add(budget_bytes))
}

/// Makes a child started by `cmd` die with this server: killed when the server is (even by
/// SIGKILL, when nothing runs `kill_on_drop`), so no child of a crashed server writes into
/// `tmp/` after the next start emptied it. A child whose server died before it could ask is
/// not started.
pub fn die_with_parent(cmd: &mut tokio::process::Command) {
    // SAFETY: getpid(2) in the parent; in the forked child, before exec, only prctl(2) and
    // getppid(2), which are async-signal-safe.
    let parent = unsafe { libc::getpid() };
    // SAFETY: see above.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                return Err(std::io::Error::other("the server stopped before its child started"));
            }
            Ok(())
        });
    }
}

/// Caps the address space of a child started by `cmd` (CPU trace processes; CUDA reserves
/// far more address space than it uses, so CUDA children are not capped this way).
pub fn limit_address_space(cmd: &mut tokio::process::Command, bytes: u64) {
    let lim = libc::rlimit { rlim_cur: bytes as libc::rlim_t, rlim_max: bytes as libc::rlim_t };
    // SAFETY: the closure runs in the forked child before exec and only calls setrlimit(2),
    // which is async-signal-safe, on a struct it owns.
    unsafe {
        cmd.pre_exec(move || if libc::setrlimit(libc::RLIMIT_AS, &lim) == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) });
    }
}

/// What `collector serve-worker` is asked.
#[derive(Debug)]
pub enum WorkerTask {
    /// Import `file` and print its summary; `what` names it in errors.
    Import { file: PathBuf, what: String, model_name: String },
    /// Import `file` and write it as `format` to `out`.
    Export { file: PathBuf, format: String, out: PathBuf },
    /// Merge the ranks of `parts` (label, file) into one trace written to `out`; ranks no
    /// part has are missing for `missing_reason`.
    /// `absent`: why nodes sent no part, for the warnings.
    Merge { parts: Vec<(String, PathBuf)>, out: PathBuf, missing_reason: String, absent: Vec<String> },
}

/// `collector serve-worker`: limits itself, runs `task`, prints one JSON line; the exit code
/// (0, or 2 when the file is refused).
pub fn run_worker(task: WorkerTask, budget_bytes: u64, cpu_s: u64, max_decompressed_bytes: u64) -> i32 {
    if let Err(e) = limit_self(budget_bytes, cpu_s) {
        eprintln!("collector serve-worker: cannot limit itself: {e}");
        return 1;
    }
    let mut options = shared::ImportOptions::default();
    options.max_decompressed_bytes = max_decompressed_bytes;
    let answer = match task {
        Task::Import { file, what, model_name } => match traceio::files::load_trace(&file, &options) {
            Ok(trace) => WorkerAnswer::Imported(Box::new(trace_info(&trace, &model_name, 0.0))),
            Err(e) => WorkerAnswer::Error(format!(
                "{what} is not a trace the collector reads (a PyTorch memory snapshot pickle, a torch.profiler Chrome trace, a DFTracer .pfw or a Memory Tracer trace; gzip or not): {:#}",
                e.root_cause()
            )),
        },
        Task::Export { file, format, out } => match export(&file, &format, &out, &options) {
            Ok(n) => WorkerAnswer::Exported { file_size_bytes: n },
            Err(e) => WorkerAnswer::Error(format!("cannot export the trace as {format}: {e:#}")),
        },
        Task::Merge { parts, out, missing_reason, absent } => match merge_parts(&parts, &out, (&missing_reason, &absent), &options) {
            Ok(trace) => WorkerAnswer::Imported(Box::new(trace_info(&trace, "merged nodes", 0.0))),
            Err(e) => WorkerAnswer::Error(format!("cannot merge the nodes' parts: {e:#}")),
        },
    };
    let code = if matches!(answer, WorkerAnswer::Error(_)) { 2 } else { 0 };
    match serde_json::to_string(&answer) {
        Ok(line) => println!("{line}"),
        Err(e) => {
            eprintln!("collector serve-worker: cannot print the answer: {e}");
            return 1;
        }
    }
    code
}

use WorkerTask as Task;

fn export(file: &Path, format: &str, out: &Path, options: &shared::ImportOptions) -> anyhow::Result<u64> {
    use anyhow::Context;
    let format = shared::export::ExportFormat::from_name(format).with_context(|| format!("unknown format `{format}`"))?;
    let trace = traceio::files::load_trace(file, options)?;
    let f = std::fs::File::create(out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut w = std::io::BufWriter::new(f);
    shared::export::export(&trace, format, &mut w)?;
    std::io::Write::flush(&mut w)?;
    let f = w.into_inner().map_err(|e| e.into_error())?;
    f.sync_all()?;
    Ok(f.metadata()?.len())
}

/// Reads each node's part (a trace of its ranks, merged or one process's), takes every rank
/// out, merges them all (ranks no part has are missing for `missing.0`; the absent nodes,
/// `missing.1`, and parts that cannot be read are named in the warnings) and writes the result
/// to `out` in the own format.
fn merge_parts(
    parts: &[(String, PathBuf)],
    out: &Path,
    missing: (&str, &[String]),
    options: &shared::ImportOptions,
) -> anyhow::Result<shared::Trace> {
    let (missing_reason, absent) = missing;
    use anyhow::Context;
    use shared::ranks::merge::{absent_ranks, merge_with, InputRank, MergeInput, MergeOptions};
    let mut inputs = Vec::new();
    let mut unread = Vec::new();
    for (label, file) in parts {
        let trace = match traceio::files::load_trace(file, options) {
            Ok(t) => t,
            Err(e) => {
                unread.push(format!("{label}'s part could not be read: {:#}", e.root_cause()));
                continue;
            }
        };
        // A part that is already a merge of ranks brings its own; one process's names its rank.
        inputs.extend(MergeInput::of(trace, label, InputRank::Named)?);
    }
    anyhow::ensure!(!inputs.is_empty(), "no part could be read: {}", unread.join("; "));
    let world = inputs.iter().filter_map(|i| i.trace.meta.rank_var(shared::model::RankVar::WorldSize)).max().unwrap_or(0);
    let missing_reasons = absent_ranks(&inputs, u32::try_from(world).unwrap_or(u32::MAX), |_| missing_reason.to_owned());
    let opts = MergeOptions { missing_reasons, ..Default::default() };
    let mut merged = merge_with(inputs, &opts)?;
    merged.meta.warnings.extend(absent.iter().map(|a| format!("{a}: its ranks are not in this trace")));
    merged.meta.warnings.extend(unread);
    let f = std::fs::File::create(out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut w = std::io::BufWriter::new(f);
    shared::export::export(&merged, shared::export::ExportFormat::Native, &mut w)?;
    std::io::Write::flush(&mut w)?;
    w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    Ok(merged)
}
