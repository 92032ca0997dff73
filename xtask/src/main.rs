//! `cargo xtask`: Memory Tracer's one entry point for installing tools, checking, testing,
//! benchmarking and running the main job. Written in Rust rather than shell so it stays one
//! program with one set of rules. This file only reads the command and hands it to its module.
//!
//! - `cargo xtask test`: install what is missing, run every check and every test (`testing.rs`).
//! - `cargo xtask install-tools`: only the installs, cached outside the clone (`install.rs`).
//! - `cargo xtask check`: formatting (`cargo fmt --check`), the architecture checks (the crates'
//!   dependencies, tidy), the viewer built offline without wasm-opt (`viewer.rs`), clippy (`lint`,
//!   which also checks shared for wasm32) (`check.rs`).
//! - `cargo xtask viewer [--no-opt]`: only the viewer, into dist/ (`--no-opt`: without wasm-opt).
//! - `cargo xtask tidy`: only tidy (`tidy.rs`: `//!` openings, doc comments above attributes,
//!   paths in comments, module layers, lengths, the Python package's rules, ...).
//! - `cargo xtask lint`: only clippy with warnings denied (native, wasm32).
//! - `cargo xtask bench`: import/export benchmarks on the real samples, the graph-profile
//!   benchmark on a traced ResNet-50, the viewer in headless Chromium, and the timeline at
//!   4 million events (full scan against the multi-resolution index). `--check`: the load
//!   ratios against `pickle.load` and memory_viz, held to `xtask/bench-baseline.txt` (`bench.rs`).
//! - `cargo xtask run`: the main job (`main_job.rs`).
//! - `cargo xtask wheel [--dev]`: the `memory_tracer` Python wheel (pip install it; without
//!   `--dev` with the viewer built optimised) (`wheel.rs`).
//! - `cargo xtask fuzz [--seconds N] [--runs N] [TARGET...]`: coverage-guided fuzzing of the
//!   importers (`fuzz/`, cargo-fuzz on nightly), 30 s per target by default (`fuzz.rs`).
//! - `cargo xtask gpu [--only NAME]... [--collector PATH] [--out DIR] [--list]`: every GPU check
//!   (`tests/gpu/all.py`) on a machine with a GPU, one table, non-zero when one missed (`gpu.rs`).
//!
//! The modules import one another downward only, in `layers.rs`'s order for `xtask/src`, and
//! none uses an item of this file: the rules `cargo xtask tidy` holds every crate to.

mod bench;
mod cache;
mod check;
mod cmd;
mod cycles;
mod doc_paths;
mod fn_length;
mod fuzz;
mod gpu;
mod install;
mod jobs;
mod layers;
mod main_job;
mod python_rules;
mod source;
mod testing;
mod tidy;
mod torches;
mod untyped_json;
mod viewer;
mod wheel;

use anyhow::Result;
use std::path::{Path, PathBuf};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."));
    std::env::set_current_dir(&root)?;
    install::set_env();
    let flag = |name: &str| args.iter().any(|a| a == name);
    match args.first().map(String::as_str) {
        Some("test") => testing::everything(),
        Some("install-tools") => install::for_tests().and_then(|()| install::fuzz_tools()),
        Some("check") => check::check(),
        Some("lint") => check::lint(),
        Some("viewer") => viewer::build(!flag("--no-opt")),
        Some("tidy") => tidy::tidy(),
        Some("bench") if flag("--check") => bench::check(flag("--write-baseline")),
        Some("bench") => bench::all(),
        Some("run") => main_job::start(&args[1..]),
        Some("wheel") => {
            let dev = flag("--dev");
            if !dev {
                // A release wheel carries the viewer optimised.
                viewer::build(true)?;
            }
            wheel::build(dev).map(drop)
        }
        Some("fuzz") => fuzz::run_targets(&args[1..]),
        Some("gpu") => gpu::run_checks(&args[1..]),
        _ => {
            eprintln!("usage: cargo xtask <test|install-tools|check|lint|tidy|viewer|bench|run|wheel|fuzz|gpu>");
            std::process::exit(2);
        }
    }
}
