//! `collector trace -- python ...` on the torch the user has: the library carried for its
//! version, one built on first use when none is carried (hidden here to make it so), the
//! recorder when building fails, a torch too old refused before the program runs, and two
//! torch versions in one job each picking their own.
//!
//! Needs the torch venv's Python (`MEMORY_TRACER_PYTHON`, set by `cargo xtask`) and, for the
//! mixed-versions test, the other tested releases' (`MEMORY_TRACER_TEST_PYTHONS`, colon
//! separated, also set by `cargo xtask`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scratch;

use scratch::Scratch;
use shared::analysis::layer_stats;
use shared::{ImportOptions, Trace};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use traceio::files::load_trace;

fn python() -> String {
    std::env::var("MEMORY_TRACER_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn program(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/python/programs").join(name).display().to_string()
}

fn workdir(name: &str) -> Scratch {
    Scratch::new(&format!("torch-versions-{name}"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `major.minor` of the torch `python` imports, read as the capture reads it.
fn torch_minor(python: &str) -> String {
    let out = Command::new(python).args(["-c", "import torch; print('.'.join(torch.__version__.split('.')[:2]))"]).output().unwrap();
    assert!(out.status.success(), "{python} cannot import torch: {}", text(&out.stderr));
    text(&out.stdout).trim().to_owned()
}

/// The package the collector gives programs, written into `dir` without the library of this
/// torch's version: as for a torch released after this build.
fn package_without_this_torch(dir: &Path) -> PathBuf {
    let pkg = collector::pyrun::package::materialize(&dir.join("pkg")).unwrap();
    let lib = pkg.join("memory_tracer/_lib").join(torch_minor(&python()));
    assert!(lib.join("libmt_shim.so").is_file(), "this build carries no library for the test's torch: {}", lib.display());
    std::fs::remove_dir_all(&lib).unwrap();
    pkg
}

/// `collector trace -q -o DIR/out.mtrace.json FLAGS -- COMMAND` with the cache under DIR.
fn trace(dir: &Path, env: &[(&str, &Path)], flags: &[&str], command: &[&str]) -> (Output, Option<Trace>) {
    let out = dir.join("out.mtrace.json");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_collector"));
    cmd.current_dir(dir).env_remove("MEMORY_TRACER_PYTHONPATH").env("XDG_CACHE_HOME", dir.join("cache"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    let output = cmd.args(["trace", "-q", "-o"]).arg(&out).args(flags).arg("--").args(command).output().unwrap();
    let t = out.exists().then(|| load_trace(&out, &ImportOptions::default()).unwrap());
    (output, t)
}

fn leaky() -> Vec<String> {
    vec![python(), program("leaky.py")]
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn a_torch_without_a_carried_library_gets_one_built_on_first_use_then_cached() {
    let dir = workdir("first_use");
    let pkg = package_without_this_torch(&dir);
    let (out, t) = trace(&dir, &[("MEMORY_TRACER_PYTHONPATH", &pkg)], &[], &strs(&leaky()));
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("memory-tracer: building the capture for torch ") && err.contains(", once, ~10 s"), "{err}");
    assert!(text(&out.stdout).contains("kept 6 copies"));
    let t = t.expect("a trace");
    assert_eq!(t.iterations.len(), 6, "one iteration per optimizer step");
    let layers: Vec<String> = layer_stats(&t).into_keys().collect();
    assert!(layers.iter().any(|l| l == "Sequential.2") && layers.iter().any(|l| l == "optimizer.step"), "{layers:?}");
    // The second run loads the cached build.
    let (out, t) = trace(&dir, &[("MEMORY_TRACER_PYTHONPATH", &pkg)], &[], &strs(&leaky()));
    let err = text(&out.stderr);
    assert!(out.status.success() && !err.contains("building the capture"), "{err}");
    assert!(err.contains("capture: native (torch ") && err.contains(", library built on first use for torch "), "{err}");
    let t = t.expect("a trace");
    assert_eq!(t.iterations.len(), 6);
    // The trace file says which capture recorded it, as the summary does.
    let capture = t.meta.capture.as_deref().unwrap_or_default();
    assert!(capture.starts_with("native (torch ") && capture.contains("library built on first use for torch "), "{capture}");
}

#[test]
fn a_carried_library_that_does_not_load_here_is_replaced_by_one_built_on_first_use() {
    let dir = workdir("unloadable");
    let pkg = collector::pyrun::package::materialize(&dir.join("pkg")).unwrap();
    // As a library built on a newer glibc than this machine's would: present, but no load.
    let lib = pkg.join("memory_tracer/_lib").join(torch_minor(&python())).join("libmt_shim.so");
    std::fs::write(&lib, b"\x7fELF but not a library this loader accepts").unwrap();
    let (out, t) = trace(&dir, &[("MEMORY_TRACER_PYTHONPATH", &pkg)], &[], &strs(&leaky()));
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("does not load here") && err.contains("building one for this machine"), "{err}");
    assert!(err.contains("memory-tracer: building the capture for torch "), "{err}");
    let t = t.expect("a trace");
    assert_eq!(t.iterations.len(), 6);
    assert!(t.events.len() > 100, "the native capture recorded: {} events", t.events.len());
}

#[test]
fn a_compiler_that_fails_is_shown_then_the_recorder_runs_or_native_refuses() {
    let dir = workdir("bad_compiler");
    let pkg = package_without_this_torch(&dir);
    let fake = dir.join("fake-c++");
    std::fs::write(&fake, "#!/bin/sh\necho 'mt_shim.cpp:12:3: error: no compiler here on purpose' >&2\nexit 1\n").unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let env: [(&str, &Path); 2] = [("MEMORY_TRACER_PYTHONPATH", &pkg), ("CXX", &fake)];
    let (out, _) = trace(&dir, &env, &[], &strs(&leaky()));
    let err = text(&out.stderr);
    assert!(out.status.success(), "the program runs on: {err}");
    assert!(text(&out.stdout).contains("kept 6 copies"));
    assert!(
        err.contains("building one failed") && err.contains("fake-c++ failed (exit 1)") && err.contains("no compiler here on purpose"),
        "{err}"
    );
    assert!(err.contains("tracing with PyTorch's own recorder instead"), "{err}");
    // Nothing half-built stays in the cache.
    let cached: Vec<PathBuf> = walk(&dir.join("cache")).into_iter().filter(|p| p.extension().is_some_and(|e| e == "so")).collect();
    assert!(cached.is_empty(), "{cached:?}");
    // --capture native: the program does not run.
    let (out, _) = trace(&dir, &env, &["--capture", "native"], &strs(&leaky()));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(97), "{err}");
    assert!(!text(&out.stdout).contains("kept"), "the program must not run");
    assert!(err.contains("--capture native: no capture library for torch") && err.contains("no compiler here on purpose"), "{err}");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn a_torch_older_than_every_supported_release_is_refused_before_the_program_runs() {
    let dir = workdir("too_old");
    // An installed torch 2.5.1 as the capture sees it: its package folder and version.py
    // (the capture decides before the program imports torch).
    let site = dir.join("site");
    std::fs::create_dir_all(site.join("torch")).unwrap();
    std::fs::write(site.join("torch/__init__.py"), "raise ImportError('this fake torch must never be imported')\n").unwrap();
    std::fs::write(
        site.join("torch/version.py"),
        "__version__ = '2.5.1+cu124'\ngit_version = 'a8d6afb511a69687bbb2b7e88a3cf67917e1697e'\n",
    )
    .unwrap();
    let code = format!("import sys; sys.path.insert(0, {:?}); print('the program ran')", site.display().to_string());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_collector"));
    cmd.current_dir(&dir).env_remove("MEMORY_TRACER_PYTHONPATH").env("PYTHONPATH", &site);
    let out = cmd.args(["trace", "-q", "--", &python(), "-c", &code]).output().unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(97), "{err}");
    assert!(!text(&out.stdout).contains("the program ran"));
    let oldest = record::supported_versions().next().unwrap();
    let newest = record::supported_versions().last().unwrap();
    assert!(err.contains("torch 2.5.1+cu124 is older than any Memory Tracer supports"), "{err}");
    assert!(err.contains(&format!("supported are torch {oldest} to {newest}")), "{err}");
}

#[test]
fn two_torch_versions_in_one_job_each_load_their_own_library() {
    let others = std::env::var("MEMORY_TRACER_TEST_PYTHONS")
        .expect("MEMORY_TRACER_TEST_PYTHONS names the other tested torch venvs' Pythons (cargo xtask test sets it)");
    let mut pythons = vec![python()];
    pythons.extend(others.split(':').filter(|p| !p.is_empty()).map(str::to_owned));
    let minors: Vec<String> = pythons.iter().map(|p| torch_minor(p)).collect();
    assert!(minors.len() >= 2 && minors.iter().any(|m| *m != minors[0]), "{minors:?}");
    let dir = workdir("mixed");
    // One shell command starts every Python at once, as a launcher of mixed workers would.
    let script: String = pythons.iter().map(|p| format!("{p} {} & ", program("leaky.py"))).collect::<String>() + "wait";
    let (out, _) = trace(&dir, &[], &[], &["sh", "-c", &script]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(text(&out.stdout).matches("kept 6 copies").count(), pythons.len());
    let mut traced: Vec<(String, Trace)> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("out.pid")))
        .map(|p| (p.display().to_string(), load_trace(&p, &ImportOptions::default()).unwrap()))
        .collect();
    traced.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(traced.len(), pythons.len(), "one trace per process: {:?}", traced.iter().map(|t| &t.0).collect::<Vec<_>>());
    for (path, t) in &traced {
        assert_eq!(t.iterations.len(), 6, "{path}");
    }
    for minor in &minors {
        let line = format!("capture: native (torch {minor}, library built for torch {minor}.");
        assert!(err.contains(&line), "each process says which library it loaded: {line} in {err}");
    }
}

#[test]
fn a_broken_torch_install_fails_the_program_with_its_own_error() {
    let dir = workdir("broken");
    // A torch whose version the capture reads (a supported one) but whose import fails.
    let site = dir.join("site");
    std::fs::create_dir_all(site.join("torch")).unwrap();
    std::fs::write(
        site.join("torch/__init__.py"),
        "raise ImportError('libtorch_cpu.so: cannot open shared object file (broken on purpose)')\n",
    )
    .unwrap();
    std::fs::write(site.join("torch/version.py"), "__version__ = '2.11.0+cu130'\ngit_version = '70d99e998b49'\n").unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_collector"));
    cmd.current_dir(&dir).env_remove("MEMORY_TRACER_PYTHONPATH").env("PYTHONPATH", &site);
    let out = cmd.args(["trace", "-q", "--", &python(), "-c", "import torch"]).output().unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("ImportError: libtorch_cpu.so: cannot open shared object file (broken on purpose)"), "{err}");
    assert!(err.contains("Traceback (most recent call last)") && !err.contains("memory-tracer: error"), "{err}");
}
