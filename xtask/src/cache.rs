//! Where `cargo xtask` keeps what it installs and builds outside the clone
//! (`~/.cache/memory-tracer`), so that fresh clones reuse it.

use std::path::PathBuf;

/// The cache folder: `$XDG_CACHE_HOME/memory-tracer`, else `~/.cache/memory-tracer`.
pub fn cache_dir() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    base.join("memory-tracer")
}

/// The pinned torch's venv, which every build and test uses.
pub fn torch_venv() -> PathBuf {
    cache_dir().join("torch-venv")
}
