//! Object storage: S3 and S3-compatible servers (MinIO, SeaweedFS, Ceph), Google Cloud
//! Storage, Azure Blob Storage and a local folder, through the `object_store` crate, behind a
//! blocking API (`collector serve --store` and `collector report --out`).
//!
//! A [`Bucket`] is a URL's bucket and prefix: `s3://BUCKET/PREFIX`, `gs://…`, `az://…`,
//! `file:///PATH`. Credentials, endpoint and region come from the standard environment
//! (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_ENDPOINT_URL`, `AWS_REGION`, …;
//! `GOOGLE_SERVICE_ACCOUNT`; `AZURE_STORAGE_ACCOUNT_NAME`, `AZURE_STORAGE_ACCOUNT_KEY`). The
//! bucket runs its own small runtime, so its methods may be called from any thread that is not
//! running async code (the server calls them from `spawn_blocking`).

use bytes::Bytes;
use futures_util::StreamExt;
use object_store::path::Path as Key;
use object_store::{Attribute, Attributes, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Files up to this size are sent in one request; larger ones as a multipart upload, which the
/// backend makes visible only when it completes.
const SINGLE_PUT_BYTES: u64 = 16 << 20;
/// The part size of multipart uploads (S3's minimum is 5 MiB).
const PART_BYTES: usize = 8 << 20;

/// Why an object operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    /// The URL or the environment is not usable; the text says what to set.
    #[error("{0}")]
    Config(String),
    /// A conditional create found the object there already.
    #[error("{0} already exists")]
    Exists(String),
    #[error("{what} ({url}): {source}")]
    Backend { what: String, url: String, source: object_store::Error },
    #[error("{0}")]
    Local(String),
}

/// Whether `s` names object storage rather than a local path.
pub fn is_object_url(s: &str) -> bool {
    ["s3://", "s3a://", "gs://", "az://", "azure://", "abfs://", "abfss://", "file://"].iter().any(|p| s.starts_with(p))
}

/// How a [`Bucket::put_file`] or [`Bucket::put_bytes`] writes.
#[derive(Clone, Copy, Debug, Default)]
pub struct Put<'a> {
    /// The object's Content-Type, for buckets served as websites.
    pub content_type: Option<&'a str>,
    /// Refuse to replace an object that is there ([`ObjectError::Exists`]) where the backend
    /// can (conditional puts); elsewhere a plain put.
    pub create: bool,
}

/// An object under the bucket's prefix.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Its key below the prefix (`traces/trace_1.json`).
    pub rel: String,
    pub size: u64,
    /// When the backend last wrote it, by the backend's clock, in Unix milliseconds.
    pub modified_ms: u64,
}

/// A bucket and prefix of object storage.
pub struct Bucket {
    url: String,
    scheme: Scheme,
    store: Arc<dyn ObjectStore>,
    prefix: Key,
    rt: Option<tokio::runtime::Runtime>,
    /// Whether conditional creates are sent (cleared when the backend says it has none).
    conditional: AtomicBool,
}

impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bucket").field("url", &self.url).finish_non_exhaustive()
    }
}

impl Drop for Bucket {
    fn drop(&mut self) {
        // Dropping a runtime blocks, which async code may not do; this does not.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Scheme {
    S3,
    Gcs,
    Azure,
    File,
}

impl Scheme {
    /// The environment variables that give this backend its credentials.
    fn credentials_hint(self) -> &'static str {
        match self {
            Scheme::S3 => "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_ENDPOINT_URL for an S3-compatible server such as MinIO or SeaweedFS)",
            Scheme::Gcs => "set GOOGLE_SERVICE_ACCOUNT (or GOOGLE_APPLICATION_CREDENTIALS) to a service account's key file",
            Scheme::Azure => "set AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY",
            Scheme::File => "check the folder's permissions",
        }
    }
}

fn backend(what: impl Into<String>, url: &str) -> impl FnOnce(object_store::Error) -> ObjectError {
    let (what, url) = (what.into(), url.to_owned());
    move |source| ObjectError::Backend { what, url, source }
}

