//! `cargo xtask bench` ([`all`]): import/export benchmarks on the real samples, the
//! graph-profile benchmark on a traced ResNet-50, the viewer in headless Chromium, the timeline
//! at 4 million events, and the capture's cost inside a Python process ([`capture`]).
//!
//! `cargo xtask bench --check`: the load-speed lead, guarded (issue 51). Each ratio is measured
//! against its reference in the same run, runs interleaved: `collector summary FILE` (release
//! build, process start to exit) against Python's bare `pickle.load` of the same file, and, when
//! `MEMORY_TRACER_MEMORY_VIZ` names memory_viz's page script, the viewer against
//! pytorch.org/memory_viz in the same headless Chromium (`collector/benches/viewer.rs`, whose
//! table gives memory_viz's time over ours, file chosen → first screen painted). A ratio more than 15 % below the one committed in
//! [`BASELINE`] fails the command; `--write-baseline` records this run's ratios there.
//! A benchmark, not a test: CI never runs it. CI does run [`cost_guard`], the capture's hot
//! paths against their budgets (issue 68), whose pairs of neighbouring blocks read through a
//! shared machine's noise where whole processes cannot.

use crate::cache::{cache_dir, torch_venv};
use crate::cmd::run;
use crate::{torches, viewer};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// The committed ratios: `name<TAB>ratio` lines, `#` comments.
pub const BASELINE: &str = "xtask/bench-baseline.txt";

/// A ratio may fall this far below its baseline (15 %) before the check fails.
const TOLERANCE: f64 = 0.85;

/// Interleaved runs of each side; the medians are compared.
const RUNS: usize = 5;

/// Every benchmark: the viewer built optimised, the collector's, the capture's and shared's
/// criterion benchmarks, then [`capture`].
pub fn all() -> Result<()> {
    viewer::build(true)?;
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
    capture()
}

/// The capture's cost inside a Python process (per operator, per module call), on the CPU,
/// what picking (or building) the capture library costs on every tested torch, and what
/// tracing costs a whole training process (the CPU proxy of tests/gpu/overhead.sh).
fn capture() -> Result<()> {
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

/// Measures every ratio, prints them beside the baseline, and fails on one that fell too far.
pub fn check(write_baseline: bool) -> Result<()> {
    run(Command::new("cargo").args(["build", "--release", "-p", "collector"]))?;
    let mut measured = BTreeMap::new();
    // The large file only: on the 0.47 MB one the collector's process start outweighs the load.
    let big = files()?.pop().context("no benchmark file")?;
    let name = big.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    measured.insert(format!("summary_over_pickle_load {name}"), summary_over_pickle_load(&big)?);
    match std::env::var_os("MEMORY_TRACER_MEMORY_VIZ") {
        Some(_) => measured.extend(viewer_over_memory_viz()?),
        None => eprintln!("xtask: the viewer's ratios need MEMORY_TRACER_MEMORY_VIZ (memory_viz's MemoryViz.js): not measured"),
    }
    let baseline = read_baseline(Path::new(BASELINE))?;
    let failed = report(&measured, &baseline);
    if write_baseline {
        let mut text =
            String::from("# cargo xtask bench --check's ratios (xtask/src/bench.rs): name<TAB>ratio; --write-baseline rewrites it\n");
        for (name, ratio) in &measured {
            text += &format!("{name}\t{ratio:.2}\n");
        }
        std::fs::write(BASELINE, text).with_context(|| format!("cannot write {BASELINE}"))?;
        eprintln!("xtask: wrote {BASELINE}");
        return Ok(());
    }
    if !failed.is_empty() {
        bail!("these ratios fell more than 15 % below {BASELINE}:\n{}", failed.join("\n"));
    }
    Ok(())
}

/// Prints the table; gives the lines of the ratios that fell too far.
fn report(measured: &BTreeMap<String, f64>, baseline: &BTreeMap<String, f64>) -> Vec<String> {
    let mut failed = Vec::new();
    println!("| ratio | this run | baseline | |");
    println!("|---|---|---|---|");
    for (name, &ratio) in measured {
        let (base, verdict) = match baseline.get(name) {
            Some(&b) if ratio < b * TOLERANCE => {
                failed.push(format!("{name}: {ratio:.2} against {b:.2}"));
                (format!("{b:.2}"), "below")
            }
            Some(&b) => (format!("{b:.2}"), "ok"),
            None => ("—".to_owned(), "no baseline"),
        };
        println!("| {name} | {ratio:.2}× | {base} | {verdict} |");
    }
    failed
}

/// `name<TAB>ratio` lines; none when the file is absent.
fn read_baseline(path: &Path) -> Result<BTreeMap<String, f64>> {
    let Ok(text) = std::fs::read_to_string(path) else { return Ok(BTreeMap::new()) };
    let mut out = BTreeMap::new();
    for (k, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty() && !l.starts_with('#')) {
        let (name, ratio) = line.rsplit_once('\t').with_context(|| format!("{}:{}: expected NAME<TAB>RATIO", path.display(), k + 1))?;
        let ratio: f64 = ratio.trim().parse().with_context(|| format!("{}:{}: {ratio:?} is not a number", path.display(), k + 1))?;
        out.insert(name.to_owned(), ratio);
    }
    Ok(out)
}

/// The files measured (the viewer both, the summary the large one): the real ResNet-18
/// snapshot (0.47 MB) and a 57 MB one with a real
/// `stacks="all"` recording's structure (`tests/bench/scale_snapshot.py`, 4 copies of
/// `tests/data/big_all_cut.pickle.xz`), made once under `target/bench/`.
fn files() -> Result<Vec<PathBuf>> {
    let dir = Path::new("target/bench");
    std::fs::create_dir_all(dir)?;
    let big = dir.join("big_all_x4.pickle");
    if !big.exists() {
        let cut = dir.join("big_all_cut.pickle");
        let py = torch_venv().join("bin/python");
        let unpack = format!(
            "import lzma, shutil; shutil.copyfileobj(lzma.open('tests/data/big_all_cut.pickle.xz'), open('{}', 'wb'))",
            cut.display()
        );
        run(Command::new(&py).args(["-c", &unpack]))?;
        run(Command::new(&py).arg("tests/bench/scale_snapshot.py").arg(&cut).arg("4").arg(&big))?;
    }
    Ok(vec![PathBuf::from("tests/data/resnet18_sgd_2steps.pickle"), big])
}

/// Median seconds of Python's `pickle.load` over the median seconds of `collector summary`.
fn summary_over_pickle_load(file: &Path) -> Result<f64> {
    let py = torch_venv().join("bin/python");
    let load = format!(
        "import pickle, time\nt = time.perf_counter()\nwith open({:?}, 'rb') as f: pickle.load(f)\nprint(time.perf_counter() - t)",
        file.display().to_string()
    );
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let t = Instant::now();
        let status =
            Command::new(viewer::cargo_target_dir().join("release/collector")).arg("summary").arg(file).stdout(Stdio::null()).status()?;
        if !status.success() {
            bail!("collector summary {} failed ({status})", file.display());
        }
        ours.push(t.elapsed().as_secs_f64());
        let out = Command::new(&py).args(["-c", &load]).output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        theirs.push(text.trim().parse::<f64>().with_context(|| format!("pickle.load of {} printed {text:?}", file.display()))?);
    }
    let (ours, theirs) = (median(ours), median(theirs));
    eprintln!("xtask: {}: collector summary {:.3} s, pickle.load {:.3} s (medians of {RUNS})", file.display(), ours, theirs);
    Ok(theirs / ours)
}

