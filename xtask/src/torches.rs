//! The torch releases the capture is built and tested against, cached outside the clone:
//! - one SDK per release of `record/torch-versions.txt` (`torch-sdk/<version>/torch/`: the
//!   wheel's `include/`, `lib/libtorch_cpu.so`, `lib/libc10.so`, `utils/cpp_extension.py` and
//!   `version.py`, all that the build needs), from PyPI's wheel (`pip download --no-deps`,
//!   deleted once extracted);
//! - a venv per tested release beside the pinned one (torch-venv): the oldest and the newest,
//!   each with what the Python tests need.

use crate::cache::cache_dir;
use crate::cmd::{output, pip_run, run};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The supported releases, oldest first (the one list; comments and blank lines left out).
pub fn versions() -> Vec<&'static str> {
    include_str!("../../record/torch-versions.txt").lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect()
}

pub fn sdk_root(cache: &Path) -> PathBuf {
    cache.join("torch-sdk")
}

/// `MEMORY_TRACER_TORCH_SDKS`: the releases whose SDK is installed, which `record/build.rs`
/// reruns on, so that a build made before an SDK was added builds that release's capture too.
/// Set again after every install.
pub fn set_sdk_env() {
    let root = sdk_root(&cache_dir());
    let mut have: Vec<String> =
        versions().into_iter().filter(|v| root.join(v).join("torch/version.py").is_file()).map(str::to_owned).collect();
    have.sort();
    std::env::set_var("MEMORY_TRACER_TORCH_SDKS", have.join(","));
}

/// What the build extracts from a torch wheel (a Python script: zipfile is Python's own).
const EXTRACT: &str = r#"
import os, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
keep = ("torch/include/", "torch/lib/libtorch_cpu.so", "torch/lib/libc10.so", "torch/utils/cpp_extension.py", "torch/version.py")
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith(keep) and not n.endswith("/")]
    if not any(n.endswith("libc10.so") for n in names):
        sys.exit(f"{wheel} holds no torch/lib/libc10.so: not a torch wheel with libraries")
    for n in names:
        z.extract(n, dest)
"#;

/// Extracts every listed release's SDK that is not there yet.
pub fn install_sdks(cache: &Path) -> Result<()> {
    let root = sdk_root(cache);
    let wheels = cache.join("torch-wheels");
    for version in versions() {
        let dest = root.join(version);
        if dest.join("torch/version.py").is_file() {
            continue;
        }
        std::fs::create_dir_all(&wheels)?;
        let wheel = match find_wheel(&wheels, version)? {
            Some(w) => w,
            None => {
                eprintln!(
                    "xtask: torch {version}'s headers and libraries (500 to 900 MB to download, about 450 MB kept) into {}",
                    dest.display()
                );
                pip_run(
                    Command::new("python3")
                        .args(["-m", "pip", "download", "--quiet", "--no-cache-dir", "--no-deps", "--only-binary=:all:", "-d"])
                        .arg(&wheels)
                        .arg(format!("torch=={version}")),
                    &format!("torch=={version}'s wheel"),
                    &wheels,
                )?;
                find_wheel(&wheels, version)?
                    .with_context(|| format!("pip downloaded no torch-{version} wheel into {}", wheels.display()))?
            }
        };
        let tmp = root.join(format!(".tmp-{version}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp)?;
        run(Command::new("python3").args(["-c", EXTRACT]).arg(&wheel).arg(&tmp))?;
        let _ = std::fs::remove_dir_all(&dest);
        std::fs::rename(&tmp, &dest).with_context(|| format!("cannot move {} into place", dest.display()))?;
        std::fs::remove_file(&wheel).with_context(|| format!("cannot remove {}", wheel.display()))?;
        eprintln!("xtask: torch {version} SDK at {}", dest.display());
    }
    Ok(())
}

fn find_wheel(dir: &Path, version: &str) -> Result<Option<PathBuf>> {
    let prefix = format!("torch-{version}-");
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if name.starts_with(&prefix) && name.ends_with(".whl") {
            return Ok(Some(path));
        }
    }
    Ok(None)
}

/// A release the Python tests also run on, beside the pinned one, with the packages its tests
/// need. torchvision has no release for torch 2.15: 0.29.2 (built for 2.14) goes in without its
/// torch pin (its models are Python; its compiled operators are not used by the tests).
/// `python`: the Python its venv is made with where the machine has it (else `python3`): the
/// newest release runs on 3.12, whose sys.monitoring names the lines outside modules.
pub struct TestTorch {
    pub torch: &'static str,
    pub packages: &'static [&'static str],
    pub no_deps: &'static [&'static str],
    pub python: Option<&'static str>,
}

