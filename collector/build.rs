//! Builds the C++ shim (`shim/mt_shim.cpp`) against the libtorch that `torch-sys` found, when
//! the `tracing` feature is on (each flag says why it is there where it is set),
//! and embeds the viewer that Trunk built into `dist/` (`viewer_assets.rs`).

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

fn main() {
    println!("cargo::rustc-check-cfg=cfg(shim_so)");
    embed_viewer();
    println!("cargo:rerun-if-changed=shim/mt_shim.cpp");
    println!("cargo:rerun-if-changed=shim/mt_shim.h");
    if std::env::var_os("CARGO_FEATURE_TRACING").is_none() {
        return;
    }
    let Some(lib) = std::env::var_os("DEP_TCH_LIBTORCH_LIB").map(PathBuf::from) else {
        panic!("torch-sys did not report DEP_TCH_LIBTORCH_LIB; set LIBTORCH_USE_PYTORCH=1 with the torch venv active (`cargo xtask` does this)");
    };
    let include = lib.join("../include");
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .file("shim/mt_shim.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        // The PyPI wheel's libtorch is built with the C++11 ABI (torch._C._GLIBCXX_USE_CXX11_ABI).
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        // Required: without NDEBUG, at::RecordFunction's layout differs from libtorch's.
        .define("NDEBUG", None)
        .flag("-O2")
        .flag("-fPIC")
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .warnings(false);
    // One compile, two products: a static archive linked into the collector and a shared
    // library that Python processes load after `import torch` (collector trace -- python ...).
    let objects = build.compile_intermediates();
    cc::Build::new().cpp(true).objects(&objects).compile("mt_shim");
    shared_shim(&build, &objects, &lib);
    println!("cargo:rustc-link-search=native={}", lib.display());
    // torch-sys's rpath does not reach the final link.
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    // rustc links with --as-needed, which would drop libtorch_cuda.so (CUDA then silently
    // unavailable, tch-rs issue 980).
    if lib.join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,-ltorch,--as-needed");
    }
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rustc-link-lib=dylib=stdc++");
}
