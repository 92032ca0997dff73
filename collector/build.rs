//! Builds the C++ shim (`shim/mt_shim.cpp`) against the libtorch that `torch-sys` found, when
//! the `tracing` feature is on. See `../shared/NOTES-toolchain.md` for why each flag is here.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=shim/mt_shim.cpp");
    println!("cargo:rerun-if-changed=shim/mt_shim.h");
    if std::env::var_os("CARGO_FEATURE_TRACING").is_none() {
        return;
    }
    let Some(lib) = std::env::var_os("DEP_TCH_LIBTORCH_LIB").map(PathBuf::from) else {
        panic!("torch-sys did not report DEP_TCH_LIBTORCH_LIB; set LIBTORCH_USE_PYTORCH=1 with the torch venv active (`cargo xtask` does this)");
    };
    let include = lib.join("../include");
    cc::Build::new()
        .cpp(true)
        .file("shim/mt_shim.cpp")
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        // Required: without NDEBUG, at::RecordFunction's layout differs from libtorch's.
        .define("NDEBUG", None)
        .flag("-O2")
        .flag("-fPIC")
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .warnings(false)
        .compile("mt_shim");
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
