//! The persistent trace store of `collector serve`: one folder, written atomically, read
//! back on start.
//!
//! ```text
//! DATA_DIR/traces/trace_<ms><ext>        the trace as traced (native JSON) or uploaded (as sent)
//! DATA_DIR/traces/trace_<ms>.meta.json   its StoredTrace: summary, origin, exports
//! DATA_DIR/exports/trace_<ms>.<format>   exports made through the API
//! DATA_DIR/tmp/                          files being written; emptied on start
//! ```
//!
//! Every file is written in `tmp/` and renamed into place, and the sidecar is written last:
//! a crash leaves either a whole trace or none (a trace file without its sidecar is removed
//! on start). Limits: at most `max_traces` traces and `max_bytes` bytes (traces and exports);
//! adding a trace over either limit first evicts the oldest traces, with their exports.

use super::api::TraceInfo;
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Where a stored trace came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// Recorded by this server (`POST /api/trace/memory`).
    Traced,
    /// Sent to `POST /api/trace/upload`.
    Uploaded,
}

/// An export made from a stored trace.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct ExportFile {
    /// File name under `/api/trace/download/`.
    pub file: String,
    pub file_size_bytes: u64,
}

/// A stored trace: what its sidecar holds.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct StoredTrace {
    pub trace_id: String,
    pub created_unix_ms: u64,
    pub origin: Origin,
    /// The trace file's name in the store.
    pub file: String,
    /// The uploaded file's name, when the client gave one.
    pub original_name: Option<String>,
    pub file_size_bytes: u64,
    /// Exports by format name.
    pub exports: BTreeMap<String, ExportFile>,
    pub info: TraceInfo,
}

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
    #[error("{context}: {source}")]
    Io { context: String, source: std::io::Error },
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> StoreError {
    let context = context.into();
    move |source| StoreError::Io { context, source }
}

#[derive(Debug, Default)]
struct Index {
    /// By id milliseconds: iteration order is creation order (eviction takes the first).
    traces: BTreeMap<u64, StoredTrace>,
    /// Export file name → owner id milliseconds: the only files downloads may serve.
    exports: HashMap<String, u64>,
    bytes: u64,
    last_ms: u64,
}

/// The store. All methods do blocking file I/O: call them off the async runtime.
#[derive(Debug)]
pub struct Store {
    traces_dir: PathBuf,
    exports_dir: PathBuf,
    tmp_dir: PathBuf,
    limits: StoreLimits,
    index: Mutex<Index>,
    tmp_counter: AtomicU64,
}

