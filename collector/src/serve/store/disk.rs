//! The persistent trace store of `collector serve`: one folder, written atomically and
//! durably, read back on start.
//!
//! ```text
//! DATA_DIR/lock                          held (flock) while a server uses the folder
//! DATA_DIR/traces/trace_<ms><ext>        the trace as traced (native JSON) or uploaded (as sent)
//! DATA_DIR/traces/trace_<ms>.meta.json   its StoredTrace: summary, origin, exports
//! DATA_DIR/exports/trace_<ms>.<format>   exports made through the API
//! DATA_DIR/tmp/                          files being written; emptied on start
//! DATA_DIR/quarantine/                   files found unreadable on start, moved aside
//! ```
//!
//! The commit protocol, which `tests/store_crash.rs` kills the server in the middle of:
//! every file is written in `tmp/` and fsynced. An insert then renames the sidecar into
//! place and the trace file after it; the trace file's rename is the commit, and the folder
//! is fsynced before the answer. A delete (or an eviction) removes the trace file first,
//! then its exports and sidecar. So a crash leaves a sidecar without its trace file (an
//! insert or delete that never answered, removed on start) but never a trace file without
//! its sidecar: one found on start is not the store's doing and goes to `quarantine/`, as
//! do sidecars that cannot be read and traces whose size is not their sidecar's. Limits: at
//! most `max_traces` traces and `max_bytes` bytes (traces and exports); a new trace is
//! committed first, then the oldest traces are evicted, with their exports, until both hold.

use super::{io, is_plain_name, is_trace_file_of, new_stored, now_ms, Local, StoreError, StoreLimits, SIDECAR_SUFFIX};
use protocol::{ExportFile, Origin, StoredTrace, TraceInfo};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

#[derive(Debug, Default)]
struct Index {
    /// By id milliseconds: iteration order is creation order (eviction takes the first).
    traces: BTreeMap<u64, StoredTrace>,
    /// Export file name → owner id milliseconds: the only files downloads may serve.
    exports: HashMap<String, u64>,
    bytes: u64,
    last_ms: u64,
}

/// The store in a folder. All methods do blocking file I/O: call them off the async runtime.
#[derive(Debug)]
pub struct Disk {
    local: Arc<Local>,
    traces_dir: PathBuf,
    exports_dir: PathBuf,
    quarantine_dir: PathBuf,
    limits: StoreLimits,
    index: Mutex<Index>,
}

