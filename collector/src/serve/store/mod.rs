//! The persistent trace store of `collector serve`: a folder of this machine ([`disk`]), or a
//! bucket of object storage that several servers share ([`bucket`], `--store s3://…`).
//!
//! Either way the server's `--data-dir` is its own working folder, locked while it runs
//! ([`Local`]): `DATA_DIR/lock`, `DATA_DIR/tmp/` (files being written, emptied on start) and,
//! with a bucket, `DATA_DIR/cache/` (traces read from the bucket). [`Store`] is what the rest
//! of the server sees: blocking calls (file I/O, requests to the bucket), made off the async
//! runtime.

pub mod bucket;
pub mod disk;

use protocol::{ExportFile, Origin, StoredTrace, TraceInfo};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use disk::id_millis;

/// Limits of the store.
#[derive(Clone, Copy, Debug)]
pub struct StoreLimits {
    pub max_traces: usize,
    pub max_bytes: u64,
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("Trace {0} not found")]
    NotFound(String),
    #[error("the trace is {size} bytes, more than the store's limit of {max} bytes (--max-store-mb)")]
    TooLarge { size: u64, max: u64 },
    /// A second insert of the same id (two uploads completing one live trace).
    #[error("Trace {0} is already stored")]
    Exists(String),
    #[error("another `collector serve`{holder} is using this data directory; stop it or pass another --data-dir: {path} is locked")]
    Locked { holder: String, path: PathBuf },
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
    /// Object storage failed (unreachable, refused): the client may retry.
    #[error("{0}")]
    Backend(String),
}

pub(super) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> StoreError {
    let context = context.into();
    move |source| StoreError::Io { context, source }
}

/// The suffix of sidecars; no trace file name ends with it.
pub(super) const SIDECAR_SUFFIX: &str = ".meta.json";

pub(super) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A plain file name the store may have written: ASCII letters, digits, `_`, `-`, `.`; no
/// leading dot; no separators. Everything else (`..`, `/`, `%2F` decoded, NUL) is refused.
pub(crate) fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// The trace file of `id` with extension `ext` (`.pickle`, `.json.gz`, ... from the client):
/// an extension that is not plain, or that would make the name a sidecar's (`.meta.json`, in
/// any case), becomes `.upload`. Ids are `trace_<digits>` (with a bucket, `trace_<digits>_<tag>`)
/// and extensions start with a dot, so no trace file can be another trace's file or sidecar.
pub(super) fn trace_file_name(id: &str, ext: &str) -> String {
    let plain = ext.strip_prefix('.').is_some_and(|e| is_plain_name(e) && !e.contains(".."));
    let ext = if ext.is_empty() || (plain && !ext.to_ascii_lowercase().ends_with(SIDECAR_SUFFIX)) { ext } else { ".upload" };
    format!("{id}{ext}")
}

/// Whether `file` may be trace `id`'s file: `<id>` or `<id>.<plain>`, not a sidecar.
pub(super) fn is_trace_file_of(id: &str, file: &str) -> bool {
    let plain = is_plain_name(file) && !file.to_ascii_lowercase().ends_with(SIDECAR_SUFFIX);
    plain && file.strip_prefix(id).is_some_and(|ext| ext.is_empty() || ext.starts_with('.'))
}

/// The record of a new trace of `size` bytes in file `trace_file_name(id, ext)`, or why it
/// cannot be stored (over the store's byte limit).
pub(super) fn new_stored(
    id: &str,
    origin: Origin,
    original_name: Option<String>,
    ext: &str,
    info: TraceInfo,
    size: u64,
    limits: StoreLimits,
) -> Result<StoredTrace, StoreError> {
    if size > limits.max_bytes {
        return Err(StoreError::TooLarge { size, max: limits.max_bytes });
    }
    Ok(StoredTrace {
        trace_id: id.to_owned(),
        created_unix_ms: now_ms(),
        origin,
        file: trace_file_name(id, ext),
        original_name,
        file_size_bytes: size,
        exports: std::collections::BTreeMap::new(),
        info,
    })
}

/// Removes a temporary file when dropped, wherever the code holding it stops: a request
/// handler is dropped when its client goes away mid-upload, and its file must not stay in
/// `tmp/` until the next start. Removing a file that was moved into the store does nothing.
#[derive(Debug)]
pub struct TempGuard(PathBuf);

impl Drop for TempGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The server's own working folder: locked for its life, with its temporary files.
#[derive(Debug)]
pub struct Local {
    root: PathBuf,
    tmp_dir: PathBuf,
    tmp_counter: AtomicU64,
    /// `<pid>.<ms at open>`, the start of this process's temporary names: a child of an
    /// earlier server that was killed (an export worker, a trace) may still write its file in
    /// `tmp/`, and never under a name this server hands out.
    session: String,
    /// The open lock file, locked (flock) for the store's life: one server per folder. The
    /// kernel releases it when the process ends, however it ends.
    _lock: std::fs::File,
}

