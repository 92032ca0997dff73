//! A small W3C WebDriver client (blocking, over ureq) for Debian's chromedriver, and a static
//! file server (`python3 -m http.server`), both stopped when dropped.

#![allow(dead_code)]

pub mod viewer;

use serde_json::{json, Value};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("no free port")
}

fn wait_for_port(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "{what} did not listen on port {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A child process killed on drop.
pub struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Serves `dir` on 127.0.0.1 with Python's static server (a plain static host).
pub fn static_server(dir: &Path) -> (Guard, String) {
    serve_static(dir, &["-m", "http.server"])
}

/// The same, with the headers `collector serve` sends its viewer's files with (a cross-origin
/// isolated page: the page reads a chosen file into shared memory for its worker).
pub fn isolated_static_server(dir: &Path) -> (Guard, String) {
    const SERVER: &str = "import functools, http.server, sys
class Isolated(http.server.SimpleHTTPRequestHandler):
    def end_headers(self):
        self.send_header('Cross-Origin-Opener-Policy', 'same-origin')
        self.send_header('Cross-Origin-Embedder-Policy', 'require-corp')
        super().end_headers()
handler = functools.partial(Isolated, directory=sys.argv[5])
http.server.ThreadingHTTPServer(('127.0.0.1', int(sys.argv[1])), handler).serve_forever()";
    serve_static(dir, &["-c", SERVER])
}

/// `python3 ARGS PORT --bind 127.0.0.1 --directory DIR`, once it listens.
fn serve_static(dir: &Path, args: &[&str]) -> (Guard, String) {
    let port = free_port();
    let python = std::env::var("MEMORY_TRACER_PYTHON").unwrap_or_else(|_| "python3".into());
    let child = Command::new(python)
        .args(args)
        .args([&port.to_string(), "--bind", "127.0.0.1", "--directory"])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("cannot start python3's static server");
    let guard = Guard(child);
    wait_for_port(port, "the static server");
    (guard, format!("http://127.0.0.1:{port}"))
}

pub struct Browser {
    agent: ureq::Agent,
    base: String,
    session: String,
    // Dropped in this order: the driver stopped, then its temporary folder removed.
    _driver: Guard,
    _temp: TempFolder,
}

/// The folder chromedriver and Chromium make their temporary profiles in (`TMPDIR`), under the
/// target directory and removed on drop: each browser left ~30 MB in `/tmp` otherwise.
struct TempFolder(PathBuf);

impl TempFolder {
    fn new() -> TempFolder {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir =
            Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chromium-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        TempFolder(dir)
    }
}

impl Drop for TempFolder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Browser {
    /// The process id of this session's chromedriver: the browser and its renderers descend
    /// from it.
    pub fn driver_pid(&self) -> u32 {
        self._driver.0.id()
    }

    /// Starts chromedriver and a headless Chromium session.
    pub fn start(width: u32, height: u32) -> Browser {
        Self::start_with(width, height, &[])
    }

    /// The same with more Chromium flags (`--enable-unsafe-swiftshader`: WebGL2 drawn on the CPU,
    /// which headless Chromium with `--disable-gpu` otherwise lacks).
    pub fn start_with(width: u32, height: u32, flags: &[&str]) -> Browser {
        let driver = std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".into());
        let port = free_port();
        let temp = TempFolder::new();
        let child = Command::new(&driver)
            .arg(format!("--port={port}"))
            .env("TMPDIR", &temp.0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {driver}: {e} (apt-get install chromium chromium-driver)"));
        let guard = Guard(child);
        wait_for_port(port, "chromedriver");
        let agent: ureq::Agent =
            ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(120))).build().into();
        let base = format!("http://127.0.0.1:{port}");
        let mut args: Vec<String> =
            ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-dev-shm-usage"]
                .into_iter()
                .map(str::to_owned)
                .collect();
        args.push(format!("--window-size={width},{height}"));
        args.extend(flags.iter().map(|f| f.to_string()));
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into()),
                "args": args
            }
        }}});
        // Chromium sometimes exits while starting on a loaded 2-core machine (two test threads,
        // each with its own browser); a new session is asked for twice more before giving up.
        let mut failures = Vec::new();
        for attempt in 0..3 {
            let v = post(&agent, &format!("{base}/session"), &caps);
            if let Some(session) = v["value"]["sessionId"].as_str() {
                if !failures.is_empty() {
                    eprintln!("webdriver: a session after {attempt} failed start(s): {failures:?}");
                }
                return Browser { agent, base, session: session.to_owned(), _driver: guard, _temp: temp };
            }
            failures.push(v["value"]["message"].as_str().map_or_else(|| v.to_string(), str::to_owned));
            std::thread::sleep(Duration::from_secs(2));
        }
        panic!("no session after 3 tries: {failures:?}")
    }

    fn url(&self, path: &str) -> String {
        format!("{}/session/{}{}", self.base, self.session, path)
    }

    pub fn goto(&self, url: &str) {
        post(&self.agent, &self.url("/url"), &json!({"url": url}));
    }

    /// Runs `script` (a function body; `arguments` are `args`) and returns its value.
    pub fn exec(&self, script: &str, args: Value) -> Value {
        self.try_exec(script, args).unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    /// Runs `script` asynchronously: it ends by calling its last argument with its value.
    pub fn exec_async(&self, script: &str) -> Value {
        let v = post(&self.agent, &self.url("/execute/async"), &json!({"script": script, "args": []}));
        assert!(v["value"].get("error").is_none(), "script failed: {v}\n{script}");
        v["value"].clone()
    }

    /// As `exec`, but a failing script or a crashed tab is an `Err` with WebDriver's message
    /// (benchmarks of pages that may run out of memory).
    pub fn try_exec(&self, script: &str, args: Value) -> Result<Value, String> {
        let v = try_post(&self.agent, &self.url("/execute/sync"), &json!({"script": script, "args": args}))?;
        match v["value"].get("error") {
            Some(e) => Err(format!("{}: {}", e.as_str().unwrap_or("error"), v["value"]["message"].as_str().unwrap_or_default())),
            None => Ok(v["value"].clone()),
        }
    }

    pub fn find(&self, css: &str) -> Option<String> {
        let v = post(&self.agent, &self.url("/element"), &json!({"using": "css selector", "value": css}));
        v["value"].as_object()?.values().next()?.as_str().map(str::to_owned)
    }

    /// Types a file path into an `<input type=file>`: the browser "uploads" it.
    pub fn upload(&self, css: &str, file: &Path) {
        self.upload_many(css, &[file]);
    }

    /// Chooses several files at once in an `<input type=file multiple>` (chromedriver takes
    /// their paths one per line).
    pub fn upload_many(&self, css: &str, files: &[&Path]) {
        let el = self.find(css).unwrap_or_else(|| panic!("no element {css}"));
        let paths: Vec<String> = files.iter().map(|f| f.canonicalize().expect("file to upload").display().to_string()).collect();
        let v = post(&self.agent, &self.url(&format!("/element/{el}/value")), &json!({"text": paths.join("\n")}));
        assert!(v["value"].is_null(), "upload failed: {v}");
    }

    pub fn click(&self, css: &str) {
        let el = self.find(css).unwrap_or_else(|| panic!("no element {css}"));
        post(&self.agent, &self.url(&format!("/element/{el}/click")), &json!({}));
    }

    /// Presses and releases each key of `keys` in turn on whatever has the focus, as a
    /// keyboard would (`?` comes with Shift; `\u{E00C}` is Escape).
    pub fn press(&self, keys: &str) {
        let actions: Vec<Value> = keys
            .chars()
            .flat_map(|k| [json!({"type": "keyDown", "value": k.to_string()}), json!({"type": "keyUp", "value": k.to_string()})])
            .collect();
        let v = post(&self.agent, &self.url("/actions"), &json!({"actions": [{"type": "key", "id": "keyboard", "actions": actions}]}));
        assert!(v["value"].is_null(), "key presses failed: {v}");
    }

    /// Waits until `script` returns something truthy; panics with `what` after `secs`.
    pub fn wait_for(&self, script: &str, secs: u64, what: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let v = self.exec(script, json!([]));
            if !(v.is_null() || v == json!(false) || v == json!("") || v == json!(0)) {
                return v;
            }
            if Instant::now() > deadline {
                let page = self.exec("return document.body.innerText.slice(0, 2000)", json!([]));
                panic!("timed out waiting for {what}; page says:\n{}", page.as_str().unwrap_or_default());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// PNG of the whole window.
    pub fn screenshot(&self, out: &Path) {
        let v = self.agent.get(self.url("/screenshot")).call().expect("screenshot").into_body().read_json::<Value>().expect("json");
        let b64 = v["value"].as_str().expect("screenshot data");
        std::fs::write(out, decode_base64(b64)).expect("write screenshot");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.agent.delete(format!("{}/session/{}", self.base, self.session)).call();
    }
}

fn try_post(agent: &ureq::Agent, url: &str, body: &Value) -> Result<Value, String> {
    let mut resp = agent.post(url).send_json(body).map_err(|e| format!("POST {url}: {e}"))?;
    resp.body_mut().with_config().limit(256 << 20).read_json::<Value>().map_err(|e| format!("POST {url}: bad JSON: {e}"))
}

fn post(agent: &ureq::Agent, url: &str, body: &Value) -> Value {
    let mut resp = agent.post(url).send_json(body).unwrap_or_else(|e| panic!("POST {url}: {e}"));
    resp.body_mut().with_config().limit(256 << 20).read_json::<Value>().unwrap_or_else(|e| panic!("POST {url}: bad JSON: {e}"))
}

fn decode_base64(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let clean: Vec<u8> = s.bytes().filter(|c| !c.is_ascii_whitespace() && *c != b'=').collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &c)| n | (val(c) as u32) << (18 - 6 * i));
        out.push((n >> 16) as u8);
        if chunk.len() > 2 {
            out.push((n >> 8) as u8);
        }
        if chunk.len() > 3 {
            out.push(n as u8);
        }
    }
    out
}
