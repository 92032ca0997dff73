//! `cargo xtask check` ([`check`]): formatting, the crates' dependency trees, no target in
//! `shared`, tidy (`tidy.rs`), the viewer's build and clippy ([`lint`], `cargo xtask lint`).

use crate::cmd::{output, run};
use crate::source::rust_files;
use crate::{tidy, viewer};
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::Command;

/// What links libtorch: only the `capture` crate (`collector-capture`) may depend on these.
const LIBTORCH_DEPS: [&str; 2] = ["tch", "torch-sys"];

/// Crates the wire contract must never depend on (the viewer compiles it for wasm32).
const PROTOCOL_FORBIDDEN_DEPS: [&str; 6] = ["tokio", "axum", "tch", "torch-sys", "hyper", "leptos"];

/// Crates `shared` must never depend on (it compiles for wasm32 and does no I/O).
const SHARED_FORBIDDEN_DEPS: [&str; 8] = ["tokio", "axum", "tch", "torch-sys", "leptos", "web-sys", "clap", "hyper"];

/// Formatting, the architecture checks (dependencies, tidy), the viewer built without
/// wasm-opt, and clippy.
pub fn check() -> Result<()> {
    // Formatting (rustfmt.toml: 140 columns), of the workspace and of the fuzz crate.
    run(Command::new("cargo").args(["fmt", "--all", "--check"]))?;
    run(Command::new("cargo").args(["fmt", "--manifest-path", "fuzz/Cargo.toml", "--all", "--check"]))?;
    // shared's dependency tree stays free of runtime, UI, torch and CLI crates.
    let tree = output(Command::new("cargo").args(["tree", "-p", "shared", "-e", "normal", "--prefix", "none", "--target", "all"]))
        .context("cargo tree failed")?;
    for line in tree.lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        if SHARED_FORBIDDEN_DEPS.contains(&name) {
            bail!("shared depends on {name}, which it must not (see ARCHITECTURE.md invariants)");
        }
    }
    // Only the capture crate links libtorch, and it builds on the crates below the collector,
    // never on the collector's own library; the wire contract stays free of runtimes too.
    for (package, forbidden) in [
        ("collector", &LIBTORCH_DEPS[..]),
        ("record", &LIBTORCH_DEPS[..]),
        ("traceio", &LIBTORCH_DEPS[..]),
        ("device", &LIBTORCH_DEPS[..]),
        ("viewer", &LIBTORCH_DEPS[..]),
        ("capture", &["collector"][..]),
        ("protocol", &PROTOCOL_FORBIDDEN_DEPS[..]),
    ] {
        let tree = output(Command::new("cargo").args(["tree", "-p", package, "-e", "normal", "--prefix", "none", "--target", "all"]))
            .with_context(|| format!("cargo tree -p {package} failed"))?;
        if let Some(name) = tree.lines().filter_map(|l| l.split_whitespace().next()).find(|n| forbidden.contains(n)) {
            bail!("{package} depends on {name}, which it must not (see ARCHITECTURE.md invariants)");
        }
    }
    // No target-specific code in shared (`cfg(target_arch`, `cfg(not(target_arch`, `cfg!(…)`).
    for file in rust_files(Path::new("shared"))? {
        let text = std::fs::read_to_string(&file)?;
        if text.contains("target_arch") || text.contains("target_family") || text.contains("target_os") {
            bail!(
                "{} depends on the target (target_arch, target_family or target_os); shared must be the same code on native and wasm32",
                file.display()
            );
        }
    }
    tidy::tidy()?;
    // The viewer first: the collector's build script embeds dist/ and reruns when it changes,
    // so clippy then leaves `cargo test` a build script that need not run again. Without
    // wasm-opt: the tests need the page as it works, not as small as it gets (wasm-opt took
    // 2.5 to 4 minutes of the test command; `bench` and release wheels run it).
    viewer::build(false)?;
    // Clippy also stands in for a build: its wasm32 run compiles shared for wasm32 (as the
    // viewer's dependency).
    lint()?;
    eprintln!("xtask: checks passed");
    Ok(())
}

/// Clippy with warnings as errors: the workspace natively (every target) and the viewer for
/// wasm32 (which checks shared for wasm32 too). Clippy is `cargo check` plus lints, so `cargo
/// test` afterwards reuses the build scripts' work (libtorch found, the C++ shim compiled for
/// every torch release).
pub fn lint() -> Result<()> {
    let clippy = |args: &[&str]| run(Command::new("cargo").arg("clippy").args(args).args(["--", "-D", "warnings"]));
    clippy(&["--workspace", "--all-targets"])?;
    clippy(&["-p", "viewer", "--target", "wasm32-unknown-unknown", "--all-targets"])?;
    eprintln!("xtask: clippy is clean");
    Ok(())
}