/// ring as the process's TLS crypto provider (reqwest's rustls comes without one, see
/// Cargo.toml), once; a provider installed before stays.
fn install_tls_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The retries of every request: a dropped connection is retried a few times, then the caller
/// gets the error (and the client of the server a 5xx it can retry).
fn retry() -> object_store::RetryConfig {
    object_store::RetryConfig {
        backoff: object_store::BackoffConfig {
            init_backoff: std::time::Duration::from_millis(100),
            max_backoff: std::time::Duration::from_secs(2),
            base: 2.0,
        },
        max_retries: 3,
        retry_timeout: std::time::Duration::from_secs(30),
    }
}

/// Opens the bucket of `url` (`s3://BUCKET/PREFIX`, `gs://`, `az://`, `file:///PATH`), its
/// credentials from the environment. Nothing is sent yet: [`Bucket::check`] does that.
pub fn open(url: &str) -> Result<Bucket, ObjectError> {
    let env: Vec<(String, String)> =
        std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))).collect();
    open_with(url, &env)
}

/// [`open`] with `env` as the environment (the `AWS_*`, `GOOGLE_*` and `AZURE_*` variables are
/// read from it).
pub fn open_with(url: &str, env: &[(String, String)]) -> Result<Bucket, ObjectError> {
    install_tls_provider();
    let bad = |why: &str| ObjectError::Config(format!("{url}: {why}"));
    let var = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    // The variables of one backend, as `from_env` reads them, but from `env`.
    let configs =
        |start: &'static str| env.iter().filter(move |(k, _)| k.starts_with(start)).map(|(k, v)| (k.to_ascii_lowercase(), v.clone()));
    let parsed =
        url::Url::parse(url).map_err(|e| bad(&format!("not a URL ({e}); expected s3://BUCKET/PREFIX, gs://, az:// or file:///PATH")))?;
    if parsed.scheme() != "file" && parsed.host_str().is_none_or(str::is_empty) {
        return Err(bad("names no bucket; expected s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or az://CONTAINER/PREFIX"));
    }
    let (scheme, store): (Scheme, Arc<dyn ObjectStore>) = match parsed.scheme() {
        "s3" | "s3a" => {
            let mut b = object_store::aws::AmazonS3Builder::new();
            for (k, v) in configs("AWS_") {
                if let Ok(key) = k.parse() {
                    b = b.with_config(key, v);
                }
            }
            b = b.with_url(url).with_retry(retry()).with_conditional_put(object_store::aws::S3ConditionalPut::ETagMatch);
            let endpoint = ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"].iter().find_map(|v| var(v));
            if let Some(e) = endpoint.filter(|e| e.starts_with("http://")) {
                // An endpoint the user gave as plain HTTP (a server on premises, a test's).
                b = b.with_endpoint(e).with_allow_http(true);
            }
            if var("AWS_REGION").is_none() && var("AWS_DEFAULT_REGION").is_none() {
                b = b.with_region("us-east-1");
            }
            (Scheme::S3, Arc::new(b.build().map_err(|e| bad(&format!("{e}; {}", Scheme::S3.credentials_hint())))?))
        }
        "gs" => {
            let mut b = object_store::gcp::GoogleCloudStorageBuilder::new();
            for (k, v) in configs("GOOGLE_") {
                if let Ok(key) = k.parse() {
                    b = b.with_config(key, v);
                }
            }
            let b = b.with_url(url).with_retry(retry());
            (Scheme::Gcs, Arc::new(b.build().map_err(|e| bad(&format!("{e}; {}", Scheme::Gcs.credentials_hint())))?))
        }
        "az" | "azure" | "abfs" | "abfss" => {
            let mut b = object_store::azure::MicrosoftAzureBuilder::new();
            for (k, v) in configs("AZURE_") {
                if let Ok(key) = k.parse() {
                    b = b.with_config(key, v);
                }
            }
            let b = b.with_url(url).with_retry(retry());
            (Scheme::Azure, Arc::new(b.build().map_err(|e| bad(&format!("{e}; {}", Scheme::Azure.credentials_hint())))?))
        }
        "file" => {
            let dir = parsed.to_file_path().map_err(|()| bad("expected file:///ABSOLUTE/PATH"))?;
            std::fs::create_dir_all(&dir).map_err(|e| bad(&format!("cannot create {}: {e}", dir.display())))?;
            let fs = object_store::local::LocalFileSystem::new_with_prefix(&dir).map_err(|e| bad(&e.to_string()))?;
            return Bucket::new(url, Scheme::File, Arc::new(fs.with_automatic_cleanup(true)), Key::default());
        }
        other => return Err(bad(&format!("unknown scheme `{other}`; expected s3://, gs://, az:// or file://"))),
    };
    let path = parsed.path().trim_matches('/');
    let prefix = Key::from_url_path(path).map_err(|e| bad(&format!("the prefix `{path}` is not a valid object key: {e}")))?;
    Bucket::new(url, scheme, store, prefix)
}

