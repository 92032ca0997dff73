//! The trace store in a bucket of object storage (`collector serve --store s3://BUCKET/PREFIX`),
//! shared by every server given the same URL.
//!
//! ```text
//! PREFIX/traces/<id><ext>                 the trace, written first
//! PREFIX/meta/<id>.json                   its StoredTrace, written last: the commit
//! PREFIX/exports/<id>/<format>/<file>     exports made through the API
//! PREFIX/.probe/<tag>                     written and removed at start (the bucket's clock)
//! DATA_DIR/cache/{traces,exports}/        what this server read from the bucket
//! ```
//!
//! The commit protocol: an insert writes the trace object (a multipart upload above 16 MiB,
//! completed before the next step), then the metadata object with a conditional create where
//! the backend has one; listing and reading go by metadata, so nothing half-written is ever
//! visible. A delete removes the metadata first (every server then answers 404), then the trace
//! and its exports. Metadata never changes once written: exports are objects of their own,
//! found by listing, so no two servers ever race to rewrite one object. Ids are
//! `trace_<ms>_<tag>`, `<tag>` this server's random part, so ids of servers sharing a bucket
//! never meet, whatever their clocks say; the order of traces (what is evicted first) is the
//! bucket's own clock, the metadata objects' modification times. At start a server removes
//! trace and export objects that no metadata names and that are more than an hour old by the
//! bucket's clock (an insert or delete that stopped half-way); objects under the prefix that
//! this store did not write are left alone and named once in the log.

