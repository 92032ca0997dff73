//! The `memory_tracer` wheel (`cargo xtask wheel [--dev]`), built by maturin from the root's
//! `pyproject.toml`: the Python package, the capture libraries and shim sources that
//! `collector python-package` writes beside it, and the collector as the wheel's script.
//!
//! The release wheel is linked by zig against glibc 2.17 (`manylinux_2_17`): the collector
//! needs nothing newer, and a collector linked against this machine's glibc would ask for
//! 2.34 (`__libc_start_main`, `pthread_*`), shutting out RHEL 8, Debian 11 and Ubuntu 20.04,
//! which torch itself supports. The capture libraries are data files to maturin: never
//! audited nor repaired, they keep linking the `libtorch_cpu`/`libc10` of the user's torch.
//! The collector embeds them too, as any build does (`record`, with the host's C++ compiler
//! whatever the target), so `collector trace` run on its own carries them.
//! `--dev` builds the debug collector that the tests built, for this machine only.

use crate::cache::cache_dir;
use crate::cmd::{output, run};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// maturin, from PyPI, in its own venv (`~/.cache/memory-tracer/maturin-venv`).
const MATURIN_VERSION: &str = "1.16.0";
/// The zig that links the release collector against an old glibc (`maturin build --zig`).
const ZIGLANG_VERSION: &str = "0.15.2";
/// The release wheel's platform: the oldest glibc the collector links against.
const MANYLINUX: &str = "manylinux_2_17";

/// Where the built wheels (and the sdist) go.
const OUT_DIR: &str = "target/wheels";
/// Where `collector python-package` writes the package before its generated parts are copied
/// next to the sources (maturin's `python-source`, whose `.gitignore` keeps them out of git).
const PACKAGE_DIR: &str = "target/wheel-pkg";
const PYTHON_SOURCE: &str = "collector/python/memory_tracer";
/// What `collector python-package` generates: the captures (`_lib/<minor>/`) and the shim's
/// sources for building on first use (`_src/`), taken into the wheel by pyproject's `include`.
const GENERATED: [&str; 2] = ["_lib", "_src"];

/// The test build (`cargo xtask test`): the wheel and the other torches' tests take its
/// binaries rather than resolving features anew.
pub const TEST_BUILD: [&str; 4] = ["test", "--workspace", "--exclude", "viewer"];

fn venv() -> PathBuf {
    cache_dir().join("maturin-venv")
}

/// Installs the pinned maturin (and, for `zig`, the pinned zig) into their venv, unless they
/// are there already; returns the venv's Python.
pub fn install_maturin(zig: bool) -> Result<PathBuf> {
    let venv = venv();
    let python = venv.join("bin/python");
    let mut missing = Vec::new();
    let have = output(Command::new(venv.join("bin/maturin")).arg("--version")).unwrap_or_default();
    if have != format!("maturin {MATURIN_VERSION}") {
        missing.push(format!("maturin=={MATURIN_VERSION}"));
    }
    if zig && output(Command::new(&python).args(["-m", "ziglang", "version"])).unwrap_or_default() != ZIGLANG_VERSION {
        missing.push(format!("ziglang=={ZIGLANG_VERSION}"));
    }
    if missing.is_empty() {
        return Ok(python);
    }
    if !python.exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    }
    run(Command::new(venv.join("bin/pip")).args(["install", "--quiet"]).args(&missing))?;
    Ok(python)
}

/// Builds the wheel into `target/wheels/` with maturin and returns its path: the package, its
/// capture libraries and the collector (which never links libtorch: it starts fast and needs
/// only torch in the user's Python). `dev`: the debug collector for this machine; otherwise a
/// release one, stripped, tagged manylinux, with the sdist written beside it.
pub fn build(dev: bool) -> Result<PathBuf> {
    let python = install_maturin(!dev)?;
    // The package comes from the collector the tests build (the captures are the same in either
    // profile: `_build.py` compiles them alike). `-p collector` resolves features without the
    // other members (`capture` asks for record's `archive` feature, tch for half's `std`), as maturin's own
    // build of the collector does, so this compiles what maturin then reuses.
    run(Command::new("cargo").args(["build", "-p", "collector"]))?;
    let pkg = Path::new(PACKAGE_DIR);
    let _ = std::fs::remove_dir_all(pkg);
    run(Command::new("target/debug/collector").args(["python-package", "--out"]).arg(pkg))?;
    for name in GENERATED {
        let to = Path::new(PYTHON_SOURCE).join(name);
        let _ = std::fs::remove_dir_all(&to);
        copy_dir(&pkg.join("memory_tracer").join(name), &to)?;
    }
    let built = maturin(&python, dev);
    // Generated files left beside the sources would go stale (a checkout on PYTHONPATH, a later
    // `pip install .`): they live only as long as the build.
    for name in GENERATED {
        let _ = std::fs::remove_dir_all(Path::new(PYTHON_SOURCE).join(name));
    }
    let wheel = built?;
    if !dev {
        run(Command::new(venv().join("bin/maturin")).args(["sdist", "--out", OUT_DIR]))?;
    }
    eprintln!("xtask: wheel at {} (pip install {0})", wheel.display());
    Ok(wheel)
}

/// `maturin build`, with this build's old wheels removed first so the one left is the new one.
fn maturin(python: &Path, dev: bool) -> Result<PathBuf> {
    let out = Path::new(OUT_DIR);
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    for old in wheels(out)? {
        std::fs::remove_file(&old).with_context(|| format!("cannot remove {}", old.display()))?;
    }
    let mut cmd = Command::new(venv().join("bin/maturin"));
    cmd.args(["build", "--out", OUT_DIR]);
    if !dev {
        // cargo-zigbuild, inside maturin, runs zig as `python -m ziglang` of this Python.
        cmd.args(["--release", "--zig", "--compatibility", MANYLINUX]).env("CARGO_ZIGBUILD_PYTHON_PATH", python);
    }
    run(&mut cmd)?;
    match wheels(out)?.as_slice() {
        [one] => Ok(one.clone()),
        found => bail!("maturin build left {} memory_tracer wheels in {}, expected one", found.len(), out.display()),
    }
}

fn wheels(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name.starts_with("memory_tracer-") && name.ends_with(".whl") {
            found.push(path);
        }
    }
    Ok(found)
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("cannot create {}", to.display()))?;
    for entry in std::fs::read_dir(from).with_context(|| format!("cannot read {}", from.display()))? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)
                .with_context(|| format!("cannot copy {} to {}", entry.path().display(), target.display()))?;
        }
    }
    Ok(())
}