impl Local {
    /// Creates and locks `root`, and empties its `tmp/` (what a previous run left half-written).
    fn open(root: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(root).map_err(io(format!("cannot create {}", root.display())))?;
        let lock = Self::lock(root)?;
        let tmp_dir = root.join("tmp");
        std::fs::create_dir_all(&tmp_dir).map_err(io(format!("cannot create {}", tmp_dir.display())))?;
        let local = Self {
            root: root.to_owned(),
            tmp_dir,
            tmp_counter: AtomicU64::new(0),
            session: format!("{}.{}", std::process::id(), now_ms()),
            _lock: lock,
        };
        local.clear_tmp();
        Ok(local)
    }

    /// Takes `root/lock` (flock, not blocking) and writes this process's id in it.
    fn lock(root: &Path) -> Result<std::fs::File, StoreError> {
        let path = root.join("lock");
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io(format!("cannot open {}", path.display())))?;
        match f.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let pid = std::fs::read_to_string(&path).unwrap_or_default();
                let pid = pid.trim();
                let holder =
                    if !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()) { format!(" (pid {pid})") } else { String::new() };
                return Err(StoreError::Locked { holder, path });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(format!("cannot lock {}", path.display()))(e)),
        }
        // Only a hint for the message above; the lock is what counts.
        let _ = f.set_len(0).and_then(|()| writeln!(f, "{}", std::process::id()));
        Ok(f)
    }

    /// Removes everything in `tmp/` (files being written when the server stops).
    pub fn clear_tmp(&self) {
        for e in std::fs::read_dir(&self.tmp_dir).into_iter().flatten().flatten() {
            let path = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = std::fs::remove_dir_all(&path);
            } else {
                let _ = std::fs::remove_file(&path);
            }
        }
    }

    /// A path in the temporary folder (same file system as the store: renames are atomic).
    pub fn temp_path(&self, hint: &str) -> PathBuf {
        let n = self.tmp_counter.fetch_add(1, Ordering::Relaxed);
        self.tmp_dir.join(format!("{}-{n}-{hint}", self.session))
    }
}

#[derive(Debug)]
enum Backend {
    Disk(disk::Disk),
    Bucket(bucket::Shared),
}

/// The store. All methods may block (file I/O, requests to a bucket): call them off the async
/// runtime.
#[derive(Debug)]
pub struct Store {
    local: Arc<Local>,
    limits: StoreLimits,
    backend: Backend,
}

impl Store {
    /// Opens the store: in `data_dir`, or in the bucket `shared` (a URL such as
    /// `s3://BUCKET/PREFIX`) with `data_dir` as this server's working folder. A bucket is
    /// written to and read back before this returns, so one that cannot be used is said now.
    pub fn open(data_dir: &Path, shared: Option<&str>, limits: StoreLimits) -> Result<Self, StoreError> {
        let local = Arc::new(Local::open(data_dir)?);
        let backend = match shared {
            None => Backend::Disk(disk::Disk::open(data_dir, local.clone(), limits)?),
            Some(url) => Backend::Bucket(bucket::Shared::open(url, local.clone(), limits)?),
        };
        Ok(Self { local, limits, backend })
    }

    /// Where the traces are: the data folder, or the bucket's URL.
    pub fn location(&self) -> String {
        match &self.backend {
            Backend::Disk(_) => self.local.root.display().to_string(),
            Backend::Bucket(b) => b.url().to_owned(),
        }
    }

    /// A fresh id: unique and increasing, also across restarts, concurrent requests and (with a
    /// bucket) the servers that share it.
    pub fn new_id(&self) -> String {
        match &self.backend {
            Backend::Disk(d) => d.new_id(),
            Backend::Bucket(b) => b.new_id(),
        }
    }

    /// Removes everything in the working folder's `tmp/`.
    pub fn clear_tmp(&self) {
        self.local.clear_tmp();
    }

    /// A path in the working folder's `tmp/`. The caller removes it, or holds a
    /// [`Store::temp_guard`] that does.
    pub fn temp_path(&self, hint: &str) -> PathBuf {
        self.local.temp_path(hint)
    }

    /// Removes the temporary file `path` when dropped (see [`TempGuard`]).
    pub fn temp_guard(&self, path: &Path) -> TempGuard {
        TempGuard(path.to_owned())
    }

    /// How many traces and bytes the store holds (with a bucket: at its last listing).
    pub fn usage(&self) -> (usize, u64) {
        match &self.backend {
            Backend::Disk(d) => d.usage(),
            Backend::Bucket(b) => b.usage(),
        }
    }

    pub fn limits(&self) -> StoreLimits {
        self.limits
    }

