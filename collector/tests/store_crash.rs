//! The trace store under crashes and races: `collector serve` killed (SIGKILL) at random
//! points of uploads, exports, deletes and traced inserts, restarted and checked (every trace
//! answered with success is there and whole, nothing half-written is visible); deletes racing
//! exports, downloads, evictions and followers; the data directory's lock; quarantine.
//!
//! The crash campaign is seeded: `STORE_CRASH_ITERATIONS` (default 12 kills, two to three
//! seconds each; the eviction campaign runs half as many) and `STORE_CRASH_SEED` set it; a failure prints the seed and iteration to replay.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

mod server;

use serde_json::{json, Value};
use server::{scratch, Server};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data").join(name)
}

/// Small samples of every format the server reads, uploaded under their own names.
const SAMPLES: [&str; 4] = ["dftracer_sample.pfw.gz", "oom_program.mtrace.json", "convnet_profiler_trace.json", "mlp_adam_3steps.pickle"];

fn samples() -> Arc<Vec<Vec<u8>>> {
    Arc::new(SAMPLES.iter().map(|n| std::fs::read(data(n)).unwrap()).collect())
}

/// splitmix64: a seeded generator, so a failing campaign can be replayed.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// `(status, body)`, or `None` when no answer came (the server was killed).
fn call(r: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Option<(u16, Vec<u8>)> {
    let mut r = r.ok()?;
    let status = r.status().as_u16();
    let body = r.body_mut().with_config().limit(1 << 30).read_to_vec().ok()?;
    Some((status, body))
}

fn json_of(body: &[u8]) -> Value {
    serde_json::from_slice(body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(body)))
}

/// What the clients were told: the store must agree after any crash.
#[derive(Default)]
struct Model {
    /// Traces answered with 200 and not deleted since: id → sample index (`None`: traced).
    stored: BTreeMap<String, Option<usize>>,
    /// Deletes answered with 200: these must be gone.
    deleted: BTreeSet<String>,
    /// Deletes sent and not answered: either way is right.
    deleting: BTreeSet<String>,
    /// Exports answered with 200: (trace id, download URL, size).
    exports: Vec<(String, String, u64)>,
    /// Answers no client may get (a 5xx, a wrong body), with the request.
    wrong: Vec<String>,
    answered: u64,
}

