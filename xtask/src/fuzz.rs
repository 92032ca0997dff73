//! `cargo xtask fuzz [--seconds N] [--runs N] [--dev] [TARGET...]`: coverage-guided fuzzing of
//! the importers (`fuzz/`, cargo-fuzz on nightly), each target seeded from `fuzz/seeds/` and
//! the samples of `tests/data`, built outside the clone.

use crate::cache::cache_dir;
use crate::cmd::{output, run};
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::Command;

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
pub fn run_targets(args: &[String]) -> Result<()> {
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