    /// Moves `tmp` (written by the caller in [`Store::temp_path`]) into the store as trace
    /// `id`, durably, then evicts the oldest traces where the limits call for it. Returns the
    /// stored trace and the evicted ids.
    pub fn insert(
        &self,
        id: &str,
        origin: Origin,
        original_name: Option<String>,
        tmp: &Path,
        ext: &str,
        info: TraceInfo,
    ) -> Result<(StoredTrace, Vec<String>), StoreError> {
        match &self.backend {
            Backend::Disk(d) => d.insert(id, origin, original_name, tmp, ext, info),
            Backend::Bucket(b) => b.insert(id, origin, original_name, tmp, ext, info),
        }
    }

    /// Stored trace `id` (with a bucket: as the bucket has it now, so a delete by another
    /// server is seen), or [`StoreError::NotFound`].
    pub fn get(&self, id: &str) -> Result<StoredTrace, StoreError> {
        match &self.backend {
            Backend::Disk(d) => d.get(id),
            Backend::Bucket(b) => b.get(id),
        }
    }

    /// `f` of every stored trace, oldest first.
    pub fn map_all<T>(&self, f: impl FnMut(&StoredTrace) -> T) -> Result<Vec<T>, StoreError> {
        match &self.backend {
            Backend::Disk(d) => Ok(d.map_all(f)),
            Backend::Bucket(b) => b.map_all(f),
        }
    }

    /// A local file holding stored trace `t` (with a bucket: its cached copy, read on first
    /// use).
    pub fn trace_path(&self, t: &StoredTrace) -> Result<PathBuf, StoreError> {
        match &self.backend {
            Backend::Disk(d) => Ok(d.trace_path(t)),
            Backend::Bucket(b) => b.trace_path(t),
        }
    }

    /// A stored trace and its file, opened so that a delete coming after still lets the file be
    /// read whole; one that came before makes it `NotFound`.
    pub fn open_trace(&self, id: &str) -> Result<(StoredTrace, std::fs::File), StoreError> {
        match &self.backend {
            Backend::Disk(d) => d.open_trace(id),
            Backend::Bucket(b) => b.open_trace(id),
        }
    }

    /// Deletes a trace and its exports, durably; returns how many traces remain.
    pub fn delete(&self, id: &str) -> Result<usize, StoreError> {
        match &self.backend {
            Backend::Disk(d) => d.delete(id),
            Backend::Bucket(b) => b.delete(id),
        }
    }

    /// The export file name of trace `id` in `format` (`suffix` such as `speedscope.json`).
    pub fn export_name(id: &str, suffix: &str) -> String {
        format!("{id}.{suffix}")
    }

    /// The export of trace `id` in `format` already made, if any.
    pub fn existing_export(&self, id: &str, format: &str) -> Result<Option<ExportFile>, StoreError> {
        match &self.backend {
            Backend::Disk(d) => d.existing_export(id, format),
            Backend::Bucket(b) => b.existing_export(id, format),
        }
    }

    /// Moves `tmp` into the store as trace `id`'s `format` export named `file`, durably.
    pub fn add_export(&self, id: &str, format: &str, file: String, tmp: &Path) -> Result<ExportFile, StoreError> {
        match &self.backend {
            Backend::Disk(d) => d.add_export(id, format, file, tmp),
            Backend::Bucket(b) => b.add_export(id, format, file, tmp),
        }
    }

    /// An export file the store made, opened (see [`Store::open_trace`]): any other name
    /// (traversal, another folder, a sidecar) is `NotFound`.
    pub fn open_export(&self, file: &str) -> Result<std::fs::File, StoreError> {
        match &self.backend {
            Backend::Disk(d) => d.open_export(file),
            Backend::Bucket(b) => b.open_export(file),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_refuse_traversal() {
        for bad in ["..", "../x", "a/b", "/etc/passwd", ".hidden", "a\\b", "a\0b", "", "%2e%2e"] {
            assert!(!is_plain_name(bad), "{bad:?} accepted");
        }
        assert!(is_plain_name("trace_1.speedscope.json"));
    }

    #[test]
    fn trace_files_never_alias_a_sidecar() {
        assert_eq!(trace_file_name("trace_1", ".pickle"), "trace_1.pickle");
        assert_eq!(trace_file_name("trace_1", ".json.gz"), "trace_1.json.gz");
        assert_eq!(trace_file_name("trace_1", ""), "trace_1");
        for bad in [".meta.json", ".META.JSON", ".x.meta.json", "..", ".", "./x", "x", "/../a", ".a..b"] {
            let name = trace_file_name("trace_1", bad);
            assert_eq!(name, "trace_1.upload", "{bad:?}");
        }
        assert!(is_trace_file_of("trace_1", "trace_1.pickle") && is_trace_file_of("trace_1", "trace_1"));
        for bad in ["trace_1.meta.json", "trace_12.pickle", "trace_2.pickle", "../trace_1", "trace_1/x"] {
            assert!(!is_trace_file_of("trace_1", bad), "{bad}");
        }
    }
}