/// One client: random uploads, exports, deletes and downloads until the server stops
/// answering.
fn client(
    base: String,
    agent: ureq::Agent,
    model: Arc<Mutex<Model>>,
    samples: Arc<Vec<Vec<u8>>>,
    mut rng: Rng,
    trace_models: bool,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::SeqCst) {
        let roll = rng.below(100);
        let pick = |m: &Model, rng: &mut Rng| -> Option<String> {
            let ids: Vec<&String> = m.stored.keys().collect();
            (!ids.is_empty()).then(|| ids[rng.below(ids.len() as u64) as usize].clone())
        };
        let few = model.lock().unwrap().stored.len() < 12;
        if trace_models {
            // One traced insert (a child process, then the store), then uploads.
            let req = json!({"model_name": "mlp", "input_shape": [4, 784], "iterations": 1});
            let Some((status, body)) = call(agent.post(format!("{base}/api/trace/memory")).send_json(&req)) else { return };
            let mut m = model.lock().unwrap();
            m.answered += 1;
            if status == 200 {
                m.stored.insert(json_of(&body)["trace_id"].as_str().unwrap().to_owned(), None);
            } else {
                m.wrong.push(format!("POST /api/trace/memory: {status} {}", String::from_utf8_lossy(&body)));
            }
            return;
        }
        // Deletes only while a few traces stay: the check after the crash needs some.
        let (stored, deleting) = {
            let m = model.lock().unwrap();
            (m.stored.len(), m.deleting.len())
        };
        if (roll < 45 || (70..85).contains(&roll) && stored < 4 + deleting) && few || stored == 0 {
            let i = rng.below(SAMPLES.len() as u64) as usize;
            let url = format!("{base}/api/trace/upload?filename={}", SAMPLES[i]);
            let Some((status, body)) = call(agent.post(&url).header("Content-Type", "application/octet-stream").send(&samples[i][..]))
            else {
                return;
            };
            let mut m = model.lock().unwrap();
            m.answered += 1;
            if status == 200 {
                m.stored.insert(json_of(&body)["trace_id"].as_str().unwrap().to_owned(), Some(i));
            } else if status != 429 {
                m.wrong.push(format!("upload {}: {status} {}", SAMPLES[i], String::from_utf8_lossy(&body)));
            }
        } else if roll < 70 {
            let Some(id) = pick(&model.lock().unwrap(), &mut rng) else { continue };
            let format = ["timeline", "speedscope", "csv"][rng.below(3) as usize];
            let Some((status, body)) =
                call(agent.post(format!("{base}/api/trace/export")).send_json(json!({"trace_id": id, "format": format})))
            else {
                return;
            };
            let mut m = model.lock().unwrap();
            m.answered += 1;
            match status {
                200 => {
                    let e = json_of(&body);
                    m.exports.push((id, e["download_url"].as_str().unwrap().to_owned(), e["file_size_bytes"].as_u64().unwrap()));
                }
                // Deleted by another client meanwhile; or the export queue is full.
                404 | 429 if status == 429 || !m.stored.contains_key(&id) => {}
                _ => m.wrong.push(format!("export {id} {format}: {status} {}", String::from_utf8_lossy(&body))),
            }
        } else if roll < 85 {
            let id = {
                let mut m = model.lock().unwrap();
                let Some(id) = pick(&m, &mut rng) else { continue };
                m.stored.remove(&id);
                m.deleting.insert(id.clone());
                id
            };
            let Some((status, body)) = call(agent.delete(format!("{base}/api/trace/{id}")).call()) else { return };
            let mut m = model.lock().unwrap();
            m.answered += 1;
            m.deleting.remove(&id);
            if status == 200 {
                m.deleted.insert(id);
            } else {
                m.wrong.push(format!("delete {id}: {status} {}", String::from_utf8_lossy(&body)));
            }
        } else {
            let Some(id) = pick(&model.lock().unwrap(), &mut rng) else { continue };
            let Some((status, body)) = call(agent.get(format!("{base}/api/trace/{id}")).call()) else { return };
            let mut m = model.lock().unwrap();
            m.answered += 1;
            let expected = m.stored.get(&id).copied();
            match (status, expected) {
                (200, Some(Some(i))) if body != samples[i] => m.wrong.push(format!("GET {id}: {} bytes, not {}'s", body.len(), SAMPLES[i])),
                (200, _) => {}
                (404, None) => {} // deleted meanwhile
                _ => m.wrong.push(format!("GET {id}: {status} {}", String::from_utf8_lossy(&body))),
            }
        }
    }
}

/// Kills the server with SIGKILL, and the children it had (import and export workers, trace
/// processes), which a crash would orphan: those found by parent, and those that name the data
/// directory in their arguments (a child started as the server died has no parent to be
/// found by, and could write in `tmp/` after the next start).
fn crash(s: Server) {
    // With the separator: no other test's folder starts with it.
    let dir = format!("{}/", s.data_dir.display());
    let mut children = s.children();
    s.kill();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else { continue };
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if pid != std::process::id() && String::from_utf8_lossy(&cmdline).contains(&dir) {
            children.push(pid);
        }
    }
    for pid in children {
        // SAFETY: kill(2) on a process this test's server started.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    }
}

fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    names
}

