//! `cargo xtask`: Memory Tracer's one entry point for installing tools, checking, testing,
//! benchmarking and running the main job. Written in Rust rather than shell so it stays one
//! program with one set of rules.
//!
//! - `cargo xtask test`: install what is missing, run every check and every test.
//! - `cargo xtask install-tools`: only the installs (cached outside the clone).
//! - `cargo xtask check`: formatting (`cargo fmt --check`), the architecture checks (shared's
//!   dependencies, tidy), the viewer built offline without wasm-opt (`viewer.rs`), clippy (`lint`, which also
//!   checks shared for wasm32).
//! - `cargo xtask viewer [--no-opt]`: only the viewer, into dist/ (`--no-opt`: without wasm-opt).
//! - `cargo xtask tidy`: only tidy (`//!` openings, doc comments above attributes, paths in comments).
//! - `cargo xtask lint`: only clippy with warnings denied (native, wasm32).
//! - `cargo xtask bench`: import/export benchmarks on the real samples, the graph-profile
//!   benchmark on a traced ResNet-50, the viewer in headless Chromium, and the timeline at
//!   4 million events (full scan against the multi-resolution index). `--check`: the load
//!   ratios against `pickle.load` and memory_viz, held to `xtask/bench-baseline.txt` (`bench.rs`).
//! - `cargo xtask run`: the main job.
//! - `cargo xtask wheel [--dev]`: the `memory_tracer` Python wheel (pip install it; without
//!   `--dev` with the viewer built optimised).
//! - `cargo xtask fuzz [--seconds N] [--runs N] [TARGET...]`: coverage-guided fuzzing of the
//!   importers (`fuzz/`, cargo-fuzz on nightly), 30 s per target by default.

mod bench;
mod cycles;
mod doc_paths;
mod fn_length;
mod install;
mod jobs;
mod layers;
mod torches;
mod untyped_json;
mod viewer;
mod wheel;

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

const TORCH_VERSION: &str = "2.11.0";
const WASM_BINDGEN_VERSION: &str = "0.2.130";
const BINARYEN_VERSION: &str = "132.0.0";
/// The pytest modules that test the collector's outputs rather than the capture (notebooks,
/// TensorBoard, dataframes, MCP, the budget plugin): the same on every torch, so they run in the
/// pinned torch's venv only.
const TORCH_INDEPENDENT_PY_TESTS: [&str; 5] =
    ["test_notebook.py", "test_tensorboard.py", "test_dataframes.py", "test_mcp.py", "test_budget_plugin.py"];
/// What links libtorch: only the `capture` crate (`collector-capture`) may depend on these.
const LIBTORCH_DEPS: [&str; 2] = ["tch", "torch-sys"];

/// Crates the wire contract must never depend on (the viewer compiles it for wasm32).
const PROTOCOL_FORBIDDEN_DEPS: [&str; 6] = ["tokio", "axum", "tch", "torch-sys", "hyper", "leptos"];