use super::{is_plain_name, is_trace_file_of, new_stored, now_ms, Local, StoreError, StoreLimits};
use crate::objects::{self, Bucket, ObjectError, Put};
use protocol::{ExportFile, Origin, StoredTrace, TraceInfo};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Objects no metadata names are removed once this old (by the bucket's clock): an insert in
/// flight on another server writes its trace object and its metadata well within it.
const ORPHAN_AGE_MS: u64 = 3600 * 1000;

impl From<ObjectError> for StoreError {
    fn from(e: ObjectError) -> Self {
        StoreError::Backend(e.to_string())
    }
}

/// `trace_<ms>_<tag>` (or a folder store's `trace_<ms>`) → ms.
fn id_millis(id: &str) -> Option<u64> {
    let rest = id.strip_prefix("trace_")?;
    let (digits, tag) = rest.split_once('_').unwrap_or((rest, ""));
    let tag_ok = tag.len() <= 16 && tag.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    let digits_ok = !digits.is_empty() && digits.len() <= 20 && digits.bytes().all(|b| b.is_ascii_digit());
    if !(tag_ok && digits_ok) || (rest.contains('_') && tag.is_empty()) {
        return None;
    }
    digits.parse().ok()
}

/// A random tag for this server's ids: 8 hex digits from the kernel's random source.
fn random_tag() -> String {
    use std::io::Read;
    let mut b = [0u8; 4];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    if read.is_err() {
        // No /dev/urandom: the process id and the clock, hashed.
        let seed = format!("{}-{:?}", std::process::id(), std::time::SystemTime::now());
        use sha2::Digest;
        b.copy_from_slice(&sha2::Sha256::digest(seed.as_bytes())[..4]);
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[derive(Debug, Default)]
struct Seen {
    /// Metadata read so far (it never changes), by id, with its modification time.
    metas: HashMap<String, (u64, StoredTrace)>,
    /// Names under the prefix already said to be ignored.
    ignored: HashSet<String>,
    last_ms: u64,
    usage: (usize, u64),
}

/// The store in a bucket.
#[derive(Debug)]
pub struct Shared {
    bucket: Bucket,
    local: Arc<Local>,
    cache_dir: PathBuf,
    limits: StoreLimits,
    tag: String,
    seen: Mutex<Seen>,
}

fn meta_key(id: &str) -> String {
    format!("meta/{id}.json")
}

fn export_key(id: &str, format: &str, file: &str) -> String {
    format!("exports/{id}/{format}/{file}")
}

impl Shared {
    /// Opens the bucket of `url`, checks it can be written, and removes what stopped
    /// half-way long ago.
    pub fn open(url: &str, local: Arc<Local>, limits: StoreLimits) -> Result<Self, StoreError> {
        let bucket = objects::open(url).map_err(|e| StoreError::Backend(e.to_string()))?;
        let tag = random_tag();
        let clock = bucket.check(&tag).map_err(|e| StoreError::Backend(e.to_string()))?;
        let cache_dir = local.root.join("cache");
        for d in ["traces", "exports"] {
            let dir = cache_dir.join(d);
            std::fs::create_dir_all(&dir).map_err(super::io(format!("cannot create {}", dir.display())))?;
        }
        let store = Self { bucket, local, cache_dir, limits, tag, seen: Mutex::new(Seen::default()) };
        let metas = store.refresh()?;
        store.remove_orphans(&metas, clock)?;
        Ok(store)
    }

    pub fn url(&self) -> &str {
        self.bucket.url()
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Says once that `name` under the prefix is not this store's and is left alone.
    fn ignore(&self, name: &str, why: &str) {
        if self.seen().ignored.insert(name.to_owned()) {
            eprintln!("collector serve: ignoring {} ({why}); it is left as it is", self.bucket.display(name));
        }
    }

    pub fn new_id(&self) -> String {
        let mut seen = self.seen();
        let ms = now_ms().max(seen.last_ms + 1);
        seen.last_ms = ms;
        format!("trace_{ms}_{}", self.tag)
    }

    pub fn usage(&self) -> (usize, u64) {
        self.seen().usage
    }

    /// Reads metadata object `id`'s bytes into a checked StoredTrace; `None` when there is none
    /// or it is not this store's (said once).
    fn read_meta(&self, id: &str) -> Result<Option<StoredTrace>, StoreError> {
        let Some(bytes) = self.bucket.get_bytes(&meta_key(id))? else { return Ok(None) };
        let t = match serde_json::from_slice::<StoredTrace>(&bytes) {
            Ok(t) if t.trace_id == id && is_trace_file_of(id, &t.file) => t,
            Ok(t) => {
                self.ignore(&meta_key(id), &format!("it names trace {} in file {:?}", t.trace_id, t.file));
                return Ok(None);
            }
            Err(e) => {
                self.ignore(&meta_key(id), &format!("not a trace's metadata: {e}"));
                return Ok(None);
            }
        };
        Ok(Some(t))
    }

    /// The exports of trace `id`, by listing them.
    fn exports_of(&self, id: &str) -> Result<BTreeMap<String, ExportFile>, StoreError> {
        let mut found = BTreeMap::new();
        for e in self.bucket.list(&format!("exports/{id}"))? {
            let mut parts = e.rel.split('/').skip(2);
            let (Some(format), Some(file), None) = (parts.next(), parts.next(), parts.next()) else { continue };
            if is_plain_name(format) && is_plain_name(file) && file.starts_with(&format!("{id}.")) {
                found.insert(format.to_owned(), ExportFile { file: file.to_owned(), file_size_bytes: e.size });
            }
        }
        Ok(found)
    }

    /// Lists the bucket: every committed trace with its exports, oldest first (by the bucket's
    /// clock), and the usage they add up to.
    fn refresh(&self) -> Result<Vec<(u64, StoredTrace)>, StoreError> {
        let listed = self.bucket.list("meta")?;
        let exports = self.bucket.list("exports")?;
        let mut live = HashSet::new();
        let mut found = Vec::new();
        for e in &listed {
            let Some(id) = e.rel.strip_prefix("meta/").and_then(|n| n.strip_suffix(".json")).filter(|id| id_millis(id).is_some()) else {
                self.ignore(&e.rel, "not a metadata object of this store");
                continue;
            };
            live.insert(id.to_owned());
            let known = self.seen().metas.get(id).cloned();
            let t = match known {
                Some((_, t)) => t,
                None => match self.read_meta(id)? {
                    Some(t) => t,
                    None => continue,
                },
            };
            self.seen().metas.insert(id.to_owned(), (e.modified_ms, t.clone()));
            found.push((e.modified_ms, t));
        }
        let mut by_id: HashMap<&str, BTreeMap<String, ExportFile>> = HashMap::new();
        for e in &exports {
            let mut parts = e.rel.split('/').skip(1);
            let (Some(id), Some(format), Some(file)) = (parts.next(), parts.next(), parts.next()) else { continue };
            if file.starts_with(&format!("{id}.")) && is_plain_name(file) && is_plain_name(format) {
                by_id.entry(id).or_default().insert(format.to_owned(), ExportFile { file: file.to_owned(), file_size_bytes: e.size });
            }
        }
        for (_, t) in &mut found {
            t.exports = by_id.remove(t.trace_id.as_str()).unwrap_or_default();
        }
        found.sort_by(|a, b| (a.0, &a.1.trace_id).cmp(&(b.0, &b.1.trace_id)));
        let bytes = found.iter().map(|(_, t)| t.file_size_bytes + t.exports.values().map(|e| e.file_size_bytes).sum::<u64>()).sum();
        let mut seen = self.seen();
        seen.metas.retain(|id, _| live.contains(id));
        seen.usage = (found.len(), bytes);
        if let Some(ms) = found.iter().filter_map(|(_, t)| id_millis(&t.trace_id)).max() {
            // A restarted server never hands out an id below those it sees.
            seen.last_ms = seen.last_ms.max(ms.min(now_ms() + ORPHAN_AGE_MS));
        }
        Ok(found)
    }

    /// Removes trace and export objects no metadata names, older than [`ORPHAN_AGE_MS`] by the
    /// bucket's clock `now`.
    fn remove_orphans(&self, metas: &[(u64, StoredTrace)], now: u64) -> Result<(), StoreError> {
        let named: HashSet<&str> = metas.iter().map(|(_, t)| t.trace_id.as_str()).collect();
        let mut removed = 0;
        for dir in ["traces", "exports"] {
            for e in self.bucket.list(dir)? {
                let name = e.rel.split('/').nth(1).unwrap_or("");
                let id = name.split('.').next().unwrap_or("");
                if id_millis(id).is_none() {
                    self.ignore(&e.rel, "not an object of this store");
                    continue;
                }
                if !named.contains(id) && e.modified_ms + ORPHAN_AGE_MS < now {
                    self.bucket.delete(&e.rel)?;
                    removed += 1;
                }
            }
        }
        if removed > 0 {
            eprintln!("collector serve: removed {removed} object(s) of {} that no trace's metadata names (inserts or deletes that stopped half-way)", self.url());
        }
        Ok(())
    }

    pub fn insert(
        &self,
        id: &str,
        origin: Origin,
        original_name: Option<String>,
        tmp: &Path,
        ext: &str,
        info: TraceInfo,
    ) -> Result<(StoredTrace, Vec<String>), StoreError> {
        let committed = self.commit(id, origin, original_name, tmp, ext, info);
        if committed.is_err() {
            let _ = std::fs::remove_file(tmp);
        }
        let stored = committed?;
        // This server reads it from its cache from now on.
        let _ = std::fs::rename(tmp, self.cache_dir.join("traces").join(&stored.file));
        let evicted = self.evict(id)?;
        Ok((stored, evicted))
    }

    /// Writes the trace object, then its metadata (the commit).
    fn commit(
        &self,
        id: &str,
        origin: Origin,
        original_name: Option<String>,
        tmp: &Path,
        ext: &str,
        info: TraceInfo,
    ) -> Result<StoredTrace, StoreError> {
        if id_millis(id).is_none() {
            return Err(StoreError::NotFound(id.to_owned()));
        }
        let size = std::fs::metadata(tmp).map_err(super::io("cannot read the new trace"))?.len();
        let stored = new_stored(id, origin, original_name, ext, info, size, self.limits)?;
        let file = stored.file.clone();
        if self.bucket.get_bytes(&meta_key(id))?.is_some() {
            return Err(StoreError::Exists(id.to_owned()));
        }
        let trace_key = format!("traces/{file}");
        self.bucket.put_file(&trace_key, tmp, Put { content_type: None, create: true })?;
        let meta = serde_json::to_vec_pretty(&stored).map_err(|e| StoreError::Backend(format!("cannot encode the metadata: {e}")))?;
        let put = Put { content_type: Some("application/json"), create: true };
        if let Err(e) = self.bucket.put_bytes(&meta_key(id), meta.into(), put) {
            if !matches!(e, ObjectError::Exists(_)) {
                let _ = self.bucket.delete(&trace_key);
            }
            return Err(match e {
                ObjectError::Exists(_) => StoreError::Exists(id.to_owned()),
                e => e.into(),
            });
        }
        Ok(stored)
    }

    /// Evicts the oldest traces but `keep` until the limits hold; their ids.
    fn evict(&self, keep: &str) -> Result<Vec<String>, StoreError> {
        let mut all = self.refresh()?;
        let mut bytes = self.usage().1;
        let mut evicted = Vec::new();
        while all.len() > self.limits.max_traces || bytes > self.limits.max_bytes {
            let Some(k) = all.iter().position(|(_, t)| t.trace_id != keep) else { break };
            let (_, old) = all.remove(k);
            if let Err(e) = self.remove(&old) {
                eprintln!("collector serve: cannot evict {}: {e}", old.trace_id);
                break;
            }
            bytes = bytes.saturating_sub(old.file_size_bytes + old.exports.values().map(|e| e.file_size_bytes).sum::<u64>());
            eprintln!(
                "collector serve: evicted {} (store limits: {} traces, {} bytes)",
                old.trace_id, self.limits.max_traces, self.limits.max_bytes
            );
            evicted.push(old.trace_id);
        }
        self.seen().usage = (all.len(), bytes);
        Ok(evicted)
    }

    /// Removes a trace: its metadata first (that uncommits it), then its objects and cached files.
    fn remove(&self, t: &StoredTrace) -> Result<(), StoreError> {
        self.bucket.delete(&meta_key(&t.trace_id))?;
        self.seen().metas.remove(&t.trace_id);
        // What is left of it after a failure from here on is removed by a later start.
        let _ = self.bucket.delete(&format!("traces/{}", t.file));
        let _ = std::fs::remove_file(self.cache_dir.join("traces").join(&t.file));
        for e in self.bucket.list(&format!("exports/{}", t.trace_id)).unwrap_or_default() {
            let _ = self.bucket.delete(&e.rel);
            if let Some(file) = e.rel.rsplit('/').next() {
                let _ = std::fs::remove_file(self.cache_dir.join("exports").join(file));
            }
        }
        Ok(())
    }

    pub fn get(&self, id: &str) -> Result<StoredTrace, StoreError> {
        if id_millis(id).is_none() {
            return Err(StoreError::NotFound(id.to_owned()));
        }
        let mut t = self.read_meta(id)?.ok_or_else(|| StoreError::NotFound(id.to_owned()))?;
        t.exports = self.exports_of(id)?;
        Ok(t)
    }

    pub fn map_all<T>(&self, f: impl FnMut(&StoredTrace) -> T) -> Result<Vec<T>, StoreError> {
        Ok(self.refresh()?.iter().map(|(_, t)| t).map(f).collect())
    }

    /// `cache/<dir>/<file>` holding object `key` of `size` bytes: the cached copy, else read
    /// now. `NotFound(id)` when the object is gone (deleted meanwhile).
    fn cached(&self, dir: &str, file: &str, key: &str, size: u64, id: &str) -> Result<PathBuf, StoreError> {
        let path = self.cache_dir.join(dir).join(file);
        if std::fs::metadata(&path).is_ok_and(|m| m.len() == size) {
            return Ok(path);
        }
        let tmp = self.local.temp_path(file);
        match self.bucket.get_to_file(key, &tmp)? {
            None => Err(StoreError::NotFound(id.to_owned())),
            Some(n) if n != size => {
                let _ = std::fs::remove_file(&tmp);
                Err(StoreError::Backend(format!("{} is {n} bytes, its metadata says {size}", self.bucket.display(key))))
            }
            Some(_) => {
                std::fs::rename(&tmp, &path).map_err(super::io(format!("cannot cache {}", path.display())))?;
                self.trim_cache(dir);
                Ok(path)
            }
        }
    }

    /// Keeps the cache under the store's byte limit: the files read longest ago go first (none
    /// read in the last minute, which a request may be about to open).
    fn trim_cache(&self, dir: &str) {
        let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = std::fs::read_dir(self.cache_dir.join(dir))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                Some((m.modified().ok()?, m.len(), e.path()))
            })
            .collect();
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        files.sort();
        let recent = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
        for (when, len, path) in files {
            if total <= self.limits.max_bytes || when > recent {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                total -= len;
            }
        }
    }

    pub fn trace_path(&self, t: &StoredTrace) -> Result<PathBuf, StoreError> {
        self.cached("traces", &t.file, &format!("traces/{}", t.file), t.file_size_bytes, &t.trace_id)
    }

    pub fn open_trace(&self, id: &str) -> Result<(StoredTrace, std::fs::File), StoreError> {
        let t = self.get(id)?;
        let path = self.trace_path(&t)?;
        let f = std::fs::File::open(&path).map_err(super::io(format!("cannot open {}", path.display())))?;
        Ok((t, f))
    }

    pub fn delete(&self, id: &str) -> Result<usize, StoreError> {
        let t = self.get(id)?;
        self.remove(&t)?;
        Ok(self.refresh()?.len())
    }

    pub fn existing_export(&self, id: &str, format: &str) -> Result<Option<ExportFile>, StoreError> {
        Ok(self.get(id)?.exports.remove(format))
    }

    pub fn add_export(&self, id: &str, format: &str, file: String, tmp: &Path) -> Result<ExportFile, StoreError> {
        let stored = (|| {
            if !is_plain_name(&file) || !is_plain_name(format) || !file.starts_with(&format!("{id}.")) {
                return Err(StoreError::NotFound(id.to_owned()));
            }
            self.get(id)?;
            let key = export_key(id, format, &file);
            let size = self.bucket.put_file(&key, tmp, Put { content_type: Some(objects::content_type(&file)), create: false })?;
            // Deleted meanwhile (by any server): the export goes too.
            if self.bucket.get_bytes(&meta_key(id))?.is_none() {
                let _ = self.bucket.delete(&key);
                return Err(StoreError::NotFound(id.to_owned()));
            }
            Ok(ExportFile { file: file.clone(), file_size_bytes: size })
        })();
        match &stored {
            Ok(_) => {
                let _ = std::fs::rename(tmp, self.cache_dir.join("exports").join(&file));
            }
            Err(_) => {
                let _ = std::fs::remove_file(tmp);
            }
        }
        stored
    }

    pub fn open_export(&self, file: &str) -> Result<std::fs::File, StoreError> {
        let not_found = || StoreError::NotFound(file.to_owned());
        let id = file.split('.').next().filter(|id| is_plain_name(file) && id_millis(id).is_some()).ok_or_else(not_found)?;
        let t = self.get(id).map_err(|e| if matches!(e, StoreError::NotFound(_)) { not_found() } else { e })?;
        let (format, e) = t.exports.iter().find(|(_, e)| e.file == file).ok_or_else(not_found)?;
        let path = self.cached("exports", file, &export_key(id, format, file), e.file_size_bytes, id).map_err(|e| {
            if matches!(e, StoreError::NotFound(_)) {
                not_found()
            } else {
                e
            }
        })?;
        std::fs::File::open(&path).map_err(super::io(format!("cannot open {}", path.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_ids_parse() {
        assert_eq!(id_millis("trace_123_0a1b2c3d"), Some(123));
        assert_eq!(id_millis("trace_123"), Some(123));
        for bad in ["trace_", "trace_12a", "trace_1_", "trace_1_A", "trace_1_a_b", "trace_1.json", "x_1_ab", "trace__ab"] {
            assert_eq!(id_millis(bad), None, "{bad}");
        }
        assert_eq!(random_tag().len(), 8);
    }
}
