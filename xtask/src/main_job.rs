//! `cargo xtask run [MODEL] [--release] [collector serve options...]`: the main job, a built-in
//! model traced live into the viewer.

use crate::cmd::run;
use crate::{install, viewer};
use anyhow::{Context, Result};
use std::path::Path;
use std::process::Command;

/// The main job: build the collector (with the viewer embedded), start `collector serve`,
/// trace a built-in model on the first GPU if there is one (else the CPU) and open it live in
/// the viewer. `cargo xtask run [MODEL] [--release] [collector serve options...]`; stop with
/// Ctrl-C. The collector is built in the dev profile, the build `cargo xtask test` and the
/// wheel of the Python tests share (its analyses of a built-in model's trace take well under
/// a second; docs/benchmarks.md); `--release` builds the optimised one instead.
pub fn start(args: &[String]) -> Result<()> {
    let release = args.iter().any(|a| a == "--release");
    let args: Vec<String> = args.iter().filter(|a| *a != "--release").cloned().collect();
    let (model, rest) = match args.split_first() {
        Some((m, rest)) if !m.starts_with('-') => (m.clone(), rest),
        _ => ("resnet18".to_owned(), &args[..]),
    };
    // Only what the main job needs (the tests' installs are `cargo xtask test`'s), while the
    // viewer's wasm compiles: it needs none of it until wasm-bindgen runs. The collector
    // embeds the viewer, so the viewer is done first.
    install::wasm_target()?;
    run(Command::new("cargo").args(["fetch"]))?;
    std::thread::scope(|s| {
        let wasm = s.spawn(viewer::compile);
        let installs = install::for_run();
        let wasm = wasm.join().unwrap_or_else(|_| Err(anyhow::anyhow!("the viewer's build thread panicked")));
        installs.and(wasm)
    })?;
    viewer::package(&install::wasm_opt(), release)?;
    // collector-capture runs the built-in model; collector finds it beside itself.
    let mut build = Command::new("cargo");
    build.args(["build", "-p", "collector", "-p", "capture"]);
    if release {
        build.arg("--release");
    }
    run(&mut build)?;
    let exe = Path::new("target").join(if release { "release" } else { "debug" }).join("collector");
    eprintln!("xtask: starting collector serve; it traces {model} and prints the viewer's URL (Ctrl-C stops it)");
    let mut server =
        Command::new(exe).args(["serve", "--trace", &model, "--open"]).args(rest).spawn().context("cannot start collector serve")?;
    // Ctrl-C reaches the server too, which stops gracefully; xtask waits for it and exits
    // quietly instead of dying first.
    // SAFETY: ignoring SIGINT in this process only; the server was spawned before.
    unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
    let status = server.wait()?;
    if !status.success() {
        // The server said why on stderr; no second message, no backtrace.
        std::process::exit(status.code().unwrap_or(1));
    }
    Ok(())
}