/// `trace_<ms>` → ms.
pub fn id_millis(id: &str) -> Option<u64> {
    let digits = id.strip_prefix("trace_")?;
    if digits.is_empty() || digits.len() > 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

fn now_ms() -> u64 {
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

impl Store {
    /// Opens (creating) the store in `root` and reads back what it holds.
    pub fn open(root: &Path, limits: StoreLimits) -> Result<Self, StoreError> {
        let store = Self {
            traces_dir: root.join("traces"),
            exports_dir: root.join("exports"),
            tmp_dir: root.join("tmp"),
            limits,
            index: Mutex::new(Index::default()),
            tmp_counter: AtomicU64::new(0),
        };
        for d in [&store.traces_dir, &store.exports_dir, &store.tmp_dir] {
            std::fs::create_dir_all(d).map_err(io(format!("cannot create {}", d.display())))?;
        }
        // Half-written files of a previous run.
        for e in std::fs::read_dir(&store.tmp_dir).map_err(io(format!("cannot read {}", store.tmp_dir.display())))?.flatten() {
            let _ = std::fs::remove_file(e.path());
        }
        let mut index = Index::default();
        let mut referenced = std::collections::HashSet::new();
        let entries = std::fs::read_dir(&store.traces_dir).map_err(io(format!("cannot read {}", store.traces_dir.display())))?;
        let mut names: Vec<String> = entries.flatten().filter_map(|e| e.file_name().into_string().ok()).collect();
        names.sort();
        for name in &names {
            let Some(id) = name.strip_suffix(".meta.json") else { continue };
            let Some(ms) = id_millis(id) else { continue };
            let path = store.traces_dir.join(name);
            let parsed = std::fs::read(&path).ok().and_then(|b| serde_json::from_slice::<StoredTrace>(&b).ok());
            let Some(mut t) = parsed.filter(|t| t.trace_id == id && is_plain_name(&t.file)) else {
                eprintln!("collector serve: ignoring unreadable {}", path.display());
                continue;
            };
            let Ok(meta) = std::fs::metadata(store.traces_dir.join(&t.file)) else {
                eprintln!("collector serve: {} has no trace file; dropping it", path.display());
                let _ = std::fs::remove_file(&path);
                continue;
            };
            t.file_size_bytes = meta.len();
            t.exports.retain(|_, e| is_plain_name(&e.file) && std::fs::metadata(store.exports_dir.join(&e.file)).map(|m| e.file_size_bytes = m.len()).is_ok());
            referenced.insert(t.file.clone());
            referenced.insert(name.clone());
            index.bytes += t.file_size_bytes;
            for e in t.exports.values() {
                index.bytes += e.file_size_bytes;
                index.exports.insert(e.file.clone(), ms);
            }
            index.last_ms = index.last_ms.max(ms);
            index.traces.insert(ms, t);
        }
        // Trace files whose sidecar never got written (a crash between the two renames).
        for name in names.iter().filter(|n| !referenced.contains(*n)) {
            let _ = std::fs::remove_file(store.traces_dir.join(name));
        }
        if let Ok(entries) = std::fs::read_dir(&store.exports_dir) {
            for e in entries.flatten() {
                let keep = e.file_name().to_str().is_some_and(|n| index.exports.contains_key(n));
                if !keep {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        *store.index.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = index;
        Ok(store)
    }

    fn index(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A fresh id, `trace_<milliseconds>`: unique and increasing, also across restarts and
    /// concurrent requests (two ids asked for in the same millisecond get consecutive ones).
    pub fn new_id(&self) -> String {
        let mut index = self.index();
        let ms = now_ms().max(index.last_ms + 1);
        index.last_ms = ms;
        format!("trace_{ms}")
    }

    /// A path in the store's temporary folder (same file system as the store: renames are
    /// atomic).
    /// Removes everything in `tmp/` (files being written when the server stops).
    pub fn clear_tmp(&self) {
        for e in std::fs::read_dir(&self.tmp_dir).into_iter().flatten().flatten() {
            let _ = std::fs::remove_file(e.path());
        }
    }

    pub fn temp_path(&self, hint: &str) -> PathBuf {
        let n = self.tmp_counter.fetch_add(1, Ordering::Relaxed);
        self.tmp_dir.join(format!("{n}-{hint}"))
    }

    /// How many traces and bytes the store holds.
    pub fn usage(&self) -> (usize, u64) {
        let index = self.index();
        (index.traces.len(), index.bytes)
    }

    pub fn limits(&self) -> StoreLimits {
        self.limits
    }

    /// Moves `tmp` (written by the caller in [`Store::temp_path`]) into the store as trace
    /// `id`, evicting the oldest traces first where the limits call for it. Returns the stored
    /// trace and the evicted ids.
    pub fn insert(&self, id: &str, origin: Origin, original_name: Option<String>, tmp: &Path, ext: &str, info: TraceInfo) -> Result<(StoredTrace, Vec<String>), StoreError> {
        let ms = id_millis(id).ok_or_else(|| StoreError::NotFound(id.to_owned()))?;
        let size = std::fs::metadata(tmp).map_err(io("cannot read the new trace"))?.len();
        if size > self.limits.max_bytes {
            let _ = std::fs::remove_file(tmp);
            return Err(StoreError::TooLarge {
                size,
                max: self.limits.max_bytes,
            });
        }
        let file = format!("{id}{ext}");
        debug_assert!(is_plain_name(&file));
        let stored = StoredTrace {
            trace_id: id.to_owned(),
            created_unix_ms: now_ms(),
            origin,
            file: file.clone(),
            original_name,
            file_size_bytes: size,
            exports: BTreeMap::new(),
            info,
        };
        let mut index = self.index();
        let mut evicted = Vec::new();
        while !index.traces.is_empty() && (index.traces.len() + 1 > self.limits.max_traces || index.bytes + size > self.limits.max_bytes) {
            let Some((_, old)) = index.traces.pop_first() else { break };
            self.remove_files(&mut index, &old);
            eprintln!("collector serve: evicted {} (store limits: {} traces, {} bytes)", old.trace_id, self.limits.max_traces, self.limits.max_bytes);
            evicted.push(old.trace_id);
        }
        let dest = self.traces_dir.join(&file);
        if let Err(e) = std::fs::rename(tmp, &dest) {
            let _ = std::fs::remove_file(tmp);
            return Err(io(format!("cannot move the trace into {}", dest.display()))(e));
        }
        if let Err(e) = self.write_sidecar(&stored) {
            let _ = std::fs::remove_file(&dest);
            return Err(e);
        }
        index.bytes += size;
        index.traces.insert(ms, stored.clone());
        Ok((stored, evicted))
    }

    fn write_sidecar(&self, t: &StoredTrace) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec_pretty(t).map_err(|e| io("cannot encode the sidecar")(std::io::Error::other(e)))?;
        let dest = self.traces_dir.join(format!("{}.meta.json", t.trace_id));
        self.write_atomic(&dest, &bytes)
    }

    /// Writes `bytes` to `dest` through a synced temporary file and a rename.
    fn write_atomic(&self, dest: &Path, bytes: &[u8]) -> Result<(), StoreError> {
        let tmp = self.temp_path("sidecar");
        let written = (|| {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, dest)
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(io(format!("cannot write {}", dest.display()))(e));
        }
        Ok(())
    }

    fn remove_files(&self, index: &mut Index, t: &StoredTrace) {
        let _ = std::fs::remove_file(self.traces_dir.join(format!("{}.meta.json", t.trace_id)));
        let _ = std::fs::remove_file(self.traces_dir.join(&t.file));
        index.bytes = index.bytes.saturating_sub(t.file_size_bytes);
        for e in t.exports.values() {
            let _ = std::fs::remove_file(self.exports_dir.join(&e.file));
            index.exports.remove(&e.file);
            index.bytes = index.bytes.saturating_sub(e.file_size_bytes);
        }
    }

    pub fn get(&self, id: &str) -> Option<StoredTrace> {
        let ms = id_millis(id)?;
        self.index().traces.get(&ms).cloned()
    }

    /// `f` of every stored trace, oldest first.
    pub fn map_all<T>(&self, f: impl FnMut(&StoredTrace) -> T) -> Vec<T> {
        self.index().traces.values().map(f).collect()
    }

    /// The trace file of a stored trace.
    pub fn trace_path(&self, t: &StoredTrace) -> PathBuf {
        self.traces_dir.join(&t.file)
    }

    /// Deletes a trace and its exports; returns how many traces remain.
    pub fn delete(&self, id: &str) -> Result<usize, StoreError> {
        let mut index = self.index();
        let t = id_millis(id).and_then(|ms| index.traces.remove(&ms)).ok_or_else(|| StoreError::NotFound(id.to_owned()))?;
        self.remove_files(&mut index, &t);
        Ok(index.traces.len())
    }

    /// The export file name of trace `id` in `format` (`suffix` such as `speedscope.json`).
    pub fn export_name(id: &str, suffix: &str) -> String {
        format!("{id}.{suffix}")
    }

    /// The export already made, if any.
    pub fn existing_export(&self, id: &str, format: &str) -> Option<ExportFile> {
        self.get(id)?.exports.get(format).cloned()
    }

    /// Moves `tmp` into the exports as trace `id`'s `format` export named `file`.
    pub fn add_export(&self, id: &str, format: &str, file: String, tmp: &Path) -> Result<ExportFile, StoreError> {
        let size = std::fs::metadata(tmp).map_err(io("cannot read the new export"))?.len();
        let mut index = self.index();
        let ms = id_millis(id).filter(|ms| index.traces.contains_key(ms));
        let Some(ms) = ms else {
            // Deleted while the export was being written.
            let _ = std::fs::remove_file(tmp);
            return Err(StoreError::NotFound(id.to_owned()));
        };
        let dest = self.exports_dir.join(&file);
        if let Err(e) = std::fs::rename(tmp, &dest) {
            let _ = std::fs::remove_file(tmp);
            return Err(io(format!("cannot move the export into {}", dest.display()))(e));
        }
        let export = ExportFile {
            file: file.clone(),
            file_size_bytes: size,
        };
        let Some(t) = index.traces.get_mut(&ms) else {
            return Err(StoreError::NotFound(id.to_owned()));
        };
        let old = t.exports.insert(format.to_owned(), export.clone());
        let updated = t.clone();
        index.bytes = index.bytes + size - old.map_or(0, |o| o.file_size_bytes);
        index.exports.insert(file, ms);
        // Under the lock: sidecars of one trace are written in the order of their changes.
        self.write_sidecar(&updated)?;
        Ok(export)
    }

    /// The path of a download, only for export files the store made: any other name
    /// (traversal, another folder, a sidecar) is `None`.
    pub fn download_path(&self, file: &str) -> Option<PathBuf> {
        if !is_plain_name(file) || !self.index().exports.contains_key(file) {
            return None;
        }
        Some(self.exports_dir.join(file))
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
    fn ids_parse() {
        assert_eq!(id_millis("trace_123"), Some(123));
        for bad in ["trace_", "trace_12a", "trace_-1", "x_1", "trace_1.json"] {
            assert_eq!(id_millis(bad), None, "{bad}");
        }
    }
}