/// After a restart: what clients were told is there, whole; nothing else is half there.
/// Returns the stored ids.
fn check_store(s: &Server, m: &Model, samples: &[Vec<u8>], context: &str) -> BTreeSet<String> {
    let (code, list) = s.get_json("/api/trace/list");
    assert_eq!(code, 200, "{context}");
    let rows = list["traces"].as_array().unwrap();
    let listed: BTreeSet<String> = rows.iter().map(|r| r["trace_id"].as_str().unwrap().to_owned()).collect();
    for id in m.stored.keys() {
        assert!(listed.contains(id), "{context}: trace {id} was answered with 200 and is lost; the store has {listed:?}");
    }
    for id in &m.deleted {
        assert!(!listed.contains(id), "{context}: trace {id} was deleted (200) and is back");
        assert_eq!(s.get(&format!("/api/trace/{id}")).0, 404, "{context}: GET of deleted {id}");
    }
    let options = shared::ImportOptions::default();
    for row in rows {
        let id = row["trace_id"].as_str().unwrap();
        let r = s.agent.get(s.url(&format!("/api/trace/{id}"))).call().unwrap();
        let (code, body) = call(Ok(r)).unwrap();
        assert_eq!(code, 200, "{context}: GET {id}");
        assert_eq!(row["file_size_bytes"].as_u64(), Some(body.len() as u64), "{context}: {id}'s size");
        // Uploads (answered or not) are their sample byte for byte; every trace imports.
        if let Some(name) = row["original_name"].as_str() {
            let i = SAMPLES.iter().position(|n| *n == name).unwrap_or_else(|| panic!("{context}: {id} named {name}"));
            assert!(body == samples[i], "{context}: {id} is not {name} as uploaded ({} bytes)", body.len());
        }
        let trace = shared::import::import_reader(&body[..], &options).unwrap_or_else(|e| panic!("{context}: {id} does not import: {e}"));
        assert_eq!(
            shared::analysis::summary(&trace).total_events as u64,
            row["total_events"].as_u64().unwrap(),
            "{context}: {id}'s events"
        );
    }
    for (id, url, size) in &m.exports {
        if !listed.contains(id) {
            assert_eq!(s.get(url).0, 404, "{context}: export {url} of a trace that is gone");
            continue;
        }
        let (code, body) = call(s.agent.get(s.url(url)).call()).unwrap();
        assert_eq!((code, body.len() as u64), (200, *size), "{context}: export {url} answered with 200");
    }
    // On disk: no temporary file, nothing quarantined, a sidecar and a trace file per trace,
    // exports of stored traces only.
    let dir = &s.data_dir;
    assert_eq!(files(&dir.join("tmp")), Vec::<String>::new(), "{context}: tmp/ after a start");
    assert_eq!(files(&dir.join("quarantine")), Vec::<String>::new(), "{context}: a crash must leave nothing to quarantine");
    assert_eq!(files(&dir.join("traces")).len(), 2 * listed.len(), "{context}: {:?} for {listed:?}", files(&dir.join("traces")));
    for f in files(&dir.join("exports")) {
        assert!(listed.iter().any(|id| f.starts_with(&format!("{id}."))), "{context}: export {f} of no stored trace");
    }
    listed
}

#[test]
fn crashes_lose_no_answered_trace() {
    let seed = env_u64("STORE_CRASH_SEED", 0x05EE_D0F5_70BE);
    let iterations = env_u64("STORE_CRASH_ITERATIONS", 12);
    let mut rng = Rng(seed);
    let samples = samples();
    let dir = scratch("store-crash");
    let model = Arc::new(Mutex::new(Model::default()));
    let started = Instant::now();
    let mut s = Server::start(&dir, &[]);
    let (mut traced, mut kills_answered) = (0, 0);
    for it in 0..iterations {
        let context = format!("seed {seed:#x}, iteration {it} (STORE_CRASH_SEED={seed} STORE_CRASH_ITERATIONS={})", it + 1);
        // Every tenth iteration a client traces a model: the kill falls somewhere in the
        // child's run or the insert that follows it.
        let trace_models = it % 10 == 9;
        traced += u64::from(trace_models);
        let stop = Arc::new(AtomicBool::new(false));
        let answered_before = model.lock().unwrap().answered;
        let clients: Vec<_> = (0..3)
            .map(|c| {
                let (base, agent, m, smp, r, st) =
                    (s.base.clone(), s.agent.clone(), model.clone(), samples.clone(), Rng(rng.next()), stop.clone());
                std::thread::spawn(move || client(base, agent, m, smp, r, trace_models && c == 0, st))
            })
            .collect();
        // Up to two answers first (an upload or export is a worker process of about half a
        // second), then a random delay: kills land anywhere in the next requests.
        let wanted = answered_before + rng.below(3);
        let deadline = Instant::now() + Duration::from_secs(20);
        while model.lock().unwrap().answered < wanted && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(rng.below(if trace_models { 4000 } else { 900 })));
        crash(s);
        stop.store(true, Ordering::SeqCst);
        for c in clients {
            c.join().unwrap();
        }
        s = Server::start(&dir, &[]);
        let m = model.lock().unwrap();
        assert!(m.wrong.is_empty(), "{context}: wrong answers: {:#?}", m.wrong);
        kills_answered += u64::from(m.answered > answered_before);
        check_store(&s, &m, &samples, &context);
    }
    let m = model.lock().unwrap();
    eprintln!(
        "store crash campaign: seed {seed:#x}, {iterations} kills ({traced} during traced inserts), {} answers checked, {} traces stored, {} deleted, {} exports, 0 lost, in {:.1} s",
        m.answered,
        m.stored.len(),
        m.deleted.len(),
        m.exports.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(kills_answered * 3 >= iterations, "the clients got answers in only {kills_answered} of {iterations} iterations");
}