/// memory_viz's time over ours for each file, from the viewer benchmark's table.
fn viewer_over_memory_viz() -> Result<BTreeMap<String, f64>> {
    viewer::build(true)?;
    let files: Vec<String> =
        files()?.iter().map(|f| std::fs::canonicalize(f).map(|p| p.display().to_string())).collect::<Result<_, _>>()?;
    let out = Command::new("cargo")
        .args(["bench", "-p", "collector", "--bench", "viewer"])
        .env("MEMORY_TRACER_VIEWER_BENCH_FILES", files.join(","))
        .env("MEMORY_TRACER_BENCH_RUNS", RUNS.min(3).to_string())
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        bail!("the viewer benchmark failed ({})", out.status);
    }
    Ok(viewer_ratios(&String::from_utf8_lossy(&out.stdout)))
}

/// `| FILE | MB | viewer | … | N.N× |` rows of the viewer benchmark's table.
fn viewer_ratios(table: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in table.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // `| file | … | page | … | ratio |`: the ratio is the last cell.
        if cells.len() >= 9 && cells[3] == "viewer" {
            if let Some(Ok(r)) = cells[cells.len() - 2].strip_suffix('×').map(str::parse::<f64>) {
                out.insert(format!("first_screen_over_memory_viz {}", cells[1]), r);
            }
        }
    }
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The budgets `tests/bench/cost_guard.py` holds the capture's hot paths to (issue 68).
const COST_BUDGET: &str = "tests/bench/cost_budget.json";

/// `cargo xtask test`'s guard on the capture's hot paths: what an allocation record and a
/// module call cost each capture mode on the CPU, against [`COST_BUDGET`] (more than 25 % over
/// fails; a baseline too noisy to read is measured again, then fails). Run alone, after the
/// tests that run side by side, whose load would be read as the capture's.
pub fn cost_guard(py: &Path, site: &Path) -> Result<()> {
    run(Command::new(py).args(["tests/bench/cost_guard.py", "--check", COST_BUDGET]).env("PYTHONPATH", site))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ratio_more_than_15_percent_below_its_baseline_fails_and_one_without_is_said() {
        let measured: BTreeMap<String, f64> = [("a".to_owned(), 2.0), ("b".to_owned(), 3.5), ("c".to_owned(), 1.0)].into();
        let baseline: BTreeMap<String, f64> = [("a".to_owned(), 2.2), ("b".to_owned(), 4.2)].into();
        assert_eq!(report(&measured, &baseline), ["b: 3.50 against 4.20"]);
    }

    #[test]
    fn the_baseline_and_the_viewer_table_are_read() {
        let path = std::env::temp_dir().join(format!("xtask-baseline-{}", std::process::id()));
        std::fs::write(&path, "# comment\nsummary_over_pickle_load x.pickle\t2.60\n\n").unwrap();
        let read = read_baseline(&path).unwrap();
        std::fs::write(&path, "summary x 2.6\n").unwrap();
        let bad = read_baseline(&path).unwrap_err().to_string();
        let _ = std::fs::remove_file(&path);
        assert_eq!(read, [("summary_over_pickle_load x.pickle".to_owned(), 2.6)].into());
        assert!(bad.contains(":1: expected NAME<TAB>RATIO"), "{bad}");
        let table = "| file | MB | page | runs | all | peak | memory_viz / ours |\n|---|---|---|---|---|---|---|\n| a.pickle | 0.5 | memory_viz | 238 | 238 | 90 |  |\n| a.pickle | 0.5 | viewer | 190 | 250 | 80 | 1.3× |\n";
        assert_eq!(viewer_ratios(table), [("first_screen_over_memory_viz a.pickle".to_owned(), 1.3)].into());
        assert!(read_baseline(Path::new("/nonexistent/baseline")).unwrap().is_empty());
    }
}
