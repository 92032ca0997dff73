//! Builds the capture library once per torch release listed in `torch-versions.txt`, each
//! against that release's own headers and `libtorch_cpu`/`libc10` (`$MEMORY_TRACER_TORCH_SDK/
//! <version>/torch/`, by default `~/.cache/memory-tracer/torch-sdk`, which `cargo xtask
//! install-tools` extracts from PyPI's wheels), with the one recipe that also builds it on
//! first use (`collector/python/memory_tracer/_build.py`, run by `python3`). The libraries are embedded (`captures.rs`); a
//! release without its SDK here is left out with a warning (traced programs build it on first
//! use). With the `archive` feature, the shim is also compiled into a static archive against
//! the libtorch that tch links, for collector-capture.

use std::path::{Path, PathBuf};
use std::process::Command;

fn out_dir() -> PathBuf {
    PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default())
}

/// `2.11` of `2.11.0`: the key a library is chosen by.
fn minor(version: &str) -> String {
    version.split('.').take(2).collect::<Vec<_>>().join(".")
}

fn versions(manifest: &Path) -> Vec<String> {
    let path = manifest.join("torch-versions.txt");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(str::to_owned).collect()
}

/// `~/.cache/memory-tracer` (or under `$XDG_CACHE_HOME`).
fn cache_root() -> Option<PathBuf> {
    for var in ["XDG_CACHE_HOME", "HOME"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(cache.join("memory-tracer"))
}

/// Where `cargo xtask install-tools` puts the SDKs, so that a plain `cargo build` finds them.
fn default_sdk() -> Option<PathBuf> {
    cache_root().map(|c| c.join("torch-sdk"))
}

/// Earlier builds of the libraries, keyed by what decides their bytes (`_build.py`'s
/// `build_key`): each feature set and profile of `record` runs this script again, and every
/// fresh clone did, compiling the same ten libraries (~15 s each). `MEMORY_TRACER_BUILD_CACHE`
/// names another folder, or `off`.
fn build_cache() -> Option<PathBuf> {
    println!("cargo:rerun-if-env-changed=MEMORY_TRACER_BUILD_CACHE");
    match std::env::var_os("MEMORY_TRACER_BUILD_CACHE") {
        Some(v) if v == "off" => None,
        Some(v) => Some(PathBuf::from(v)),
        None => cache_root().map(|c| c.join("capture-build")),
    }
}

/// Builds every release whose SDK is present, two at a time per available job.
fn build_captures(manifest: &Path) -> Vec<(String, String, PathBuf)> {
    let recipe = manifest.join("../collector/python/memory_tracer/_build.py");
    println!("cargo:rerun-if-changed={}", recipe.display());
    println!("cargo:rerun-if-changed=torch-versions.txt");
    // MEMORY_TRACER_TORCH_SDKS: the SDKs `cargo xtask` installed (an SDK added later is a
    // directory no rerun-if-changed of an earlier build names).
    for var in ["MEMORY_TRACER_TORCH_SDK", "MEMORY_TRACER_TORCH_SDKS", "CXX"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    // Not the tests' `MEMORY_TRACER_PYTHON`: switching it between torch venvs must not rebuild.
    let python = std::ffi::OsString::from("python3");
    let sdk = std::env::var_os("MEMORY_TRACER_TORCH_SDK").map(PathBuf::from).or_else(default_sdk);
    let mut jobs = Vec::new();
    let mut missing = Vec::new();
    for version in versions(manifest) {
        let torch = sdk.as_ref().map(|s| s.join(&version).join("torch"));
        match torch.filter(|t| t.join("include/ATen").is_dir()) {
            Some(torch) => {
                println!("cargo:rerun-if-changed={}", torch.join("version.py").display());
                let out = out_dir().join("captures").join(minor(&version)).join("libmt_shim.so");
                jobs.push((version, torch, out));
            }
            None => missing.push(version),
        }
    }
    if !missing.is_empty() {
        println!(
            "cargo:warning=no torch SDK for {} (MEMORY_TRACER_TORCH_SDK={}): this build carries no capture library for them; traced programs on those versions build one on first use (`cargo xtask install-tools` fetches the SDKs)",
            missing.join(", "),
            sdk.as_deref().map_or("unset".into(), |s| s.display().to_string())
        );
    }
    let parallel = std::env::var("NUM_JOBS").ok().and_then(|n| n.parse::<usize>().ok()).unwrap_or(2).max(1);
    let cache = build_cache();
    let mut built = Vec::new();
    for chunk in jobs.chunks(parallel) {
        let children: Vec<_> = chunk
            .iter()
            .map(|(version, torch, out)| {
                let mut cmd = Command::new(&python);
                cmd.arg(&recipe).arg("--torch-dir").arg(torch).arg("--src").arg(manifest.join("shim")).arg("--out").arg(out);
                if let Some(cache) = &cache {
                    cmd.arg("--cache-dir").arg(cache);
                }
                let child = cmd.spawn().unwrap_or_else(|e| panic!("cannot run {} to build the capture: {e}", Path::new(&python).display()));
                (version, out, child)
            })
            .collect();
        for (version, out, mut child) in children {
            let status = child.wait().unwrap_or_else(|e| panic!("waiting for the capture build for torch {version}: {e}"));
            if !status.success() {
                panic!("building the capture library for torch {version} failed ({status}); its compiler output is above");
            }
            built.push((minor(version), version.clone(), out.clone()));
        }
    }
    built
}

fn write_captures(built: &[(String, String, PathBuf)]) {
    let mut code =
        String::from("/// The capture libraries this build carries, oldest torch first.\npub static CAPTURES: &[Capture] = &[\n");
    for (minor, version, path) in built {
        code.push_str(&format!(
            "    Capture {{ minor: {minor:?}, torch: {version:?}, library: include_bytes!({:?}) }},\n",
            path.display().to_string()
        ));
    }
    code.push_str("];\n");
    let out = out_dir().join("captures.rs");
    if std::fs::read_to_string(&out).ok().as_deref() != Some(code.as_str()) {
        std::fs::write(&out, code).unwrap_or_else(|e| panic!("cannot write {}: {e}", out.display()));
    }
}

/// PyTorch's libtorch folder: `$LIBTORCH`, else, with `LIBTORCH_USE_PYTORCH` set, the `torch`
/// package of `$PYTHON_SYS_EXECUTABLE` (or `python`), as torch-sys finds it, so the archive
/// and tch link the same libtorch.
fn libtorch_dir() -> Option<PathBuf> {
    for var in ["LIBTORCH", "LIBTORCH_USE_PYTORCH", "PYTHON_SYS_EXECUTABLE", "VIRTUAL_ENV"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    if let Some(dir) = std::env::var_os("LIBTORCH") {
        return Some(PathBuf::from(dir));
    }
    std::env::var_os("LIBTORCH_USE_PYTORCH")?;
    let python = std::env::var_os("PYTHON_SYS_EXECUTABLE").unwrap_or_else(|| "python".into());
    let out = Command::new(&python)
        .args(["-c", "import os, torch; print(os.path.dirname(torch.__file__))"])
        .output()
        .unwrap_or_else(|e| panic!("LIBTORCH_USE_PYTORCH is set but {} cannot run: {e}", Path::new(&python).display()));
    if !out.status.success() {
        panic!("LIBTORCH_USE_PYTORCH is set but `import torch` failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Some(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// The static archive collector-capture links (its build script finds it through this
/// package's `links` metadata); nothing of libtorch is linked into this package.
fn build_archive() {
    let Some(torch) = libtorch_dir() else {
        panic!("the archive feature needs libtorch: set LIBTORCH_USE_PYTORCH=1 with the torch venv active (`cargo xtask` does this)");
    };
    let include = torch.join("include");
    let objects = cc::Build::new()
        .cpp(true)
        .file("shim/mt_shim.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        // tch 0.24 links torch 2.11, whose headers need C++17 and whose wheel uses the C++11 ABI.
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        // Required: without NDEBUG, at::RecordFunction's layout differs from libtorch's.
        .define("NDEBUG", None)
        .flag("-O2")
        .warnings(false)
        .flag_if_supported("-w")
        .cargo_metadata(false)
        .compile_intermediates();
    cc::Build::new().cpp(true).objects(&objects).cargo_metadata(false).compile("mt_shim");
    println!("cargo:archive_dir={}", out_dir().display());
    println!("cargo:libtorch_lib={}", torch.join("lib").display());
}

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    println!("cargo:rerun-if-changed=shim/mt_shim.cpp");
    println!("cargo:rerun-if-changed=shim/mt_shim.h");
    let built = build_captures(&manifest);
    write_captures(&built);
    if std::env::var_os("CARGO_FEATURE_ARCHIVE").is_some() {
        build_archive();
    }
}