/// With `--max-traces 3` and uploads only (the count never falls): a crash between an
/// eviction and the insert that caused it would leave fewer traces than the limit while an
/// answered one is gone. Evictions come after the commit, so it never does.
#[test]
fn crashes_during_evictions_lose_only_evicted_traces() {
    let seed = env_u64("STORE_CRASH_SEED", 0xE71C7) ^ 0xE71C7;
    let iterations = env_u64("STORE_CRASH_ITERATIONS", 12) / 2;
    let mut rng = Rng(seed);
    let samples = samples();
    let dir = scratch("store-crash-evict");
    let answered = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut s = Server::start(&dir, &["--max-traces", "3"]);
    for it in 0..iterations {
        let stop = Arc::new(AtomicBool::new(false));
        let clients: Vec<_> = (0..3)
            .map(|_| {
                let (base, agent, answered, smp, mut r, stop) =
                    (s.base.clone(), s.agent.clone(), answered.clone(), samples.clone(), Rng(rng.next()), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        let i = r.below(2) as usize; // the two smallest samples: many inserts
                        let url = format!("{base}/api/trace/upload?filename={}", SAMPLES[i]);
                        let Some((status, body)) = call(agent.post(&url).send(&smp[i][..])) else { return };
                        assert!(status == 200 || status == 429, "upload: {status} {}", String::from_utf8_lossy(&body));
                        if status == 200 {
                            answered.lock().unwrap().push(json_of(&body)["trace_id"].as_str().unwrap().to_owned());
                        }
                    }
                })
            })
            .collect();
        let (before, deadline) = (answered.lock().unwrap().len(), Instant::now() + Duration::from_secs(20));
        while answered.lock().unwrap().len() == before && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(rng.below(900)));
        crash(s);
        stop.store(true, Ordering::SeqCst);
        for c in clients {
            c.join().unwrap();
        }
        s = Server::start(&dir, &["--max-traces", "3"]);
        let listed: Vec<String> =
            s.get_json("/api/trace/list").1["active_traces"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_owned()).collect();
        let answered = answered.lock().unwrap();
        let missing: Vec<&String> = answered.iter().filter(|id| !listed.contains(id)).collect();
        assert!(listed.len() <= 3, "iteration {it}: {listed:?}");
        if !missing.is_empty() {
            assert_eq!(listed.len(), 3, "iteration {it}: answered traces {missing:?} are gone and the store is not full: {listed:?}");
        }
        for id in &listed {
            assert_eq!(s.get(&format!("/api/trace/{id}")).0, 200, "iteration {it}: {id}");
        }
        assert_eq!(files(&dir.join("traces")).len(), 2 * listed.len(), "iteration {it}");
        assert_eq!(files(&dir.join("quarantine")), Vec::<String>::new());
    }
}