/// Crates `shared` must never depend on (it compiles for wasm32 and does no I/O).
const SHARED_FORBIDDEN_DEPS: [&str; 8] = ["tokio", "axum", "tch", "torch-sys", "leptos", "web-sys", "clap", "hyper"];

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = repo_root();
    std::env::set_current_dir(&root)?;
    torch_env();
    match args.first().map(String::as_str) {
        Some("test") => {
            // Inductor on the CPU checks every vector ISA by compiling a probe and importing
            // torch in a subprocess, ten of them per compiling process (24 s each on this
            // 2-core machine): the compile tests' processes ran 69 s cold, 41 s warm, and 21 s
            // and 9 s without vector code. The tests compare traced with untraced runs under
            // the same setting; torch 2.6 has no such variable and still probes.
            std::env::set_var("TORCHINDUCTOR_VEC_ISA_OK", "0");
            jobs::say_free_disk(Path::new("."));
            install::for_tests()?;
            install::fuzz_tools()?;
            let sccache = install::build_cache();
            let done = check().and_then(|()| test());
            jobs::say_free_disk(Path::new("."));
            if let Some(sccache) = sccache {
                // How much the cache gave, and no server left running after the command.
                let _ = run(Command::new(&sccache).arg("--show-stats"));
                let _ = run(Command::new(&sccache).arg("--stop-server"));
            }
            done
        }
        Some("install-tools") => install::for_tests().and_then(|()| install::fuzz_tools()),
        Some("check") => check(),
        Some("lint") => lint(),
        Some("viewer") => build_viewer(!args.iter().any(|a| a == "--no-opt")),
        Some("tidy") => tidy(),
        Some("bench") if args.iter().any(|a| a == "--check") => bench::check(args.iter().any(|a| a == "--write-baseline")),
        Some("bench") => {
            build_viewer(true)?;
            run(Command::new("cargo").args(["build", "--release", "-p", "capture"]))?;
            run(Command::new("cargo").args([
                "bench",
                "-p",
                "collector",
                "--bench",
                "startup",
                "--bench",
                "import",
                "--bench",
                "viewer",
                "--bench",
                "serve",
            ]))?;
            run(Command::new("cargo").args(["bench", "-p", "capture", "--bench", "profile"]))?;
            run(Command::new("cargo").args(["bench", "-p", "shared", "--bench", "timeline"]))?;
            run(Command::new("cargo").args(["bench", "-p", "shared", "--bench", "whatif"]))?;
            bench_capture()
        }
        Some("run") => main_job(&args[1..]),
        Some("wheel") => {
            let dev = args.iter().any(|a| a == "--dev");
            if !dev {
                // A release wheel carries the viewer optimised.
                build_viewer(true)?;
            }
            wheel(dev).map(drop)
        }
        Some("fuzz") => fuzz(&args[1..]),
        _ => {
            eprintln!("usage: cargo xtask <test|install-tools|check|lint|tidy|bench|run|wheel|fuzz>");
            std::process::exit(2);
        }
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."))
}

/// Where tools are cached: outside the clone, so fresh clones reuse them.
fn cache_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    base.join("memory-tracer")
}

pub fn torch_venv() -> PathBuf {
    cache_dir().join("torch-venv")
}

/// Points every cargo build at the cached torch venv: torch-sys finds libtorch through the
/// venv's Python (`LIBTORCH_USE_PYTORCH=1`), and tests find that Python for fixtures.
fn torch_env() {
    let venv = torch_venv();
    let path = format!("{}:{}", venv.join("bin").display(), std::env::var("PATH").unwrap_or_default());
    std::env::set_var("VIRTUAL_ENV", &venv);
    std::env::set_var("PATH", path);
    std::env::set_var("LIBTORCH_USE_PYTORCH", "1");
    std::env::set_var("MEMORY_TRACER_PYTHON", venv.join("bin/python"));
    // The other tested torch releases' Pythons (collector/tests/torch_versions.rs mixes them).
    let others: Vec<String> =
        torches::TEST_TORCHES.iter().map(|t| torches::venv(&cache_dir(), t.torch).join("bin/python").display().to_string()).collect();
    std::env::set_var("MEMORY_TRACER_TEST_PYTHONS", others.join(":"));
    std::env::set_var("MEMORY_TRACER_WEED", install::seaweedfs_venv().join("bin/weed"));
    sdk_set_env();
}

/// `MEMORY_TRACER_TORCH_SDKS`: the releases whose SDK is installed, which `record/build.rs`
/// reruns on, so that a build made before an SDK was added builds that release's capture too.
/// Set again after every install.
pub(crate) fn sdk_set_env() {
    let root = torches::sdk_root(&cache_dir());
    let mut have: Vec<String> =
        torches::versions().into_iter().filter(|v| root.join(v).join("torch/version.py").is_file()).map(str::to_owned).collect();
    have.sort();
    std::env::set_var("MEMORY_TRACER_TORCH_SDKS", have.join(","));
}