/// `trace_<ms>` → ms.
pub fn id_millis(id: &str) -> Option<u64> {
    let digits = id.strip_prefix("trace_")?;
    if digits.is_empty() || digits.len() > 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The id milliseconds a file name in the store starts with (`trace_<ms>.…`).
fn leading_millis(name: &str) -> Option<u64> {
    let rest = name.strip_prefix("trace_")?;
    let end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    id_millis(&name[..6 + end])
}

fn sidecar_name(id: &str) -> String {
    format!("{id}{SIDECAR_SUFFIX}")
}

/// Flushes a folder's entries (renames, unlinks) to the disk.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Flushes a file written elsewhere (a trace child does not sync its output); its size.
fn sync_file(path: &Path) -> std::io::Result<u64> {
    let f = std::fs::File::open(path)?;
    f.sync_all()?;
    Ok(f.metadata()?.len())
}

fn remove_if_there(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

impl Disk {
    /// Opens (creating) the store in `root` (locked, its `tmp/` emptied: `local`) and reads
    /// back what it holds.
    pub fn open(root: &Path, local: Arc<Local>, limits: StoreLimits) -> Result<Self, StoreError> {
        let store = Self {
            local,
            traces_dir: root.join("traces"),
            exports_dir: root.join("exports"),
            quarantine_dir: root.join("quarantine"),
            limits,
            index: Mutex::new(Index::default()),
        };
        for d in [&store.traces_dir, &store.exports_dir, &store.quarantine_dir] {
            std::fs::create_dir_all(d).map_err(io(format!("cannot create {}", d.display())))?;
        }
        sync_dir(root).map_err(io(format!("cannot sync {}", root.display())))?;
        let mut index = store.recover()?;
        // A crash between an insert's commit and the evictions it causes leaves the store over
        // its limits: the evictions happen now, oldest first, as they would have.
        store.evict(&mut index, u64::MAX);
        *store.index() = index;
        Ok(store)
    }

    /// Reads the sidecars back; removes what unfinished operations left and moves what cannot
    /// be read to `quarantine/`.
    fn recover(&self) -> Result<Index, StoreError> {
        let mut index = Index::default();
        let mut referenced = HashSet::new();
        let entries = std::fs::read_dir(&self.traces_dir).map_err(io(format!("cannot read {}", self.traces_dir.display())))?;
        let mut names: Vec<String> = entries.flatten().filter_map(|e| e.file_name().into_string().ok()).collect();
        names.sort();
        for name in &names {
            // Ids of files not read back still count: a new id never takes an old file's name.
            if let Some(ms) = leading_millis(name) {
                index.last_ms = index.last_ms.max(ms);
            }
            let Some(id) = name.strip_suffix(SIDECAR_SUFFIX) else { continue };
            referenced.insert(name.clone());
            let path = self.traces_dir.join(name);
            let Some(ms) = id_millis(id) else {
                self.quarantine(&path, "not a sidecar of this store (its name is not trace_<ms>.meta.json)");
                continue;
            };
            let parsed = std::fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<StoredTrace>(&b).map_err(|e| e.to_string()));
            let mut t = match parsed {
                Ok(t) => t,
                Err(e) => {
                    self.quarantine(&path, &format!("unreadable sidecar ({e})"));
                    continue;
                }
            };
            if t.trace_id != id || !is_trace_file_of(id, &t.file) {
                self.quarantine(&path, &format!("the sidecar names trace {} in file {:?}", t.trace_id, t.file));
                continue;
            }
            let trace_path = self.traces_dir.join(&t.file);
            let size = match std::fs::metadata(&trace_path) {
                Ok(m) => m.len(),
                Err(_) => {
                    // An insert that never committed, or a delete that never finished.
                    eprintln!(
                        "collector serve: removing {}: its trace file is not there (an insert or delete the server did not finish)",
                        path.display()
                    );
                    let _ = std::fs::remove_file(&path);
                    continue;
                }
            };
            referenced.insert(t.file.clone());
            if size != t.file_size_bytes {
                let why = format!("the trace file is {size} bytes, its sidecar says {}", t.file_size_bytes);
                self.quarantine(&trace_path, &why);
                self.quarantine(&path, &why);
                continue;
            }
            let prefix = format!("{id}.");
            t.exports.retain(|_, e| {
                is_plain_name(&e.file)
                    && e.file.starts_with(&prefix)
                    && std::fs::metadata(self.exports_dir.join(&e.file)).is_ok_and(|m| m.len() == e.file_size_bytes)
            });
            index.bytes += t.file_size_bytes;
            for e in t.exports.values() {
                index.bytes += e.file_size_bytes;
                index.exports.insert(e.file.clone(), ms);
            }
            index.traces.insert(ms, t);
        }
        // A trace file without a sidecar: no crash of this store leaves one.
        for name in names.iter().filter(|n| !referenced.contains(*n)) {
            self.quarantine(&self.traces_dir.join(name), "a trace file without its sidecar");
        }
        // Exports are made again on request: one no sidecar names (a crash between the
        // export's rename and its sidecar's) is removed.
        for e in std::fs::read_dir(&self.exports_dir).into_iter().flatten().flatten() {
            if !e.file_name().to_str().is_some_and(|n| index.exports.contains_key(n)) {
                let _ = std::fs::remove_file(e.path());
            }
        }
        for d in [&self.traces_dir, &self.exports_dir, &self.quarantine_dir] {
            sync_dir(d).map_err(io(format!("cannot sync {}", d.display())))?;
        }
        Ok(index)
    }

    /// Moves a file of `traces/` to `quarantine/` (never over another) and says so.
    fn quarantine(&self, path: &Path, why: &str) {
        let name = path.file_name().map_or_else(|| "unnamed".into(), |n| n.to_string_lossy().into_owned());
        let mut dest = self.quarantine_dir.join(&name);
        let mut n = 1;
        while dest.symlink_metadata().is_ok() {
            dest = self.quarantine_dir.join(format!("{name}.{n}"));
            n += 1;
        }
        match std::fs::rename(path, &dest) {
            Ok(()) => eprintln!("collector serve: quarantined {} ({why}): moved to {}", path.display(), dest.display()),
            Err(e) => eprintln!("collector serve: cannot quarantine {} ({why}; {e}); it stays where it is", path.display()),
        }
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

    /// How many traces and bytes the store holds.
    pub fn usage(&self) -> (usize, u64) {
        let index = self.index();
        (index.traces.len(), index.bytes)
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
        let refuse = |e: StoreError| {
            let _ = std::fs::remove_file(tmp);
            Err(e)
        };
        let Some(ms) = id_millis(id) else { return refuse(StoreError::NotFound(id.to_owned())) };
        // Its bytes reach the disk before its name does; outside the lock: a large trace
        // takes a while.
        let size = match sync_file(tmp) {
            Ok(s) => s,
            Err(e) => return refuse(io("cannot read the new trace")(e)),
        };
        let stored = match new_stored(id, origin, original_name, ext, info, size, self.limits) {
            Ok(s) => s,
            Err(e) => return refuse(e),
        };
        let file = stored.file.clone();
        let mut index = self.index();
        let dest = self.traces_dir.join(&file);
        let sidecar = self.traces_dir.join(sidecar_name(id));
        if index.traces.contains_key(&ms) || dest.symlink_metadata().is_ok() || sidecar.symlink_metadata().is_ok() {
            return refuse(StoreError::Exists(id.to_owned()));
        }
        // The sidecar first, then the trace file: that rename commits the trace.
        if let Err(e) = self.write_sidecar(&stored) {
            return refuse(e);
        }
        if let Err(e) = std::fs::rename(tmp, &dest).and_then(|()| sync_dir(&self.traces_dir)) {
            let _ = std::fs::remove_file(&dest);
            let _ = std::fs::remove_file(&sidecar);
            return refuse(io(format!("cannot move the trace into {}", dest.display()))(e));
        }
        index.bytes += size;
        index.traces.insert(ms, stored.clone());
        let evicted = self.evict(&mut index, ms);
        Ok((stored, evicted))
    }

    /// Evicts the oldest traces but `keep` until the limits hold; their ids.
    fn evict(&self, index: &mut Index, keep: u64) -> Vec<String> {
        let mut evicted = Vec::new();
        while index.traces.len() > self.limits.max_traces || index.bytes > self.limits.max_bytes {
            let Some(ms) = index.traces.keys().copied().find(|&k| k != keep) else { break };
            let Some(old) = index.traces.remove(&ms) else { break };
            if let Err(e) = self.remove_files(index, &old) {
                eprintln!("collector serve: cannot evict {}: {e}", old.trace_id);
                index.traces.insert(ms, old);
                break;
            }
            eprintln!(
                "collector serve: evicted {} (store limits: {} traces, {} bytes)",
                old.trace_id, self.limits.max_traces, self.limits.max_bytes
            );
            evicted.push(old.trace_id);
        }
        evicted
    }

    fn write_sidecar(&self, t: &StoredTrace) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec_pretty(t).map_err(|e| io("cannot encode the sidecar")(std::io::Error::other(e)))?;
        let dest = self.traces_dir.join(sidecar_name(&t.trace_id));
        self.write_atomic(&dest, &bytes)
    }

    /// Writes `bytes` to `dest` through a temporary file of the store's (the one atomic write,
    /// `traceio::files::write_atomic_via`: synced, renamed, its folder synced).
    fn write_atomic(&self, dest: &Path, bytes: &[u8]) -> Result<(), StoreError> {
        let tmp = self.local.temp_path("sidecar");
        traceio::files::write_atomic_via(dest, &tmp, |w| Ok(w.write_all(bytes)?))
            .map_err(|e| io(format!("cannot write {}", dest.display()))(std::io::Error::other(format!("{e:#}"))))?;
        Ok(())
    }

    /// Removes a trace's files, the trace file first (that uncommits it), and takes it out of
    /// the byte count and the exports. `t` is no longer in `index.traces`. Nothing changes
    /// when the trace file cannot be removed.
    fn remove_files(&self, index: &mut Index, t: &StoredTrace) -> Result<(), StoreError> {
        let trace = self.traces_dir.join(&t.file);
        remove_if_there(&trace).and_then(|()| sync_dir(&self.traces_dir)).map_err(io(format!("cannot remove {}", trace.display())))?;
        index.bytes = index.bytes.saturating_sub(t.file_size_bytes);
        for e in t.exports.values() {
            let _ = std::fs::remove_file(self.exports_dir.join(&e.file));
            index.exports.remove(&e.file);
            index.bytes = index.bytes.saturating_sub(e.file_size_bytes);
        }
        let _ = std::fs::remove_file(self.traces_dir.join(sidecar_name(&t.trace_id)));
        // What is left of it after a crash from here on is removed on start.
        let _ = sync_dir(&self.exports_dir);
        let _ = sync_dir(&self.traces_dir);
        Ok(())
    }

    pub fn get(&self, id: &str) -> Result<StoredTrace, StoreError> {
        let found = id_millis(id).and_then(|ms| self.index().traces.get(&ms).cloned());
        found.ok_or_else(|| StoreError::NotFound(id.to_owned()))
    }

    /// `f` of every stored trace, oldest first.
    pub fn map_all<T>(&self, f: impl FnMut(&StoredTrace) -> T) -> Vec<T> {
        self.index().traces.values().map(f).collect()
    }

    /// The trace file of a stored trace.
    pub fn trace_path(&self, t: &StoredTrace) -> PathBuf {
        self.traces_dir.join(&t.file)
    }

    /// A stored trace and its file, opened under the store's lock: a delete or eviction that
    /// comes after still lets the open file be read whole (Unix keeps an unlinked file's
    /// bytes while it is open); one that came before makes it `NotFound`.
    pub fn open_trace(&self, id: &str) -> Result<(StoredTrace, std::fs::File), StoreError> {
        let index = self.index();
        let t = id_millis(id).and_then(|ms| index.traces.get(&ms)).ok_or_else(|| StoreError::NotFound(id.to_owned()))?;
        let path = self.traces_dir.join(&t.file);
        let f = std::fs::File::open(&path).map_err(io(format!("cannot open {}", path.display())))?;
        Ok((t.clone(), f))
    }

    /// Deletes a trace and its exports, durably; returns how many traces remain.
    pub fn delete(&self, id: &str) -> Result<usize, StoreError> {
        let mut index = self.index();
        let ms = id_millis(id).filter(|ms| index.traces.contains_key(ms)).ok_or_else(|| StoreError::NotFound(id.to_owned()))?;
        let Some(t) = index.traces.remove(&ms) else { return Err(StoreError::NotFound(id.to_owned())) };
        if let Err(e) = self.remove_files(&mut index, &t) {
            index.traces.insert(ms, t);
            return Err(e);
        }
        Ok(index.traces.len())
    }

    /// The export already made, if any.
    pub fn existing_export(&self, id: &str, format: &str) -> Result<Option<ExportFile>, StoreError> {
        Ok(self.get(id)?.exports.get(format).cloned())
    }

    /// Moves `tmp` into the exports as trace `id`'s `format` export named `file`, durably.
    pub fn add_export(&self, id: &str, format: &str, file: String, tmp: &Path) -> Result<ExportFile, StoreError> {
        let size = match sync_file(tmp) {
            Ok(s) => s,
            Err(e) => {
                let _ = std::fs::remove_file(tmp);
                return Err(io("cannot read the new export")(e));
            }
        };
        let mut index = self.index();
        let ms = id_millis(id).filter(|ms| index.traces.contains_key(ms) && is_plain_name(&file) && file.starts_with(&format!("{id}.")));
        let Some(ms) = ms else {
            // Deleted (or evicted) while the export was being written.
            let _ = std::fs::remove_file(tmp);
            return Err(StoreError::NotFound(id.to_owned()));
        };
        let dest = self.exports_dir.join(&file);
        if let Err(e) = std::fs::rename(tmp, &dest).and_then(|()| sync_dir(&self.exports_dir)) {
            let _ = std::fs::remove_file(tmp);
            return Err(io(format!("cannot move the export into {}", dest.display()))(e));
        }
        let export = ExportFile { file: file.clone(), file_size_bytes: size };
        let Some(t) = index.traces.get_mut(&ms) else {
            return Err(StoreError::NotFound(id.to_owned()));
        };
        let old = t.exports.insert(format.to_owned(), export.clone());
        let updated = t.clone();
        index.bytes = index.bytes + size - old.map_or(0, |o| o.file_size_bytes);
        index.exports.insert(file, ms);
        // Under the lock: sidecars of one trace are written in the order of their changes. If
        // this fails, the sidecar on disk does not name the export and a restart removes it.
        self.write_sidecar(&updated)?;
        Ok(export)
    }

    /// An export file the store made, opened under its lock (see [`Store::open_trace`]): any
    /// other name (traversal, another folder, a sidecar) is `NotFound`.
    pub fn open_export(&self, file: &str) -> Result<std::fs::File, StoreError> {
        let index = self.index();
        if !is_plain_name(file) || !index.exports.contains_key(file) {
            return Err(StoreError::NotFound(file.to_owned()));
        }
        let path = self.exports_dir.join(file);
        std::fs::File::open(&path).map_err(io(format!("cannot open {}", path.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse() {
        assert_eq!(id_millis("trace_123"), Some(123));
        for bad in ["trace_", "trace_12a", "trace_-1", "x_1", "trace_1.json"] {
            assert_eq!(id_millis(bad), None, "{bad}");
        }
        assert_eq!(leading_millis("trace_123.meta.json"), Some(123));
        assert_eq!(leading_millis("trace_.pickle"), None);
    }

    fn info() -> TraceInfo {
        TraceInfo {
            model_name: "m".into(),
            total_events: 1,
            total_layers: 0,
            peak_allocated_mb: 0.0,
            peak_reserved_mb: 0.0,
            avg_fragmentation: 0.0,
            tracing_time_ms: 0.0,
            layer_stats: BTreeMap::new(),
            peak_allocated_bytes: 0,
            peak_reserved_bytes: 0,
            device: None,
            source_format: "memory_tracer".into(),
            dropped_events: 0,
        }
    }

    /// A store left over its limits (a crash between an insert's commit and its evictions, or
    /// a lower limit at restart) evicts at open, oldest first.
    #[test]
    fn opening_evicts_down_to_the_limits() {
        let root = std::env::temp_dir().join(format!("mt-store-open-evict-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let mut ids = Vec::new();
        {
            let store = crate::serve::store::Store::open(&root, None, StoreLimits { max_traces: 10, max_bytes: u64::MAX }).unwrap();
            for _ in 0..4 {
                let id = store.new_id();
                let tmp = store.temp_path("t");
                std::fs::write(&tmp, b"{}").unwrap();
                store.insert(&id, Origin::Uploaded, None, &tmp, ".mtrace.json", info()).unwrap();
                ids.push(id);
            }
        }
        let store = crate::serve::store::Store::open(&root, None, StoreLimits { max_traces: 3, max_bytes: u64::MAX }).unwrap();
        let kept: Vec<String> = store.map_all(|t| t.trace_id.clone()).unwrap();
        assert_eq!(kept, ids[1..].to_vec(), "the oldest goes");
        assert!(store.get(&ids[0]).is_err());
        let files = std::fs::read_dir(root.join("traces")).unwrap().count();
        assert_eq!(files, 2 * 3, "its files went with it");
        let _ = std::fs::remove_dir_all(&root);
    }
}
