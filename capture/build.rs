//! Links the C++ shim archive that the record crate compiled (`DEP_MT_SHIM_ARCHIVE_DIR`, from its
//! `links = "mt_shim"` metadata) and the libtorch it was compiled against, which torch-sys also
//! links for tch.

use std::path::PathBuf;

fn main() {
    let dir = |key: &str| -> PathBuf {
        std::env::var_os(key)
            .map(PathBuf::from)
            .unwrap_or_else(|| panic!("{key} is not set: the record crate must be built with its archive feature (libtorch)"))
    };
    let archive = dir("DEP_MT_SHIM_ARCHIVE_DIR");
    let lib = dir("DEP_TCH_LIBTORCH_LIB");
    println!("cargo:rustc-link-search=native={}", archive.display());
    println!("cargo:rustc-link-lib=static=mt_shim");
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
