//! Starts `collector serve` on a free loopback port for tests and benchmarks; stops it when
//! dropped.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct Server {
    child: Child,
    pub base: String,
    pub agent: ureq::Agent,
    pub token: Option<String>,
    pub data_dir: PathBuf,
    /// Every line the server wrote to stderr so far.
    pub log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Server {
    /// `collector serve --port 0 --data-dir DIR --device cpu ARGS...`; waits until it listens.
    pub fn start(data_dir: &Path, args: &[&str]) -> Server {
        Self::start_with(env!("CARGO_BIN_EXE_collector"), data_dir, args)
    }

    pub fn start_with(exe: &str, data_dir: &Path, args: &[&str]) -> Server {
        Self::start_env(exe, data_dir, args, &[])
    }

    /// As [`Server::start_with`], with these environment variables set (and
    /// `MEMORY_TRACER_TOKEN` removed unless given). The token is `--token`'s, else the
    /// environment's, else `--token-file`'s.
    pub fn start_env(exe: &str, data_dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut cmd = Command::new(exe);
        cmd.env_remove("MEMORY_TRACER_TOKEN");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .args(["serve", "--port", "0", "--device", "cpu", "--data-dir"])
            .arg(data_dir)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot start collector serve");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = log.clone();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                kept.lock().unwrap().push(line.clone());
                if !sent {
                    if let Some(addr) = line.strip_prefix("Memory Tracer is serving ").and_then(|l| l.rsplit(" on ").next()) {
                        let _ = tx.send(Ok(addr.to_owned()));
                        sent = true;
                        continue;
                    }
                    if line.starts_with("error:") {
                        let _ = tx.send(Err(line.clone()));
                    }
                }
                if std::env::var_os("MEMORY_TRACER_SERVE_LOG").is_some() {
                    eprintln!("[serve] {line}");
                }
            }
        });
        let addr = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(Ok(a)) => a,
            Ok(Err(e)) => panic!("collector serve failed to start: {e}"),
            Err(_) => {
                let _ = child.kill();
                panic!("collector serve did not start within 60 s");
            }
        };
        let arg = |name: &str| args.iter().position(|a| *a == name).map(|i| args[i + 1].to_owned());
        let token = arg("--token")
            .or_else(|| env.iter().find(|(k, _)| *k == "MEMORY_TRACER_TOKEN").map(|(_, v)| (*v).to_owned()))
            .or_else(|| arg("--token-file").map(|f| std::fs::read_to_string(f).unwrap().trim().to_owned()));
        Server { child, base: format!("http://{addr}"), agent: agent(), token, data_dir: data_dir.to_owned(), log }
    }

    /// `GET /api/trace/{id}/events`: its status, and the events as (name, data) until `done`
    /// or `failed` (none when the status is not 200).
    pub fn events(&self, id: &str) -> (u16, Vec<(String, Value)>) {
        let r = self.agent.get(self.url(&format!("/api/trace/{id}/events"))).call().unwrap();
        let code = r.status().as_u16();
        let mut events = Vec::new();
        if code != 200 {
            return (code, events);
        }
        let mut name = String::new();
        for line in BufReader::new(r.into_body().into_reader()).lines() {
            let line = line.unwrap();
            if let Some(n) = line.strip_prefix("event: ") {
                name = n.to_owned();
            } else if let Some(d) = line.strip_prefix("data: ") {
                events.push((name.clone(), serde_json::from_str(d).unwrap()));
                if name == "done" || name == "failed" {
                    break;
                }
            }
        }
        (code, events)
    }

    /// The server's address, `127.0.0.1:PORT`.
    pub fn addr(&self) -> &str {
        self.base.trim_start_matches("http://")
    }

    /// Sends `request` as it is over a new connection; the status and body of the answer
    /// (status 0 when the server closed the connection without one).
    pub fn raw(&self, request: &[u8]) -> (u16, String) {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(self.addr()).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        c.write_all(request).unwrap();
        let mut answer = Vec::new();
        let _ = c.read_to_end(&mut answer);
        let text = String::from_utf8_lossy(&answer).into_owned();
        let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_owned();
        (status, body)
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn auth<B>(&self, r: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.token {
            Some(t) => r.header("Authorization", format!("Bearer {t}")),
            None => r,
        }
    }

    /// GET → (status, body text).
    pub fn get(&self, path: &str) -> (u16, String) {
        let r = self.auth(self.agent.get(self.url(path))).call().expect("GET failed");
        text(r)
    }

    pub fn get_json(&self, path: &str) -> (u16, Value) {
        let (s, t) = self.get(path);
        (s, serde_json::from_str(&t).unwrap_or_else(|e| panic!("GET {path}: not JSON ({e}): {t}")))
    }

    pub fn post_json(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = self.auth(self.agent.post(self.url(path))).send_json(body).expect("POST failed");
        let (s, t) = text(r);
        (s, serde_json::from_str(&t).unwrap_or_else(|e| panic!("POST {path}: not JSON ({e}): {t}")))
    }

    pub fn post_bytes(&self, path: &str, bytes: &[u8]) -> (u16, Value) {
        let r =
            self.auth(self.agent.post(self.url(path))).header("Content-Type", "application/octet-stream").send(bytes).expect("POST failed");
        let (s, t) = text(r);
        (s, serde_json::from_str(&t).unwrap_or_else(|e| panic!("POST {path}: not JSON ({e}): {t}")))
    }

    pub fn delete(&self, path: &str) -> (u16, Value) {
        let r = self.auth(self.agent.delete(self.url(path))).call().expect("DELETE failed");
        let (s, t) = text(r);
        (s, serde_json::from_str(&t).unwrap_or_else(|e| panic!("DELETE {path}: not JSON ({e}): {t}")))
    }

    /// The server's resident memory now and at its highest (VmRSS, VmHWM), KiB.
    pub fn memory_kib(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        let field = |name: &str| {
            status.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap_or(0)
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM (what systemd, Docker and Kubernetes send) and waits for the exit.
    pub fn terminate(mut self, timeout: Duration) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(std::time::Instant::now() < deadline, "the server did not stop within {timeout:?} of SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Process ids of the server's children (its trace processes).
    pub fn children(&self) -> Vec<u32> {
        collector::serve::child_pids(self.child.id())
    }

    /// Stops the server (SIGKILL: nothing gets to flush, as in a crash).
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client that opens a connection per request: a pooled keep-alive connection the server
/// has let go of fails the next request with "Peer disconnected" (seen once in a CI run of
/// `multinode`, right after a 404), which is not what these tests test.
pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(300)))
        .max_idle_connections(0)
        .build()
        .into()
}

pub fn text(mut r: ureq::http::Response<ureq::Body>) -> (u16, String) {
    let status = r.status().as_u16();
    let body = r.body_mut().with_config().limit(1 << 30).read_to_string().unwrap_or_else(|e| format!("<unreadable body: {e}>"));
    (status, body)
}

/// A fresh empty folder under the target directory.
pub fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("cannot create a scratch folder");
    dir
}
