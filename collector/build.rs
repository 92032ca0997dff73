//! Builds the C++ shim (`shim/mt_shim.cpp`) against PyTorch's libtorch, when the
//! `python-capture` feature is on (each flag says why it is there where it is set): once into
//! objects, linked into `libmt_shim.so` (embedded: what traced Python processes load) and
//! archived as `libmt_shim.a` (linked into `collector-capture`, which finds it through this
//! package's `links` metadata). The collector itself never links libtorch. Also embeds the
//! viewer that Trunk built into `dist/` (`viewer_assets.rs`).

use std::path::{Path, PathBuf};

/// Lists the viewer's files for `include_bytes!`: `MEMORY_TRACER_VIEWER_DIST`, else the
/// workspace's `dist/`. Without them the list is empty and `report`/`serve` say so.
fn embed_viewer() {
    println!("cargo:rerun-if-env-changed=MEMORY_TRACER_VIEWER_DIST");
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let dist = std::env::var_os("MEMORY_TRACER_VIEWER_DIST").map(PathBuf::from).unwrap_or_else(|| manifest.join("../dist"));
    println!("cargo:rerun-if-changed={}", dist.display());
    let mut entries: Vec<(String, PathBuf)> = std::fs::read_dir(&dist)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path().canonicalize().ok()?)))
        .collect();
    entries.sort();
    let mut code = String::from(
        "/// The viewer's files (name, bytes), from Trunk's `dist/` at build time.\npub static VIEWER_ASSETS: &[(&str, &[u8])] = &[\n",
    );
    for (name, path) in &entries {
        code.push_str(&format!("    ({name:?}, include_bytes!({:?})),\n", path.display().to_string()));
    }
    code.push_str("];\n");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default()).join("viewer_assets.rs");
    if std::fs::read_to_string(&out).ok().as_deref() != Some(code.as_str()) {
        std::fs::write(&out, code).unwrap_or_else(|e| panic!("cannot write {}: {e}", Path::new(&out).display()));
    }
}

/// Links the shim's objects into `OUT_DIR/libmt_shim.so`. It names libtorch_cpu and c10 only
/// (they carry every symbol it uses), so it loads into CPU-only and CUDA builds of torch alike,
/// binding to the copies that `import torch` already loaded.
fn shared_shim(build: &cc::Build, objects: &[PathBuf], lib: &Path) {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default()).join("libmt_shim.so");
    let mut cmd = build.get_compiler().to_command();
    cmd.arg("-shared").arg("-o").arg(&out).args(objects);
    cmd.arg(format!("-L{}", lib.display())).args(["-ltorch_cpu", "-lc10", "-Wl,-s"]);
    let status = cmd.status().unwrap_or_else(|e| panic!("cannot run the C++ linker for libmt_shim.so: {e}"));
    if !status.success() {
        panic!("linking libmt_shim.so failed ({status}): {cmd:?}");
    }
    println!("cargo:rustc-cfg=shim_so");
    println!("cargo:rustc-env=MT_SHIM_SO={}", out.display());
}

/// PyTorch's libtorch folder (`lib/` and `include/` in it): `$LIBTORCH`, else, with
/// `LIBTORCH_USE_PYTORCH` set, the `torch` package of `$PYTHON_SYS_EXECUTABLE` (or `python`),
/// as torch-sys finds it for `collector-capture`, so both link the same libtorch.
fn libtorch_dir() -> Option<PathBuf> {
    for var in ["LIBTORCH", "LIBTORCH_USE_PYTORCH", "PYTHON_SYS_EXECUTABLE", "VIRTUAL_ENV"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    if let Some(dir) = std::env::var_os("LIBTORCH") {
        return Some(PathBuf::from(dir));
    }
    std::env::var_os("LIBTORCH_USE_PYTORCH")?;
    let python = std::env::var_os("PYTHON_SYS_EXECUTABLE").unwrap_or_else(|| "python".into());
    let out = std::process::Command::new(&python)
        .args(["-c", "import os, torch; print(os.path.dirname(torch.__file__))"])
        .output()
        .unwrap_or_else(|e| panic!("LIBTORCH_USE_PYTORCH is set but {} cannot run: {e}", Path::new(&python).display()));
    if !out.status.success() {
        panic!("LIBTORCH_USE_PYTORCH is set but `import torch` failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Some(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

fn main() {
    println!("cargo::rustc-check-cfg=cfg(shim_so)");
    embed_viewer();
    println!("cargo:rerun-if-changed=shim/mt_shim.cpp");
    println!("cargo:rerun-if-changed=shim/mt_shim.h");
    if std::env::var_os("CARGO_FEATURE_PYTHON_CAPTURE").is_none() {
        return;
    }
    let Some(torch) = libtorch_dir() else {
        panic!(
            "the python-capture feature needs libtorch: set LIBTORCH_USE_PYTORCH=1 with the torch venv active (`cargo xtask` does this), or build with --no-default-features"
        );
    };
    let (lib, include) = (torch.join("lib"), torch.join("include"));
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .file("shim/mt_shim.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        // libtorch 2.11's headers need C++17.
        .flag("-std=c++17")
        // The PyPI wheel's libtorch is built with the C++11 ABI (torch._C._GLIBCXX_USE_CXX11_ABI).
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        // Required: without NDEBUG, at::RecordFunction's layout differs from libtorch's.
        .define("NDEBUG", None)
        // The shim runs on every allocation and operator: optimised.
        .flag("-O2")
        // The same objects go into libmt_shim.so.
        .flag("-fPIC")
        // libtorch's headers warn in ways the shim cannot fix.
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .warnings(false)
        .cargo_metadata(false);
    // One compile, two products: the shared library Python processes load after `import torch`
    // (collector trace -- python ...), and an archive for collector-capture. Only `cargo:KEY`
    // metadata points at the archive: nothing of libtorch is linked into this package.
    let objects = build.compile_intermediates();
    shared_shim(&build, &objects, &lib);
    cc::Build::new().cpp(true).objects(&objects).cargo_metadata(false).compile("mt_shim");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    println!("cargo:archive_dir={}", out.display());
    println!("cargo:libtorch_lib={}", lib.display());
}