impl Bucket {
    fn new(url: &str, scheme: Scheme, store: Arc<dyn ObjectStore>, prefix: Key) -> Result<Self, ObjectError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("object-store")
            .enable_all()
            .build()
            .map_err(|e| ObjectError::Local(format!("cannot start the object store's runtime: {e}")))?;
        Ok(Self { url: url.to_owned(), scheme, store, prefix, rt: Some(rt), conditional: AtomicBool::new(scheme != Scheme::File) })
    }

    /// The URL it was opened with.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        match &self.rt {
            Some(rt) => rt.block_on(f),
            None => unreachable!("the runtime is taken only on drop"),
        }
    }

    fn key(&self, rel: &str) -> Key {
        rel.split('/').filter(|p| !p.is_empty()).fold(self.prefix.clone(), |k, part| k.clone().join(part))
    }

    /// `url/rel`, for messages.
    pub fn display(&self, rel: &str) -> String {
        format!("{}/{rel}", self.url.trim_end_matches('/'))
    }

    /// Writes and removes a probe object, so a bucket that does not exist, refuses the
    /// credentials or cannot be reached is said at start, with what to set. Returns the
    /// bucket's clock (the probe's modification time, Unix ms), which the server ages objects by.
    pub fn check(&self, probe: &str) -> Result<u64, ObjectError> {
        let rel = format!(".probe/{probe}");
        let key = self.key(&rel);
        let written = self.block_on(async {
            self.store.put(&key, PutPayload::from_static(b"memory-tracer probe")).await?;
            let meta = self.store.head(&key).await?;
            self.store.delete(&key).await?;
            Ok::<_, object_store::Error>(meta.last_modified.timestamp_millis().max(0) as u64)
        });
        written.map_err(|e| {
            let bucket = self.url.as_str();
            let hint = self.scheme.credentials_hint();
            let text = e.to_string();
            // S3's own error code, when the answer carried one.
            let code = text.split("<Code>").nth(1).and_then(|c| c.split("</Code>").next()).unwrap_or("").to_owned();
            let refused = ["InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"].contains(&code.as_str());
            ObjectError::Config(match &e {
                _ if refused => format!("{bucket} refused these credentials ({code}): {hint}"),
                _ if code == "RequestTimeTooSkewed" => format!(
                    "{bucket} refused this machine's requests because its clock is too far from the storage server's ({code}; S3 allows 15 minutes): set the clock (NTP)"
                ),
                object_store::Error::Unauthenticated { .. } => format!("{bucket} refused these credentials: {hint}"),
                object_store::Error::NotFound { .. } => {
                    format!("the bucket of {bucket} does not exist (or these credentials cannot see it): create it, or {hint}")
                }
                object_store::Error::PermissionDenied { .. } => format!(
                    "{bucket} denied access ({}): the bucket does not exist, or these credentials may not write to it: create it, or {hint}",
                    if code.is_empty() { "403" } else { &code }
                ),
                _ => format!("cannot write to {bucket} ({e}): {hint}; AWS_ENDPOINT_URL gives an S3-compatible server's address"),
            })
        })
    }

    fn put_options(&self, put: Put<'_>) -> PutOptions {
        let mut attributes = Attributes::new();
        // A folder keeps no attributes (object_store refuses them there).
        if let Some(ct) = put.content_type.filter(|_| self.scheme != Scheme::File) {
            attributes.insert(Attribute::ContentType, ct.to_owned().into());
        }
        let mode = if put.create && self.conditional.load(Ordering::Relaxed) { PutMode::Create } else { PutMode::Overwrite };
        PutOptions { mode, attributes, ..Default::default() }
    }

    /// Writes `bytes` as object `rel`, whole or not at all.
    pub fn put_bytes(&self, rel: &str, bytes: Bytes, put: Put<'_>) -> Result<(), ObjectError> {
        let key = self.key(rel);
        let r = self.block_on(self.store.put_opts(&key, PutPayload::from(bytes.clone()), self.put_options(put)));
        match r {
            Ok(_) => Ok(()),
            Err(object_store::Error::AlreadyExists { .. }) => Err(ObjectError::Exists(self.display(rel))),
            Err(object_store::Error::NotImplemented { .. }) if put.create => {
                // The backend has no conditional puts: ids are unique by construction anyway.
                self.conditional.store(false, Ordering::Relaxed);
                self.put_bytes(rel, bytes, Put { create: false, ..put })
            }
            Err(e) => Err(backend(format!("cannot write {rel}"), &self.url)(e)),
        }
    }

    /// Writes the file at `path` as object `rel`: in one request, or as a multipart upload that
    /// is completed before this returns (aborted on failure). Returns its size.
    pub fn put_file(&self, rel: &str, path: &Path, put: Put<'_>) -> Result<u64, ObjectError> {
        let local = |e: std::io::Error| ObjectError::Local(format!("cannot read {}: {e}", path.display()));
        let mut file = std::fs::File::open(path).map_err(local)?;
        let size = file.metadata().map_err(local)?.len();
        if size <= SINGLE_PUT_BYTES {
            let mut buf = Vec::with_capacity(size as usize);
            file.read_to_end(&mut buf).map_err(local)?;
            self.put_bytes(rel, Bytes::from(buf), put)?;
            return Ok(size);
        }
        let key = self.key(rel);
        let opts = object_store::PutMultipartOptions { attributes: self.put_options(put).attributes, ..Default::default() };
        let failed = backend(format!("cannot upload {rel}"), &self.url);
        self.block_on(async {
            let upload = self.store.put_multipart_opts(&key, opts).await?;
            let mut w = object_store::WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
            let mut buf = vec![0u8; PART_BYTES];
            loop {
                let n = match file.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) => {
                        let _ = w.abort().await;
                        return Err(object_store::Error::Generic { store: "local file", source: Box::new(e) });
                    }
                };
                w.write(&buf[..n]);
                // At most four parts in flight: memory stays bounded whatever the size.
                if let Err(e) = w.wait_for_capacity(4).await {
                    // Parts already sent are dropped with the upload, never completed.
                    let _ = w.abort().await;
                    return Err(e);
                }
            }
            w.finish().await.map(|_| ())
        })
        .map_err(failed)?;
        Ok(size)
    }

    /// Object `rel`'s bytes; `None` when there is none.
    pub fn get_bytes(&self, rel: &str) -> Result<Option<Bytes>, ObjectError> {
        let key = self.key(rel);
        match self.block_on(async { self.store.get(&key).await?.bytes().await }) {
            Ok(b) => Ok(Some(b)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(backend(format!("cannot read {rel}"), &self.url)(e)),
        }
    }

    /// Streams object `rel` into the new file `dest`; its size, or `None` when there is none.
    pub fn get_to_file(&self, rel: &str, dest: &Path) -> Result<Option<u64>, ObjectError> {
        let key = self.key(rel);
        let mut out = std::fs::File::create(dest).map_err(|e| ObjectError::Local(format!("cannot create {}: {e}", dest.display())))?;
        let r = self.block_on(async {
            let mut stream = self.store.get(&key).await?.into_stream();
            let mut n = 0u64;
            while let Some(chunk) = stream.next().await {
                let chunk = chunk?;
                out.write_all(&chunk).map_err(|e| object_store::Error::Generic { store: "local file", source: Box::new(e) })?;
                n += chunk.len() as u64;
            }
            Ok::<_, object_store::Error>(n)
        });
        match r {
            Ok(n) => Ok(Some(n)),
            Err(object_store::Error::NotFound { .. }) => {
                let _ = std::fs::remove_file(dest);
                Ok(None)
            }
            Err(e) => {
                let _ = std::fs::remove_file(dest);
                Err(backend(format!("cannot read {rel}"), &self.url)(e))
            }
        }
    }

    /// Removes object `rel`; one that is not there is no error.
    pub fn delete(&self, rel: &str) -> Result<(), ObjectError> {
        let key = self.key(rel);
        match self.block_on(self.store.delete(&key)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(backend(format!("cannot delete {rel}"), &self.url)(e)),
        }
    }

    /// Every object whose key below the prefix starts with folder `dir` (`traces`), at any depth.
    pub fn list(&self, dir: &str) -> Result<Vec<Entry>, ObjectError> {
        let key = self.key(dir);
        let base = self.prefix.as_ref().len();
        let r = self.block_on(async {
            let mut stream = self.store.list(Some(&key));
            let mut found = Vec::new();
            while let Some(meta) = stream.next().await {
                let meta = meta?;
                let full = meta.location.as_ref();
                let rel = if base == 0 { full } else { full.get(base + 1..).unwrap_or("") };
                found.push(Entry {
                    rel: rel.to_owned(),
                    size: meta.size,
                    modified_ms: meta.last_modified.timestamp_millis().max(0) as u64,
                });
            }
            Ok::<_, object_store::Error>(found)
        });
        r.map_err(backend(format!("cannot list {dir}/"), &self.url))
    }
}

