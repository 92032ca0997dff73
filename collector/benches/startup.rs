//! What every command pays before doing anything: wall time and peak RSS of `collector
//! --version`, `summary` and `convert` of a small real snapshot, `report`, and an idle
//! `collector serve`, against `collector-capture --version` (the one binary that loads
//! libtorch). `cargo bench -p collector --bench startup` (build collector-capture first, e.g.
//! `cargo build --release -p capture`, for its row).

#![allow(clippy::unwrap_used, clippy::expect_used)] // benches fail loudly by design

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `cmd` once; (wall time, peak RSS in bytes) from wait4's rusage. wait4 reaps the
/// child (std's `wait` cannot return its rusage).
#[allow(clippy::zombie_processes)]
fn measure(cmd: &mut Command) -> (Duration, u64) {
    let start = Instant::now();
    let child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let mut status = 0;
    // SAFETY: rusage is plain data (all zeros is a valid value).
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: the kernel fills `status` and `usage`, both ours; the pid is our child's.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32);
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "{cmd:?} failed");
    (start.elapsed(), usage.ru_maxrss as u64 * 1024)
}

fn row(name: &str, runs: usize, mut make: impl FnMut() -> Command) {
    let mut times: Vec<Duration> = Vec::new();
    let mut rss = 0;
    for _ in 0..runs {
        let (t, r) = measure(&mut make());
        times.push(t);
        rss = rss.max(r);
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{name:<36} median {:>8.1} ms   min {:>8.1} ms   peak RSS {:>7.1} MiB   ({runs} runs)",
        ms(times[runs / 2]),
        ms(times[0]),
        rss as f64 / 1048576.0
    );
}

/// Peak RSS of `collector serve` once it listens and has answered one health request.
fn serve_rss(exe: &Path) -> u64 {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("startup");
    let mut child = Command::new(exe)
        .args(["serve", "--port", "0", "--data-dir"])
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stderr.take().unwrap()));
    let url = lines.find_map(|l| l.ok()?.split_whitespace().find(|w| w.starts_with("http://")).map(str::to_owned)).unwrap();
    let health = ureq::get(&format!("{url}api/health")).call().unwrap().into_body().read_to_string().unwrap();
    assert!(health.contains("healthy"), "{health}");
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    let kib: u64 = status.lines().find_map(|l| l.strip_prefix("VmHWM:")).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(dir);
    kib * 1024
}

fn main() {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_collector"));
    let sample = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/mlp_adam_3steps.pickle");
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("startup.csv");
    let report = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("startup-report");
    println!("collector: {}", exe.display());
    row("collector --version", 50, || {
        let mut c = Command::new(&exe);
        c.arg("--version");
        c
    });
    row("collector summary (110 KB snapshot)", 50, || {
        let mut c = Command::new(&exe);
        c.arg("summary").arg(&sample);
        c
    });
    row("collector convert (to CSV)", 50, || {
        let mut c = Command::new(&exe);
        c.arg("convert").arg(&sample).arg("-o").arg(&out);
        c
    });
    row("collector report (folder)", 20, || {
        let mut c = Command::new(&exe);
        c.arg("report").arg(&sample).arg("-o").arg(&report);
        c
    });
    println!("{:<36} peak RSS {:>7.1} MiB (listening, one request answered)", "collector serve", serve_rss(&exe) as f64 / 1048576.0);
    let capture = exe.with_file_name("collector-capture");
    let capture = if capture.is_file() { capture } else { exe.parent().unwrap().join("../release/collector-capture") };
    if capture.is_file() {
        row("collector-capture --version", 5, || {
            let mut c = Command::new(&capture);
            c.arg("--version");
            c
        });
    } else {
        println!("collector-capture: not built beside {} (cargo build --release -p capture)", exe.display());
    }
    let _ = std::fs::remove_file(out);
    let _ = std::fs::remove_dir_all(report);
}
