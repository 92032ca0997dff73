//! Jobs of `cargo xtask test` that run side by side, each writing to its own log
//! (`target/xtask-logs/NAME.log`): a job's commands, run through [`cmd::run`], write there
//! instead of the console, which says when each job starts and ends, and shows the end of the
//! log of one that failed. `MEMORY_TRACER_TEST_JOBS=1` runs them one after another on the
//! console instead.

use crate::cmd;
use anyhow::{bail, Result};
use std::fs::File;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// Where the jobs' logs go.
const LOG_DIR: &str = "target/xtask-logs";
/// How much of a failed job's log the console shows (the whole log stays on disk).
const TAIL_LINES: usize = 300;

pub(crate) struct Job {
    name: String,
    work: Box<dyn FnOnce() -> Result<()> + Send>,
}

pub(crate) fn job(name: impl Into<String>, work: impl FnOnce() -> Result<()> + Send + 'static) -> Job {
    Job { name: name.into(), work: Box::new(work) }
}

/// Runs `jobs` side by side and waits for all of them; fails naming every job that failed.
pub(crate) fn side_by_side(jobs: Vec<Job>) -> Result<()> {
    if std::env::var("MEMORY_TRACER_TEST_JOBS").is_ok_and(|v| v == "1") {
        for j in jobs {
            eprintln!("xtask: {}", j.name);
            (j.work)()?;
        }
        return Ok(());
    }
    side_by_side_in(Path::new(LOG_DIR), jobs)
}

fn side_by_side_in(dir: &Path, jobs: Vec<Job>) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let (done, finished) = std::sync::mpsc::channel();
    let count = jobs.len();
    for j in jobs {
        let path = dir.join(format!("{}.log", file_name(&j.name)));
        eprintln!("xtask: {} started (log: {})", j.name, path.display());
        let done = done.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            let result = File::create(&path).map_err(anyhow::Error::from).and_then(|f| {
                cmd::log_to(f);
                (j.work)()
            });
            let _ = done.send((j.name, path, result, started.elapsed().as_secs_f64()));
        });
    }
    drop(done);
    let mut failed = Vec::new();
    let mut heard = 0;
    for (name, path, result, seconds) in finished.iter().take(count) {
        heard += 1;
        match result {
            Ok(()) => eprintln!("xtask: {name} passed in {seconds:.0} s (log: {})", path.display()),
            Err(e) => {
                show_tail(&path);
                eprintln!("xtask: {name} FAILED after {seconds:.0} s: {e:#} (the whole log: {})", path.display());
                failed.push(name);
            }
        }
    }
    if heard < count {
        // A job's thread panicked before it could say how it ended.
        failed.push(format!("{} job(s) that panicked", count - heard));
    }
    if !failed.is_empty() {
        bail!("failed: {} (their logs are in {}/)", failed.join(", "), dir.display());
    }
    Ok(())
}

/// The last lines of a failed job's log, on the console.
fn show_tail(path: &Path) {
    let Ok(text) = std::fs::read_to_string(path) else { return };
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(TAIL_LINES);
    eprintln!("xtask: ---- the end of {} ----", path.display());
    for l in &lines[from..] {
        eprintln!("{l}");
    }
    eprintln!("xtask: ----");
}

/// A job's name as a file name: letters and digits kept, the rest `-`.
fn file_name(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' { c.to_ascii_lowercase() } else { '-' }).collect()
}

/// Says how much of the disk under `dir` is free (`df`): a fresh clone's tests write ~6 GB into
/// `target/`, and a first run installs ~25 GB of tools and torch versions into the caches; a run
/// that fills the disk otherwise ends in a compiler's "No space left on device".
pub fn say_free_disk(dir: &Path) {
    if let Some(bytes) = free_disk_bytes(dir) {
        let gb = bytes as f64 / 1e9;
        let low = if gb < 8.0 { " (low: the tests need ~6 GB in target/, more on a first run)" } else { "" };
        eprintln!("xtask: {gb:.1} GB free on the disk of {}{low}", dir.display());
    }
}

/// The bytes free to this user on the disk under `dir`, as `df -P` says.
fn free_disk_bytes(dir: &Path) -> Option<u64> {
    let out = Command::new("df").arg("-Pk").arg(dir).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let kib: u64 = text.lines().nth(1)?.split_whitespace().nth(3)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_disk_is_read_from_df() {
        let free = free_disk_bytes(Path::new(".")).expect("df answers for the checkout");
        assert!(free > 0);
        assert_eq!(free_disk_bytes(Path::new("/no/such/folder")), None);
    }

    /// Each job's commands write to its own log, every job runs to its end, and the error
    /// names the ones that failed.
    #[test]
    fn jobs_log_apart_and_failures_are_named() {
        let dir = std::env::temp_dir().join(format!("xtask-jobs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let err = side_by_side_in(
            &dir,
            vec![
                job("says hello", || cmd::run(Command::new("sh").args(["-c", "echo hello; echo to-stderr >&2"]))),
                job("fails", || cmd::run(Command::new("sh").args(["-c", "echo before-failing; exit 3"]))),
                job("panics", || panic!("on purpose")),
            ],
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("failed: ") && err.contains("fails") && err.contains("1 job(s) that panicked"), "{err}");
        assert!(!err.contains("says hello"), "{err}");
        let hello = std::fs::read_to_string(dir.join("says-hello.log")).unwrap();
        assert!(hello.contains("xtask: running") && hello.contains("hello\n") && hello.contains("to-stderr"), "{hello}");
        let fails = std::fs::read_to_string(dir.join("fails.log")).unwrap();
        assert!(fails.contains("before-failing") && !fails.contains("hello"), "{fails}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