/// Runs `cmd` to its end, its output on the console or in the log of the job this thread runs
/// (`jobs.rs`); fails if it does.
pub(crate) fn run(cmd: &mut Command) -> Result<()> {
    jobs::direct_output(cmd)?;
    let status = cmd.status().with_context(|| format!("cannot start {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

/// Runs pip, and says what could not be fetched and how to provide it when it fails.
pub(crate) fn pip_run(cmd: &mut Command, what: &str, into: &Path) -> Result<()> {
    run(cmd).with_context(|| {
        format!(
            "could not install {what} into {} from PyPI (is https://pypi.org reachable? pip's own message is above). \
             Without network: point pip at a folder of wheels (PIP_FIND_LINKS=/path/to/wheels PIP_NO_INDEX=1) or a mirror \
             (PIP_INDEX_URL=…), then run again",
            into.display()
        )
    })
}

/// Stdout of a command, or `None` if it cannot run or fails.
pub(crate) fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn check() -> Result<()> {
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
    tidy()?;
    // The viewer first: the collector's build script embeds dist/ and reruns when it changes,
    // so clippy then leaves `cargo test` a build script that need not run again. Without
    // wasm-opt: the tests need the page as it works, not as small as it gets (wasm-opt took
    // 2.5 to 4 minutes of the test command; `bench` and release wheels run it).
    build_viewer(false)?;
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
fn lint() -> Result<()> {
    let clippy = |args: &[&str]| run(Command::new("cargo").arg("clippy").args(args).args(["--", "-D", "warnings"]));
    clippy(&["--workspace", "--all-targets"])?;
    clippy(&["-p", "viewer", "--target", "wasm32-unknown-unknown", "--all-targets"])?;
    eprintln!("xtask: clippy is clean");
    Ok(())
}

/// Builds the viewer into dist/ (`viewer::build`: wasm-bindgen and wasm-opt as
/// `viewer/index.html` asks). `optimize`: run wasm-opt (the tests, benchmarks and wheels); the
/// main job skips it (the wasm is larger, the build minutes shorter).
fn build_viewer(optimize: bool) -> Result<()> {
    run(Command::new("cargo").args(["fetch"]))?;
    viewer::build(&install::wasm_opt(), optimize)?;
    let wasm: u64 = std::fs::read_dir("dist")?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "wasm"))
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum();
    if wasm == 0 {
        bail!("the viewer's build left no .wasm in dist/");
    }
    eprintln!("xtask: viewer built into dist/ ({wasm} bytes of wasm)");
    Ok(())
}

fn rust_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let p = entry?.path();
        if p.is_dir() {
            out.extend(rust_files(&p)?);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

/// Every Rust file opens with a `//!` line saying what it is for, no item has two doc comments
/// split by its attributes, and every repository path that a comment, README.md or
/// ARCHITECTURE.md names exists (rules in `doc_paths.rs`).
fn tidy() -> Result<()> {
    let mut missing = Vec::new();
    let mut split = Vec::new();
    for dir in ["shared", "record", "collector", "viewer", "xtask"] {
        for file in rust_files(Path::new(dir))? {
            let text = std::fs::read_to_string(&file)?;
            if !text.trim_start().starts_with("//!") {
                missing.push(file.display().to_string());
            }
            split.extend(split_doc_comments(&text).into_iter().map(|line| format!("{}:{line}", file.display())));
        }
    }
    if !missing.is_empty() {
        bail!("these files do not open with a //! line: {}", missing.join(", "));
    }
    if !split.is_empty() {
        bail!(
            "these doc comments follow attributes that follow another doc comment, so one item has two \
             (one of them probably belongs to the item above; doc comments go before attributes): {}",
            split.join(", ")
        );
    }
    let stale = doc_paths::stale_paths(Path::new("."))?;
    if !stale.is_empty() {
        let list: Vec<String> = stale.iter().map(ToString::to_string).collect();
        bail!("these comments name paths that do not exist:\n{}", list.join("\n"));
    }
    let mut layered = Vec::new();
    for crate_layers in &layers::CRATES {
        layered.extend(layers::upward_uses(Path::new("."), crate_layers)?);
    }
    for crate_layers in &layers::CRATES {
        for cycle in cycles::module_cycles(&Path::new(".").join(crate_layers.src))? {
            layered.push(format!("{}: these modules use each other in a circle: {}", crate_layers.src, cycle.join(", ")));
        }
    }
    if !layered.is_empty() {
        bail!(
            "these modules use a layer above them (ARCHITECTURE.md: each crate's modules import only downward, in xtask/src/layers.rs's order):\n{}",
            layered.join("\n")
        );
    }
    let untyped = untyped_json::untyped(Path::new("."))?;
    if !untyped.is_empty() {
        bail!(
            "these lines read or write JSON by field name (ARCHITECTURE.md: every shape that crosses a process is a protocol type):\n{}",
            untyped.join("\n")
        );
    }
    let crowded = fn_length::several_components(Path::new("viewer/src"))?;
    if !crowded.is_empty() {
        bail!("these files hold several components (ARCHITECTURE.md: one per file):\n{}", crowded.join("\n"));
    }
    let mut long = fn_length::too_long(Path::new("viewer/src/components"), fn_length::COMPONENT_LINES)?;
    for src in fn_length::SOURCES {
        long.extend(fn_length::too_long(Path::new(src), fn_length::FUNCTION_LINES)?);
    }
    if !long.is_empty() {
        bail!("these functions are over the limit (ARCHITECTURE.md: lines in the file, comments included):\n{}", long.join("\n"));
    }
    let mut big = Vec::new();
    for src in fn_length::SOURCES {
        big.extend(fn_length::too_long_files(Path::new(src), fn_length::FILE_LINES)?);
    }
    if !big.is_empty() {
        bail!("these files are over the limit (ARCHITECTURE.md: cut a file along its jobs):\n{}", big.join("\n"));
    }
    let io = forbidden_code(&[Path::new("shared/src")], &SHARED_IO)?;
    if !io.is_empty() {
        bail!("shared does I/O here (ARCHITECTURE.md: importers take bytes or a reader, exporters a writer):\n{}", io.join("\n"));
    }
    let below_api: Vec<PathBuf> = SERVE_LAYERS[..SERVE_LAYERS.iter().position(|l| *l == "error").unwrap_or(0)]
        .iter()
        .map(|l| {
            // A layer is a file or, when it has parts, a folder.
            let folder = PathBuf::from(format!("collector/src/serve/{l}"));
            if folder.is_dir() {
                folder
            } else {
                folder.with_extension("rs")
            }
        })
        .collect();
    let http = forbidden_code(&below_api.iter().map(PathBuf::as_path).collect::<Vec<_>>(), &["axum", "StatusCode", "hyper"])?;
    if !http.is_empty() {
        bail!(
            "these serve layers below the API name HTTP (ARCHITECTURE.md: only the API layer answers with status codes):\n{}",
            http.join("\n")
        );
    }
    let upward = upward_imports(Path::new("collector/src/serve"), &SERVE_LAYERS)?;
    if !upward.is_empty() {
        bail!(
            "these serve modules import a layer above them (ARCHITECTURE.md: serve's layers import only downward):\n{}",
            upward.join("\n")
        );
    }
    Ok(())
}

/// What does I/O (files, sockets, processes, threads), which `shared` never does.
const SHARED_IO: [&str; 6] = ["std::fs", "std::net", "std::process", "std::thread", "File::open", "File::create"];

/// `file:line: code` of every line outside tests (and comments) in `paths` (folders or files)
/// that contains one of `patterns`.
fn forbidden_code(paths: &[&Path], patterns: &[&str]) -> Result<Vec<String>> {
    let mut found = Vec::new();
    for path in paths {
        let files = if path.is_file() { vec![path.to_path_buf()] } else { rust_files(path)? };
        for file in files {
            let text = std::fs::read_to_string(&file)?;
            let code = layers::strip_comments(text.split("#[cfg(test)]").next().unwrap_or(""));
            for (n, line) in code.lines().enumerate() {
                if patterns.iter().any(|p| line.contains(p)) {
                    found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
                }
            }
        }
    }
    Ok(found)
}

/// `collector serve`'s modules, lowest layer first: each may use only those before it (and
/// `mod.rs`, the app, uses them all).
const SERVE_LAYERS: [&str; 8] = ["store", "fault", "isolate", "jobs", "state", "error", "api", "docs"];

/// `file:line: module uses super::higher` for every use of a later layer by an earlier one.
fn upward_imports(dir: &Path, layers: &[&str]) -> Result<Vec<String>> {
    let mut found = Vec::new();
    for (rank, layer) in layers.iter().enumerate() {
        // A layer is `<layer>.rs`, or a folder whose `mod.rs` names the other layers as
        // `super::` and whose parts as `super::super::`.
        let folder = dir.join(layer);
        let files: Vec<(PathBuf, &str)> = if folder.is_dir() {
            rust_files(&folder)?
                .into_iter()
                .map(|f| {
                    let prefix = if f.file_name().is_some_and(|n| n == "mod.rs") { "super::" } else { "super::super::" };
                    (f, prefix)
                })
                .collect()
        } else {
            vec![(dir.join(format!("{layer}.rs")), "super::")]
        };
        for (file, prefix) in files {
            found.extend(upward_lines(&file, prefix, layer, rank, layers)?);
        }
    }
    Ok(found)
}

/// The lines of `file` (part of serve layer `layer`, at `rank`) that import a layer above it
/// through `prefix` (`super::`, or `super::super::` from a layer folder's part).
fn upward_lines(file: &Path, prefix: &str, layer: &str, rank: usize, layers: &[&str]) -> Result<Vec<String>> {
    let mut found = Vec::new();
    let text = std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        for (i, _) in code.match_indices(prefix) {
            // `super::super::x` read with the `super::` prefix is `super`, not a layer.
            if prefix == "super::" && code[i + prefix.len()..].starts_with("super::") {
                continue;
            }
            let rest = &code[i + prefix.len()..];
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            // `super::{a, b}` lists and `super::Item` (the app's re-exports) count too.
            let names: Vec<String> = if rest.starts_with('{') {
                rest[1..rest.find('}').unwrap_or(rest.len())]
                    .split(',')
                    .map(|s| s.trim().split("::").next().unwrap_or("").to_owned())
                    .collect()
            } else {
                vec![name]
            };
            for name in names {
                let above = match layers.iter().position(|l| *l == name) {
                    Some(r) => r > rank,
                    // Not a layer: an item of mod.rs (the app), which is above every layer.
                    None => !name.is_empty() && name != "super",
                };
                if above {
                    found.push(format!("{}:{}: {layer} uses {prefix}{name}", file.display(), n + 1));
                }
            }
        }
    }
    Ok(found)
}

/// Lines where a `///` block starts right after attributes that follow another `///` block:
/// the mark of a doc comment pasted above the wrong item (as happened in the viewer's charts,
/// where a function's doc and `#[allow]` ended up above a type alias).
fn split_doc_comments(text: &str) -> Vec<usize> {
    let lines: Vec<&str> = text.lines().map(str::trim_start).collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let attributes = lines[..i].iter().rev().take_while(|l| l.starts_with("#[")).count();
        if line.starts_with("///") && attributes > 0 && i > attributes && lines[i - attributes - 1].starts_with("///") {
            out.push(i + 1);
        }
    }
    out
}

fn test() -> Result<()> {
    // The viewer is built for wasm32 by `check`; it has no native tests. Its components run in
    // headless Chromium beside the workspace's tests: cargo holds the build folder only while
    // it compiles, and a browser waits more than it computes.
    jobs::side_by_side(vec![
        jobs::job("the workspace's tests", || run(Command::new("cargo").args(wheel::TEST_BUILD))),
        jobs::job("the viewer in Chromium", viewer::browser_tests),
    ])?;
    let (wheel, site) = wheel_site()?;
    // The pinned torch's pytest suite, each other tested torch's tests, and a short run of
    // every importer's fuzz target (the campaign is `cargo xtask fuzz --runs N`), side by side:
    // each is one process at a time that spends much of it starting Python and waiting on
    // the programs it traces.
    let mut jobs = vec![jobs::job("pytest on torch 2.11, then fuzzing", {
        let site = site.clone();
        move || {
            python_tests(&wheel, &site)?;
            fuzz(&["--seconds".into(), "5".into(), "--dev".into()])
        }
    })];
    for t in &torches::TEST_TORCHES {
        let site = site.clone();
        jobs.push(jobs::job(format!("torch {}", t.torch), move || other_torch_tests(t, &site)));
    }
    jobs::side_by_side(jobs)?;
    bench::cost_guard(&torch_venv().join("bin/python"), &site)?;
    eprintln!("xtask: all tests passed");
    Ok(())
}

/// The capture's cost inside a Python process (per operator, per module call), on the CPU,
/// what picking (or building) the capture library costs on every tested torch, and what
/// tracing costs a whole training process (the CPU proxy of tests/gpu/overhead.sh).
fn bench_capture() -> Result<()> {
    run(Command::new("cargo").args(["build", "--release", "-p", "collector"]))?;
    let pkg = Path::new("target/bench-pkg");
    let _ = std::fs::remove_dir_all(pkg);
    run(Command::new("target/release/collector").args(["python-package", "--out"]).arg(pkg))?;
    let pkg = std::fs::canonicalize(pkg)?;
    run(Command::new(torch_venv().join("bin/python")).arg("tests/python/bench_capture.py").env("PYTHONPATH", &pkg))?;
    // Picking the capture, and building it on first use, on every tested torch.
    let others = torches::TEST_TORCHES.iter().map(|t| torches::venv(&cache_dir(), t.torch).join("bin/python"));
    for py in std::iter::once(torch_venv().join("bin/python")).chain(others) {
        run(Command::new(py).arg("tests/bench/capture_choice.py").env("PYTHONPATH", &pkg))?;
    }
    // What tracing costs a whole training process, the CPU proxy of the GPU benchmark
    // (tests/gpu/overhead.sh): an MLP's step time untraced and traced, interleaved rounds.
    let py = torch_venv().join("bin/python");
    run(Command::new(&py)
        .args(["tests/bench/overhead.py", "--collector", "target/release/collector", "--model", "mlp", "--device", "cpu"])
        .args(["--rounds", "5", "--steps", "40", "--python"])
        .arg(&py))?;
    // The same inside one process, each mode in pairs of neighbouring traced and untraced
    // steps (the CPU proxy of `tests/bench/inprocess.py --pairs` on the GPU).
    run(Command::new(&py)
        .args(["tests/bench/inprocess.py", "--model", "mlp", "--device", "cpu", "--pairs", "60"])
        .env("PYTHONPATH", &pkg)
        .env("MEMORY_TRACER_COLLECTOR", std::fs::canonicalize("target/release/collector")?))?;
    Ok(())
}

/// Builds the `memory_tracer` wheel into `target/wheels/` with maturin (`wheel.rs`): the
/// package, its capture libraries and the collector (which never links libtorch: it starts
/// fast and needs only torch in the user's Python). `dev`: the debug collector for this
/// machine; otherwise a release one, stripped, tagged manylinux.
fn wheel(dev: bool) -> Result<PathBuf> {
    wheel::build(dev)
}

/// The dev wheel, and where it is installed for the Python tests (`target/wheel-site`).
fn wheel_site() -> Result<(PathBuf, PathBuf)> {
    let wheel = wheel(true)?;
    let site = Path::new("target/wheel-site");
    let _ = std::fs::remove_dir_all(site);
    let py = torch_venv().join("bin/python");
    run(Command::new(&py).args(["-m", "pip", "install", "--quiet", "--no-deps", "--target"]).arg(site).arg(&wheel))?;
    Ok((std::fs::canonicalize(wheel)?, std::fs::canonicalize(site)?))
}

/// pytest on `tests/python` with `py`, against the wheel installed in `site`.
fn pytest(py: &Path, site: &Path) -> Command {
    let mut cmd = Command::new(py);
    // The slowest tests named in the log, for whoever cuts the test command's time next.
    cmd.args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=12", "tests/python"])
        .env("PYTHONPATH", site)
        .env("MEMORY_TRACER_WHEEL_DIR", site)
        .env_remove("MEMORY_TRACER_COLLECTOR")
        .env_remove("MEMORY_TRACER_PYTHONPATH");
    cmd
}

/// The Python API's tests (pytest, CPU) against `wheel`, installed in `site`.
fn python_tests(wheel: &Path, site: &Path) -> Result<()> {
    // test_wheel.py installs the wheel itself, as users do.
    run(pytest(&torch_venv().join("bin/python"), site).env("MEMORY_TRACER_WHEEL", wheel))
}

/// The Python capture's tests that differ between torch releases, on another tested one
/// (`torches::TEST_TORCHES`: the oldest and the newest supported), in its venv: the programs
/// traced by `collector trace` (`python_cpu.rs`) and the pytest suite against the wheel
/// installed in `site`.
fn other_torch_tests(t: &torches::TestTorch, site: &Path) -> Result<()> {
    let py = torches::venv(&cache_dir(), t.torch).join("bin/python");
    run(Command::new("cargo")
        // The test build's features (`-p collector` alone would build it again).
        .args(wheel::TEST_BUILD)
        .args(["--test", "python_cpu", "--"])
        .args(OTHER_TORCH_TESTS)
        .env("MEMORY_TRACER_PYTHON", &py)
        .env(HOLDER_CASES_ENV, OTHER_TORCH_HOLDER_CASES.join(",")))?;
    run(pytest(&py, site).args(TORCH_INDEPENDENT_PY_TESTS.map(|t| format!("--ignore=tests/python/{t}"))))
}

/// The `python_cpu.rs` tests run on every tested torch: what the capture records (module
/// paths, phases, iterations, operators, backward attribution, leaks, torch.compile,
/// DataLoader workers, torchrun ranks, the recorder fallback); the rest is the collector's
/// own plumbing, the same on any torch, and runs on the pinned one only.
const OTHER_TORCH_TESTS: [&str; 14] = [
    "torchvision_resnet18",
    "transformers_causal_lm",
    "ops_all_records_every_operator",
    "two_optimizers",
    "inference_loops",
    "torch_compile",
    "compiled_code_is_attributed",
    "dataloader_workers",
    "torchrun_ranks",
    "leaks_are_found",
    "recorder_fallback_without_cuda",
    "recorder_fallback_hooks",
    "holders_are_what",
    "lines_outside_modules",
];

/// Which cases of `python_cpu.rs`'s holder test run (all where unset).
const HOLDER_CASES_ENV: &str = "MEMORY_TRACER_HOLDER_CASES";

/// The holder test's cases on the other torches: those whose path through torch differs by
/// release (reading saved tensors with and without unpacking, a checkpoint's own saved
/// tensors, compiled graphs, the program's own hooks, autocast); the plain ResNet and MoE and
/// the checkpointed LM take the same paths as these and run on the pinned torch.
const OTHER_TORCH_HOLDER_CASES: [&str; 4] = ["lm", "moe_checkpoint", "resnet_compile", "moe_user_hooks"];

/// The main job: build the collector (with the viewer embedded), start `collector serve`,
/// trace a built-in model on the first GPU if there is one (else the CPU) and open it live in
/// the viewer. `cargo xtask run [MODEL] [--release] [collector serve options...]`; stop with
/// Ctrl-C. The collector is built in the dev profile, the build `cargo xtask test` and the
/// wheel of the Python tests share (its analyses of a built-in model's trace take well under
/// a second; docs/benchmarks.md); `--release` builds the optimised one instead.
fn main_job(args: &[String]) -> Result<()> {
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

/// The fuzz targets (one per importer, and `import` for detection and gzip) with the files of
/// `tests/data` that seed each besides its own `fuzz/seeds/<target>/`.
const FUZZ_TARGETS: [(&str, &[&str]); 6] = [
    ("pickle", &["pickle"]),
    ("snapshot", &["pickle"]),
    ("chrome", &["json"]),
    ("dftracer", &[]),
    ("native", &["mtrace.json"]),
    ("import", &["pickle", "json", "gz"]),
];

/// Set to 1 (in CI where the fuzz tools are installed) to fail instead of skipping when they
/// are missing.
const REQUIRE_FUZZ_ENV: &str = "MEMORY_TRACER_REQUIRE_FUZZ";

/// `cargo xtask fuzz`: each target for `--seconds` (default 30) or `--runs` executions, with
/// the limits the campaign uses (2 GiB RSS, 10 s per input, inputs up to 16 KiB). Missing
/// cargo-fuzz or nightly skips with a message saying so (or fails with
/// `MEMORY_TRACER_REQUIRE_FUZZ=1`); a crash, hang or memory blow-up fails. `--dev` builds the targets
/// unoptimised (what the test command runs for a few seconds each).
fn fuzz(args: &[String]) -> Result<()> {
    let mut seconds = 30u64;
    let mut runs: Option<u64> = None;
    let mut dev = false;
    let mut targets: Vec<&str> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--seconds" => seconds = it.next().context("--seconds needs a number")?.parse().context("--seconds needs a number")?,
            "--runs" => runs = Some(it.next().context("--runs needs a number")?.parse().context("--runs needs a number")?),
            // Unoptimised: the test command's few seconds a target build in a third of the time.
            "--dev" => dev = true,
            t => match FUZZ_TARGETS.iter().find(|(name, _)| *name == t) {
                Some((name, _)) => targets.push(name),
                None => bail!("unknown fuzz target {t:?}; expected one of {:?}", FUZZ_TARGETS.map(|(n, _)| n)),
            },
        }
    }
    if targets.is_empty() {
        targets = FUZZ_TARGETS.iter().map(|(n, _)| *n).collect();
    }
    let nightly = output(Command::new("cargo").args(["+nightly", "--version"]));
    let cargo_fuzz = output(Command::new("cargo").args(["+nightly", "fuzz", "--version"]));
    if nightly.is_none() || cargo_fuzz.is_none() {
        let missing = if nightly.is_none() { "the nightly toolchain" } else { "cargo-fuzz" };
        let msg = format!(
            "xtask fuzz: SKIPPED, {missing} is not installed, so the importers were NOT fuzzed \
             (install: rustup toolchain install nightly --profile minimal && cargo install cargo-fuzz)"
        );
        if std::env::var(REQUIRE_FUZZ_ENV).is_ok_and(|v| v == "1") {
            bail!("{msg}; {REQUIRE_FUZZ_ENV}=1 requires it");
        }
        println!("{msg}");
        return Ok(());
    }
    let data = Path::new("tests/data");
    for &target in &targets {
        let corpus = Path::new("fuzz/corpus").join(target);
        std::fs::create_dir_all(&corpus)?;
        let seeds = Path::new("fuzz/seeds").join(target);
        let exts = FUZZ_TARGETS.iter().find(|(n, _)| *n == target).map_or(&[][..], |(_, e)| *e);
        let mut files = Vec::new();
        if seeds.is_dir() {
            for e in std::fs::read_dir(&seeds)? {
                files.push(e?.path());
            }
        }
        for e in std::fs::read_dir(data)? {
            let p = e?.path();
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if exts.iter().any(|x| name.ends_with(&format!(".{x}"))) {
                files.push(p);
            }
        }
        for f in files {
            if let Some(name) = f.file_name() {
                let dest = corpus.join(name);
                if !dest.exists() {
                    std::fs::copy(&f, &dest).with_context(|| format!("cannot copy seed {}", f.display()))?;
                }
            }
        }
        let mut cmd = Command::new("cargo");
        // Built outside the clone, so that fresh clones (CI) reuse the build.
        let target_dir = cache_dir().join("fuzz-target");
        cmd.current_dir("fuzz")
            .args(["+nightly", "fuzz", "run", "--sanitizer", "none", "--debug-assertions"])
            .args(dev.then_some("--dev"))
            .arg("--target-dir")
            .arg(&target_dir)
            .arg(target)
            .arg(Path::new("corpus").join(target))
            .args(["--", "-rss_limit_mb=2048", "-timeout=10", "-max_len=16384", "-print_final_stats=1"]);
        match runs {
            Some(n) => cmd.arg(format!("-runs={n}")),
            None => cmd.arg(format!("-max_total_time={seconds}")),
        };
        run(&mut cmd)
            .with_context(|| format!("fuzz target {target} found a crash, hang or memory blow-up (see fuzz/artifacts/{target}/)"))?;
    }
    Ok(())
}
