//! `cargo xtask gpu [--only NAME]... [--collector PATH] [--out DIR] [--list]`: every GPU check
//! in one run, and one table of what each compared (check, figure, bound, pass or fail,
//! seconds). The list of checks and the runner are `tests/gpu/all.py`, not this module: the GPU
//! machines have no Rust toolchain, and there one runs `python3 tests/gpu/all.py COLLECTOR
//! OUT_DIR` with a collector built elsewhere. Here the release collector is built when no
//! `--collector` is given, then the runner takes over; its exit status (non-zero when a check
//! missed its bound, crashed or timed out) is this command's. The CHECK line each check prints
//! and the list are in `tests/gpu/README.md`.

use crate::cmd::run;
use crate::viewer::cargo_target_dir;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;
use std::process::Command;

/// The runner: the list of checks, running them, reading their CHECK lines, the table.
const RUNNER: &str = "tests/gpu/all.py";

/// Where the logs and the table go without `--out`.
const DEFAULT_OUT: &str = "target/gpu-checks";

/// What `cargo xtask gpu` was asked for.
#[derive(Debug, PartialEq)]
struct GpuArgs {
    /// The checks to run (every one when empty).
    only: Vec<String>,
    /// A collector built already; `None`: build the release one.
    collector: Option<PathBuf>,
    /// The logs' and the table's folder.
    out: PathBuf,
    /// Print the list instead of running it.
    list: bool,
}

fn parse(args: &[String]) -> Result<GpuArgs> {
    let mut a = GpuArgs { only: Vec::new(), collector: None, out: PathBuf::from(DEFAULT_OUT), list: false };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--only" => a.only.push(value()?.clone()),
            "--collector" => a.collector = Some(PathBuf::from(value()?)),
            "--out" => a.out = PathBuf::from(value()?),
            "--list" => a.list = true,
            other => bail!("cargo xtask gpu: unknown argument {other:?}; expected --only NAME, --collector PATH, --out DIR or --list"),
        }
    }
    Ok(a)
}

/// The runner's command line for `a`, with `collector` the binary to check.
fn runner(a: &GpuArgs, collector: &std::path::Path) -> Command {
    let mut cmd = Command::new("python3");
    cmd.arg(RUNNER);
    if a.list {
        cmd.arg("--list");
        return cmd;
    }
    cmd.arg(collector).arg(&a.out);
    for name in &a.only {
        cmd.args(["--only", name]);
    }
    cmd
}

/// Runs the checks `args` pick (`cargo xtask gpu ...`), building the collector first unless
/// one is given.
pub fn run_checks(args: &[String]) -> Result<()> {
    let a = parse(args)?;
    let collector = match (&a.collector, a.list) {
        (Some(c), _) => c.clone(),
        (None, true) => PathBuf::new(),
        (None, false) => {
            run(Command::new("cargo").args(["build", "--release", "-p", "collector"]))?;
            cargo_target_dir().join("release/collector")
        }
    };
    run(&mut runner(&a, &collector)).context("a GPU check failed (the table above says which), or the runner could not start")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| (*w).to_owned()).collect()
    }

    fn words(cmd: &Command) -> Vec<String> {
        std::iter::once(cmd.get_program()).chain(cmd.get_args()).map(|w| w.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn flags_map_onto_the_runners_command_line() {
        let a = parse(&args(&["--only", "python", "--out", "/tmp/g", "--only", "ledger", "--collector", "c/collector"])).unwrap();
        assert_eq!(
            a,
            GpuArgs {
                only: vec!["python".into(), "ledger".into()],
                collector: Some("c/collector".into()),
                out: "/tmp/g".into(),
                list: false
            }
        );
        let cmd = runner(&a, a.collector.as_deref().unwrap());
        assert_eq!(words(&cmd), ["python3", RUNNER, "c/collector", "/tmp/g", "--only", "python", "--only", "ledger"]);
    }

    #[test]
    fn defaults_list_and_mistakes() {
        let a = parse(&[]).unwrap();
        assert_eq!((a.only.len(), a.collector, a.out.to_str()), (0, None, Some(DEFAULT_OUT)));
        let listed = parse(&args(&["--list"])).unwrap();
        assert_eq!(words(&runner(&listed, std::path::Path::new(""))), ["python3", RUNNER, "--list"]);
        assert!(parse(&args(&["--only"])).unwrap_err().to_string().contains("--only needs a value"));
        assert!(parse(&args(&["python"])).unwrap_err().to_string().contains("unknown argument \"python\""));
    }
}
