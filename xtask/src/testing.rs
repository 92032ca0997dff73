//! `cargo xtask test` ([`everything`]): the installs, every check (`check.rs`), the workspace's
//! tests and the viewer's in Chromium, then the Python API's pytest suite against the dev wheel
//! on the pinned torch and each other tested torch's tests side by side, a short fuzzing run,
//! and the capture's cost guard.

use crate::cache::{cache_dir, torch_venv};
use crate::cmd::run;
use crate::{bench, check, fuzz, install, jobs, torches, viewer, wheel};
use anyhow::Result;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The pytest modules that test the collector's outputs rather than the capture (notebooks,
/// TensorBoard, dataframes, MCP, the budget plugin, the GPU checks' runner): the same on every
/// torch, so they run in the pinned torch's venv only.
const TORCH_INDEPENDENT_PY_TESTS: [&str; 6] =
    ["test_notebook.py", "test_tensorboard.py", "test_dataframes.py", "test_mcp.py", "test_budget_plugin.py", "test_gpu_checks.py"];

/// Installs what is missing, then runs every check and every test.
pub fn everything() -> Result<()> {
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
    let done = check::check().and_then(|()| test());
    jobs::say_free_disk(Path::new("."));
    if let Some(sccache) = sccache {
        // How much the cache gave, and no server left running after the command.
        let _ = run(Command::new(&sccache).arg("--show-stats"));
        let _ = run(Command::new(&sccache).arg("--stop-server"));
    }
    done
}

/// The tests, once the checks passed: the workspace's and the viewer's side by side, then the
/// Python ones and fuzzing side by side, then the capture's cost guard alone.
fn test() -> Result<()> {
    // The viewer is built for wasm32 by `check`; it has no native tests. Its components run in
    // headless Chromium beside the workspace's tests: cargo holds the build folder only while
    // it compiles, and a browser waits more than it computes. The whole page, as `check` built
    // it into dist/, is tested in Chromium by the workspace's tests themselves: every test file
    // of the collector runs, `collector/tests/viewer_e2e.rs` and
    // `collector/tests/viewer_charts_e2e.rs` among them, with no list to add a new one to.
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
            fuzz::run_targets(&["--seconds".into(), "5".into(), "--dev".into()])
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

/// The dev wheel, and where it is installed for the Python tests (`target/wheel-site`).
fn wheel_site() -> Result<(PathBuf, PathBuf)> {
    let wheel = wheel::build(true)?;
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