/// A second server on the same data directory is refused with a clear error; the lock goes
/// with the process, however it ends.
#[test]
fn a_second_server_is_kept_off_the_data_dir() {
    let dir = scratch("store-lock");
    let s = Server::start(&dir, &[]);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_collector"))
        .args(["serve", "--port", "0", "--device", "cpu", "--data-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    let expected = format!("another `collector serve` (pid {}) is using this data directory", s.pid());
    assert!(stderr.contains(&expected) && stderr.contains(&dir.join("lock").display().to_string()), "{stderr}");
    s.kill();
    let s = Server::start(&dir, &[]);
    assert_eq!(s.get("/api/health").0, 200);
}

/// What no crash of the store leaves (a sidecar that is not JSON, a trace file cut short, a
/// trace file without its sidecar) is moved to `quarantine/` with a log line, not deleted; an
/// upload named like a sidecar cannot overwrite one.
#[test]
fn unreadable_files_are_quarantined_and_uploads_cannot_alias_sidecars() {
    let dir = scratch("store-quarantine");
    let samples = samples();
    let s = Server::start(&dir, &[]);
    let up = |name: &str, i: usize| {
        let (code, r) = s.post_bytes(&format!("/api/trace/upload?filename={name}"), &samples[i]);
        assert_eq!(code, 200, "{r}");
        r["trace_id"].as_str().unwrap().to_owned()
    };
    let alias = up("evil.meta.json", 1);
    let cut = up("cut.pickle", 3);
    let kept = up(SAMPLES[0], 0);
    assert_eq!(s.get(&format!("/api/trace/{alias}")).1.as_bytes(), &samples[1][..], "the upload is its bytes");
    let sidecar: Value = serde_json::from_slice(&std::fs::read(dir.join(format!("traces/{alias}.meta.json"))).unwrap()).unwrap();
    assert_eq!(sidecar["file"], format!("{alias}.upload"), "a sidecar's name is never a trace file's");
    s.kill();
    std::fs::write(dir.join("traces/trace_5.meta.json"), b"{not json").unwrap();
    std::fs::write(dir.join("traces/trace_7.pickle"), &samples[3]).unwrap();
    let cut_file = dir.join(format!("traces/{cut}.pickle"));
    let bytes = std::fs::read(&cut_file).unwrap();
    std::fs::write(&cut_file, &bytes[..bytes.len() / 2]).unwrap();
    std::fs::write(dir.join("tmp/1-trace_9.upload"), b"an aborted upload").unwrap();

    let s = Server::start(&dir, &[]);
    let listed = s.get_json("/api/trace/list").1["active_traces"].clone();
    assert_eq!(listed, json!([alias, kept]));
    let q = files(&dir.join("quarantine"));
    let expected = [format!("{cut}.meta.json"), format!("{cut}.pickle"), "trace_5.meta.json".into(), "trace_7.pickle".into()];
    assert_eq!(q, expected);
    assert_eq!(std::fs::read(dir.join("quarantine/trace_7.pickle")).unwrap(), samples[3], "quarantined, not changed");
    assert_eq!(files(&dir.join("tmp")), Vec::<String>::new());
    let log = s.log.lock().unwrap().join("\n");
    for name in &expected {
        assert!(log.lines().any(|l| l.contains("quarantined") && l.contains(name.as_str())), "no log line for {name}:\n{log}");
    }
    assert_eq!(s.get(&format!("/api/trace/{alias}")).1.as_bytes(), &samples[1][..]);
}

/// A client that goes away mid-upload leaves no temporary file behind.
#[test]
fn aborted_uploads_leave_no_temporary_file() {
    let dir = scratch("store-aborted");
    let s = Server::start(&dir, &[]);
    let addr = s.base.trim_start_matches("http://");
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    let head = format!("POST /api/trace/upload?filename=big.pickle HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/octet-stream\r\nContent-Length: 10000000\r\n\r\n");
    c.write_all(head.as_bytes()).unwrap();
    c.write_all(&vec![0x80; 1 << 20]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while files(&dir.join("tmp")).is_empty() {
        assert!(Instant::now() < deadline, "the upload never reached tmp/");
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(c);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !files(&dir.join("tmp")).is_empty() {
        assert!(Instant::now() < deadline, "left in tmp/: {:?}", files(&dir.join("tmp")));
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Deletes against exports and downloads: every answer is 200 or 404, never a 500 or a
/// truncated body; a download that started before the delete is whole; after the delete
/// nothing of the trace is left.
#[test]
fn deletes_race_exports_and_downloads() {
    let dir = scratch("store-race-export");
    let s = Arc::new(Server::start(&dir, &[]));
    let big = std::fs::read(data("mlp_adam_3steps.pickle")).unwrap();
    let mut rng = Rng(7);
    let (mut exported_first, mut deleted_first) = (0, 0);
    for round in 0..8 {
        let (code, r) = s.post_bytes("/api/trace/upload?filename=r.pickle", &big);
        assert_eq!(code, 200, "{r}");
        let id = r["trace_id"].as_str().unwrap().to_owned();
        // One export made before, downloaded while the trace is deleted.
        let t = Instant::now();
        let (code, e) = s.post_json("/api/trace/export", &json!({"trace_id": id, "format": "csv"}));
        assert_eq!(code, 200, "{e}");
        let export_ms = t.elapsed().as_millis() as u64;
        let (csv_url, csv_size) = (e["download_url"].as_str().unwrap().to_owned(), e["file_size_bytes"].as_u64().unwrap());
        let readers: Vec<_> = [csv_url.clone(), format!("/api/trace/{id}"), csv_url.clone(), format!("/api/trace/{id}")]
            .into_iter()
            .map(|url| {
                let s = s.clone();
                std::thread::spawn(move || call(s.agent.get(s.url(&url)).call()).map(|(c, b)| (url, c, b)).unwrap())
            })
            .collect();
        let export = {
            let s = s.clone();
            let id = id.clone();
            std::thread::spawn(move || s.post_json("/api/trace/export", &json!({"trace_id": id, "format": "timeline"})))
        };
        // Within twice what an export takes here: deletes land before, during and after it.
        std::thread::sleep(Duration::from_millis(rng.below(2 * export_ms)));
        let (code, d) = s.delete(&format!("/api/trace/{id}"));
        assert_eq!(code, 200, "round {round}: {d}");
        let (code, e) = export.join().unwrap();
        match code {
            200 => {
                exported_first += 1;
                assert_eq!(s.get(e["download_url"].as_str().unwrap()).0, 404, "round {round}: the export of a deleted trace");
            }
            404 => deleted_first += 1,
            _ => panic!("round {round}: export racing a delete: {code} {e}"),
        }
        for r in readers {
            let (url, code, body) = r.join().unwrap();
            match code {
                200 if url == csv_url => assert_eq!(body.len() as u64, csv_size, "round {round}: {url} cut short"),
                200 => assert!(body == big, "round {round}: {url} is not the upload ({} bytes)", body.len()),
                404 => {}
                _ => panic!("round {round}: {url} racing a delete: {code} {}", String::from_utf8_lossy(&body)),
            }
        }
        assert_eq!(s.get(&csv_url).0, 404);
        assert_eq!(s.get(&format!("/api/trace/{id}")).0, 404);
        let left: Vec<String> =
            ["traces", "exports"].iter().flat_map(|d| files(&dir.join(d))).filter(|f| f.starts_with(&format!("{id}."))).collect();
        assert!(left.is_empty(), "round {round}: {left:?}");
    }
    eprintln!("export against delete: {exported_first} exports answered first, {deleted_first} deletes first");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !files(&dir.join("tmp")).is_empty() {
        assert!(Instant::now() < deadline, "left in tmp/: {:?}", files(&dir.join("tmp")));
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Deletes against evictions (`--max-traces 2`, uploads from three clients): a trace is
/// deleted or evicted once, answers are 200 or 404, and the index and the files agree, also
/// after a restart.
#[test]
fn deletes_race_evictions() {
    let dir = scratch("store-race-evict");
    let s = Arc::new(Server::start(&dir, &["--max-traces", "2"]));
    let samples = samples();
    let ids = Arc::new(Mutex::new(Vec::<String>::new()));
    let uploaders: Vec<_> = (0..3)
        .map(|c| {
            let (s, ids, samples) = (s.clone(), ids.clone(), samples.clone());
            std::thread::spawn(move || {
                for _ in 0..15 {
                    let (code, r) = s.post_bytes(&format!("/api/trace/upload?filename={}", SAMPLES[c % 2]), &samples[c % 2]);
                    assert!(code == 200 || code == 429, "{code} {r}");
                    if code == 200 {
                        ids.lock().unwrap().push(r["trace_id"].as_str().unwrap().to_owned());
                    }
                }
            })
        })
        .collect();
    let (mut deleted, mut gone) = (0, 0);
    while uploaders.iter().any(|u| !u.is_finished()) {
        // The oldest answered upload once the store is full: the next eviction's pick.
        let oldest = {
            let mut ids = ids.lock().unwrap();
            (ids.len() >= 3).then(|| ids.remove(0))
        };
        let Some(id) = oldest else {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        };
        let (code, d) = s.delete(&format!("/api/trace/{id}"));
        match code {
            200 => deleted += 1,
            404 => gone += 1, // evicted first
            _ => panic!("delete racing an eviction: {code} {d}"),
        }
    }
    for u in uploaders {
        u.join().unwrap();
    }
    let check = |s: &Server| {
        let listed = s.get_json("/api/trace/list").1["active_traces"].as_array().unwrap().clone();
        assert!(listed.len() <= 2, "{listed:?}");
        assert_eq!(files(&dir.join("traces")).len(), 2 * listed.len(), "{:?} for {listed:?}", files(&dir.join("traces")));
        let (traces, bytes) = {
            let h = s.get_json("/api/health").1;
            (h["stored_traces"].as_u64().unwrap(), h["store_bytes"].as_u64().unwrap())
        };
        let on_disk: u64 = files(&dir.join("traces"))
            .iter()
            .filter(|f| !f.ends_with(".meta.json"))
            .map(|f| std::fs::metadata(dir.join("traces").join(f)).unwrap().len())
            .sum();
        assert_eq!((traces, bytes), (listed.len() as u64, on_disk), "the index counts what is on disk");
        listed
    };
    let before = check(&s);
    eprintln!("delete against eviction: {deleted} deleted, {gone} already evicted");
    Arc::into_inner(s).unwrap().kill();
    let s = Server::start(&dir, &["--max-traces", "2"]);
    assert_eq!(check(&s), before, "the same traces after a restart");
}

/// `GET /api/trace/{id}/events`: the events as (name, data) until `done` or `failed`.
fn follow(s: &Server, id: &str) -> (u16, Vec<(String, Value)>) {
    s.events(id)
}

fn job_listed(s: &Server, id: &str) -> bool {
    s.get_json("/api/jobs").1["jobs"].as_array().unwrap().iter().any(|j| j["trace_id"] == id)
}

/// Deletes against a following client: a follower connected before the delete gets the whole
/// run up to `done`; after the delete the job is forgotten (no row, events 404). A delete
/// while the job runs finds nothing stored (404) and takes nothing from its follower. The
/// job of an evicted trace is forgotten too.
#[test]
fn deletes_and_evictions_race_followers() {
    let dir = scratch("store-race-follow");
    let s = Arc::new(Server::start(&dir, &["--max-traces", "1"]));
    let mlp = json!({"model_name": "mlp", "input_shape": [4, 784], "iterations": 2});
    let start = |s: &Server| {
        let (code, a) = s.post_json("/api/trace/memory?wait=false", &mlp);
        assert_eq!(code, 202, "{a}");
        a["trace_id"].as_str().unwrap().to_owned()
    };
    // A delete while the job runs: nothing stored yet.
    let a = start(&s);
    let follower = {
        let (s, a) = (s.clone(), a.clone());
        std::thread::spawn(move || follow(&s, &a))
    };
    assert_eq!(s.delete(&format!("/api/trace/{a}")).0, 404, "a running job's trace is not stored yet");
    let (code, events) = follower.join().unwrap();
    assert_eq!(code, 200);
    assert_eq!(events.last().map(|(n, _)| n.as_str()), Some("done"), "{events:?}");
    assert_eq!(s.get(&format!("/api/trace/{a}")).0, 200);
    // A delete at the moment a follower ends: the follower had it all; then it is forgotten.
    let b = start(&s);
    let (code, events) = follow(&s, &b);
    assert_eq!((code, events.last().map(|(n, _)| n.clone())), (200, Some("done".into())));
    assert!(!job_listed(&s, &a) && s.get(&format!("/api/trace/{a}")).0 == 404, "{a} was evicted by {b}: its job is forgotten");
    assert_eq!(follow(&s, &a).0, 404, "events of an evicted trace");
    let late = {
        let (s, b) = (s.clone(), b.clone());
        std::thread::spawn(move || follow(&s, &b))
    };
    assert_eq!(s.delete(&format!("/api/trace/{b}")).0, 200);
    let (code, events) = late.join().unwrap();
    assert!(code == 404 || events.last().is_some_and(|(n, _)| n == "done"), "a follower racing the delete: {code} {events:?}");
    assert!(!job_listed(&s, &b), "a deleted trace's job is forgotten");
    assert_eq!(follow(&s, &b).0, 404);
}