/// The Content-Type a static website serves a file of this name as.
pub fn content_type(name: &str) -> &'static str {
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
        Some("gz") => "application/gzip",
        Some("csv") => "text/csv; charset=utf-8",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_urls_are_told_from_paths() {
        for url in ["s3://b/p", "gs://b", "az://c/p", "file:///tmp/x"] {
            assert!(is_object_url(url), "{url}");
        }
        for path in ["/tmp/x", "s3", "report/", "C:/x", "http://host/x"] {
            assert!(!is_object_url(path), "{path}");
        }
    }

    #[test]
    fn bad_urls_say_what_was_expected() {
        let e = open("s4://bucket/x").unwrap_err().to_string();
        assert!(e.contains("unknown scheme `s4`") && e.contains("s3://"), "{e}");
        for url in ["s3:/", "s3://", "s3:///x", "gs://"] {
            let e = open(url).unwrap_err().to_string();
            assert!(e.starts_with(url) && e.contains("names no bucket"), "{e}");
        }
    }

    /// The cloud backends build their HTTPS clients: rustls with ring, the one crypto provider
    /// compiled in (without one installed, building a client panics).
    #[test]
    fn cloud_buckets_get_https_clients() {
        let env: Vec<(String, String)> = [
            ("AWS_ACCESS_KEY_ID", "k"),
            ("AWS_SECRET_ACCESS_KEY", "s"),
            ("AWS_ENDPOINT_URL", "https://127.0.0.1:9"),
            ("AZURE_STORAGE_ACCOUNT_NAME", "a"),
            ("AZURE_STORAGE_ACCOUNT_KEY", "a2V5"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .to_vec();
        for url in ["s3://bucket/runs", "az://container/runs"] {
            let b = open_with(url, &env).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(b.url(), url);
        }
        assert!(rustls::crypto::CryptoProvider::get_default().is_some());
    }

    /// A folder as a bucket: puts, lists, reads and deletes under the prefix.
    #[test]
    fn a_local_bucket_round_trips() {
        let dir = std::env::temp_dir().join(format!("mt-objects-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let b = open(&format!("file://{}", dir.display())).unwrap();
        b.check("t").unwrap();
        let json = Put { content_type: Some("application/json"), create: true };
        b.put_bytes("a/x.json", Bytes::from_static(b"{}"), json).unwrap();
        let src = dir.with_extension("src");
        std::fs::write(&src, vec![7u8; 100]).unwrap();
        assert_eq!(b.put_file("a/y.bin", &src, Put::default()).unwrap(), 100);
        let mut names: Vec<(String, u64)> = b.list("a").unwrap().into_iter().map(|e| (e.rel, e.size)).collect();
        names.sort();
        assert_eq!(names, [("a/x.json".to_owned(), 2), ("a/y.bin".to_owned(), 100)]);
        assert_eq!(b.get_bytes("a/x.json").unwrap().as_deref(), Some(&b"{}"[..]));
        assert_eq!(b.get_bytes("a/none").unwrap(), None);
        let back = dir.with_extension("back");
        assert_eq!(b.get_to_file("a/y.bin", &back).unwrap(), Some(100));
        b.delete("a/x.json").unwrap();
        b.delete("a/x.json").unwrap();
        assert_eq!(b.list("a").unwrap().len(), 1);
        for p in [&src, &back] {
            let _ = std::fs::remove_file(p);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