pub const TEST_TORCHES: [TestTorch; 2] = [
    TestTorch { torch: "2.6.0", packages: &["torchvision==0.21.0"], no_deps: &[], python: None },
    TestTorch { torch: "2.15.0", packages: &["pillow"], no_deps: &["torchvision==0.29.2"], python: Some("3.12") },
];

/// `python3.X` on PATH if it runs, else pyenv's newest `3.X.*`.
fn find_python(minor: &str) -> Option<PathBuf> {
    let name = format!("python{minor}");
    if output(Command::new(&name).arg("--version")).is_some() {
        return Some(PathBuf::from(name));
    }
    let root =
        std::env::var_os("PYENV_ROOT").map(PathBuf::from).or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pyenv")))?;
    let mut found: Vec<PathBuf> = std::fs::read_dir(root.join("versions"))
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&format!("{minor}.")))
        .map(|e| e.path().join("bin").join(&name))
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    found.pop()
}

pub fn venv(cache: &Path, torch: &str) -> PathBuf {
    cache.join(format!("torch-venv-{torch}"))
}

/// The venv of each tested release, made once.
pub fn install_test_venvs(cache: &Path, common: &[&str]) -> Result<()> {
    for t in &TEST_TORCHES {
        let venv = venv(cache, t.torch);
        let py = venv.join("bin/python");
        let python = t.python.and_then(find_python);
        let check =
            "import sys, torch, torchvision, transformers, pytest, requests; print(torch.__version__, '%d.%d' % sys.version_info[:2])";
        let wanted_python = python.as_ref().and(t.python);
        let is_wanted = |v: Option<String>| {
            v.is_some_and(|v| {
                let mut parts = v.split_whitespace();
                parts.next().and_then(|t| t.split('+').next()) == Some(t.torch) && wanted_python.is_none_or(|w| parts.next() == Some(w))
            })
        };
        if is_wanted(output(Command::new(&py).args(["-c", check]))) {
            continue;
        }
        // A venv whose torch does not import was left by an interrupted install, one on another
        // Python than wanted by an older checkout: made again.
        let other_python = wanted_python.is_some_and(|w| {
            output(Command::new(&py).args(["-c", "import sys; print('%d.%d' % sys.version_info[:2])"])).is_some_and(|v| v.trim() != w)
        });
        if py.exists() && (other_python || output(Command::new(&py).args(["-c", "import torch"])).is_none()) {
            std::fs::remove_dir_all(&venv).with_context(|| format!("cannot remove {}", venv.display()))?;
        }
        if !py.exists() {
            run(Command::new(python.clone().unwrap_or_else(|| PathBuf::from("python3"))).args(["-m", "venv"]).arg(&venv))?;
        }
        eprintln!("xtask: torch {} for its tests (about 3 GB to download, 5.6 GB on disk) into {}", t.torch, venv.display());
        let torch = format!("torch=={}", t.torch);
        pip_run(
            Command::new(venv.join("bin/pip")).args(["install", "--quiet", "--no-cache-dir", &torch]).args(t.packages).args(common),
            &torch,
            &venv,
        )?;
        if !t.no_deps.is_empty() {
            pip_run(
                Command::new(venv.join("bin/pip")).args(["install", "--quiet", "--no-cache-dir", "--no-deps"]).args(t.no_deps),
                &t.no_deps.join(" "),
                &venv,
            )?;
        }
        let got = output(Command::new(&py).args(["-c", check]));
        if !is_wanted(got.clone()) {
            bail!("the torch {} venv at {} does not import its packages (got {got:?})", t.torch, venv.display());
        }
    }
    Ok(())
}
