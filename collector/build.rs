//! Embeds the viewer built into `dist/` (`cargo xtask viewer`) (`viewer_assets.rs`). The capture libraries
//! come from the `record` crate; the collector never links libtorch.

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
        "/// The viewer's files (name, bytes), from `dist/` at build time.\npub static VIEWER_ASSETS: &[(&str, &[u8])] = &[\n",
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

fn main() {
    embed_viewer();
}
