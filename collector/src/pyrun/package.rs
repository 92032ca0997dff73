//! The `memory_tracer` Python package as the collector carries it: its sources and (in builds
//! with libtorch) the shim as a shared library, written once into a cache folder that
//! `collector trace -- python ...` puts on PYTHONPATH.

use anyhow::Context;
use std::path::{Path, PathBuf};

macro_rules! py {
    ($($name:literal),* $(,)?) => {
        &[$(($name, include_str!(concat!("../../python/", $name)).as_bytes())),*]
    };
}

/// The package's files, relative to the folder that goes on PYTHONPATH.
pub const FILES: &[(&str, &[u8])] = py!(
    "memory_tracer/__init__.py",
    "memory_tracer/__main__.py",
    "memory_tracer/_auto.py",
    "memory_tracer/_capture.py",
    "memory_tracer/_shim.py",
    "memory_tracer/zoo.py",
    "memory_tracer/_bootstrap/sitecustomize.py",
);

/// The shim built against the collector's libtorch, when this build has it.
#[cfg(shim_so)]
pub const SHIM_SO: Option<&[u8]> = Some(include_bytes!(env!("MT_SHIM_SO")));
#[cfg(not(shim_so))]
pub const SHIM_SO: Option<&[u8]> = None;

/// Where the package's folder is: `$MEMORY_TRACER_PYTHONPATH` (an installed wheel, or a
/// checkout), else the embedded copy written under the cache folder.
pub fn python_path() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("MEMORY_TRACER_PYTHONPATH") {
        let dir = PathBuf::from(dir);
        if !dir.join("memory_tracer/_lib/libmt_shim.so").is_file() {
            anyhow::bail!(
                "MEMORY_TRACER_PYTHONPATH={} holds no memory_tracer/_lib/libmt_shim.so; expected the folder that contains the memory_tracer package",
                dir.display()
            );
        }
        return Ok(dir);
    }
    let Some(so) = SHIM_SO else {
        anyhow::bail!(
            "this collector was built without libtorch, so it carries no capture library; use a collector built with the `tracing` feature, or set MEMORY_TRACER_PYTHONPATH to an installed memory_tracer package's parent folder"
        );
    };
    materialize(&cache_root().join("python"), so)
}

fn cache_root() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("memory-tracer")
}

/// Writes the package (sources, shim, TORCH_VERSION) into `dir` (for wheels).
pub fn write_to(dir: &Path, so: &[u8]) -> anyhow::Result<()> {
    let write = |rel: &str, bytes: &[u8]| -> anyhow::Result<()> {
        let p = dir.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&p, bytes).with_context(|| format!("cannot write {}", p.display()))
    };
    for (name, bytes) in FILES {
        write(name, bytes)?;
    }
    write("memory_tracer/_lib/libmt_shim.so", so)?;
    write("memory_tracer/_lib/TORCH_VERSION", crate::TORCH_VERSION.as_bytes())
}

/// Writes the package into `root/<content hash>/` unless it is already there (a folder is
/// complete once renamed into place, so concurrent collectors never see half of one).
pub fn materialize(root: &Path, so: &[u8]) -> anyhow::Result<PathBuf> {
    use std::hash::Hasher;
    let mut hasher = shared::hash::FxHasher::default();
    for (name, bytes) in FILES {
        hasher.write(name.as_bytes());
        hasher.write(bytes);
    }
    hasher.write(so);
    hasher.write(crate::TORCH_VERSION.as_bytes());
    let h = hasher.finish();
    let dir = root.join(format!("{h:016x}"));
    if dir.join("memory_tracer/_lib/libmt_shim.so").is_file() {
        return Ok(dir);
    }
    std::fs::create_dir_all(root).with_context(|| format!("cannot create {}", root.display()))?;
    let tmp = root.join(format!(".tmp-{}-{h:016x}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    write_to(&tmp, so)?;
    match std::fs::rename(&tmp, &dir) {
        Ok(()) => Ok(dir),
        // Another collector put the same folder in place first.
        Err(_) if dir.join("memory_tracer/_lib/libmt_shim.so").is_file() => {
            let _ = std::fs::remove_dir_all(&tmp);
            Ok(dir)
        }
        Err(e) => Err(e).with_context(|| format!("cannot move {} into place", dir.display())),
    }
}
