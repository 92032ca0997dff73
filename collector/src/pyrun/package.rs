//! The `memory_tracer` Python package as the collector carries it: its sources, the capture
//! library for every torch release this build has one for (`record::CAPTURES`, one folder per
//! minor version under `memory_tracer/_lib/`), the list of supported releases and the shim's
//! sources for building it on first use (`memory_tracer/_src/`), written once into a cache
//! folder that `collector trace -- python ...` puts on PYTHONPATH.

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
    "memory_tracer/_allocator.py",
    "memory_tracer/_frames.py",
    "memory_tracer/_ledger.py",
    "memory_tracer/_auto.py",
    "memory_tracer/_build.py",
    "memory_tracer/_capture.py",
    "memory_tracer/_compiled.py",
    "memory_tracer/_device.py",
    "memory_tracer/_holders.py",
    "memory_tracer/_hooks.py",
    "memory_tracer/_notebook.py",
    "memory_tracer/_history.py",
    "memory_tracer/_scopes.py",
    "memory_tracer/_shim.py",
    "memory_tracer/_tracer.py",
    "memory_tracer/pytest_plugin.py",
    "memory_tracer/zoo.py",
    "memory_tracer/_bootstrap/sitecustomize.py",
);

/// Where the package's folder is: `$MEMORY_TRACER_PYTHONPATH` (an installed wheel, or a
/// checkout), else the embedded copy written under the cache folder.
pub fn python_path() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("MEMORY_TRACER_PYTHONPATH") {
        let dir = PathBuf::from(dir);
        if !dir.join(COMPLETE).is_file() {
            anyhow::bail!(
                "MEMORY_TRACER_PYTHONPATH={} holds no {COMPLETE}; expected the folder that contains the memory_tracer package",
                dir.display()
            );
        }
        return Ok(dir);
    }
    materialize(&cache_root().join("python"))
}

fn cache_root() -> PathBuf {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("memory-tracer")
}

/// The file written last: a package folder holding it is complete.
const COMPLETE: &str = "memory_tracer/_lib/SUPPORTED";

/// Writes the package into `dir` (for wheels): sources, `_lib/<minor>/libmt_shim.so` and
/// `_lib/<minor>/TORCH_VERSION` per carried capture, `_src/` (the shim's sources) and, last,
/// `_lib/SUPPORTED` (the supported releases, one per line).
pub fn write_to(dir: &Path) -> anyhow::Result<()> {
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
    for capture in record::CAPTURES {
        write(&format!("memory_tracer/_lib/{}/libmt_shim.so", capture.minor), capture.library)?;
        write(&format!("memory_tracer/_lib/{}/TORCH_VERSION", capture.minor), capture.torch.as_bytes())?;
    }
    for (name, bytes) in record::SHIM_SOURCES {
        write(&format!("memory_tracer/_src/{name}"), bytes)?;
    }
    let supported: String = record::supported_versions().map(|v| format!("{v}\n")).collect();
    write(COMPLETE, supported.as_bytes())
}

/// Writes the package into `root/<content hash>/` unless it is already there (a folder is
/// complete once renamed into place, so concurrent collectors never see half of one).
pub fn materialize(root: &Path) -> anyhow::Result<PathBuf> {
    use std::hash::Hasher;
    let mut hasher = shared::hash::FxHasher::default();
    for (name, bytes) in FILES {
        hasher.write(name.as_bytes());
        hasher.write(bytes);
    }
    for capture in record::CAPTURES {
        hasher.write(capture.torch.as_bytes());
        hasher.write(capture.library);
    }
    for (name, bytes) in record::SHIM_SOURCES {
        hasher.write(name.as_bytes());
        hasher.write(bytes);
    }
    record::supported_versions().for_each(|v| hasher.write(v.as_bytes()));
    let h = hasher.finish();
    let dir = root.join(format!("{h:016x}"));
    if dir.join(COMPLETE).is_file() {
        return Ok(dir);
    }
    std::fs::create_dir_all(root).with_context(|| format!("cannot create {}", root.display()))?;
    let tmp = root.join(format!(".tmp-{}-{h:016x}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    write_to(&tmp)?;
    match std::fs::rename(&tmp, &dir) {
        Ok(()) => Ok(dir),
        // Another collector put the same folder in place first.
        Err(_) if dir.join(COMPLETE).is_file() => {
            let _ = std::fs::remove_dir_all(&tmp);
            Ok(dir)
        }
        Err(e) => Err(e).with_context(|| format!("cannot move {} into place", dir.display())),
    }
}

#[cfg(test)]
mod tests {
    /// Every Python file of the package's folder is carried: one left out breaks the import of
    /// those that use it, and only where the carried copy runs (`collector trace`, not a checkout).
    #[test]
    fn every_python_file_of_the_package_is_carried() {
        fn walk(dir: &std::path::Path, base: &std::path::Path, out: &mut Vec<String>) {
            for e in std::fs::read_dir(dir).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, base, out);
                } else if p.extension().is_some_and(|x| x == "py") {
                    out.push(p.strip_prefix(base).unwrap().to_string_lossy().replace('\\', "/"));
                }
            }
        }
        let base = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("python");
        let mut found = Vec::new();
        walk(&base.join("memory_tracer"), &base, &mut found);
        found.sort();
        let mut carried: Vec<String> = super::FILES.iter().map(|(n, _)| (*n).to_owned()).collect();
        carried.sort();
        assert_eq!(found, carried, "collector/src/pyrun/package.rs's FILES against collector/python/");
    }
}
