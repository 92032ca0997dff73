//! Trace files in and out: [`load_trace`] imports any supported format (read ahead on a thread),
//! [`write_export`] and [`write_atomic`] write so that a failed write never leaves a half-written
//! file, and [`parse_format`]/[`resolve_format`] name the export format.

use anyhow::{bail, Context};
use shared::export::{export, ExportFormat};
use shared::{ImportOptions, Trace};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Reads and imports a trace file of any supported format.
pub fn load_trace(path: &Path, options: &ImportOptions) -> anyhow::Result<Trace> {
    let file = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let file = crate::read_ahead::ReadAhead::new(file).context("cannot start a thread to read the file")?;
    shared::import::import_reader(file, options).with_context(|| format!("cannot import {}", path.display()))
}

/// `--format`'s value: an export format's name.
pub fn parse_format(name: &str) -> Result<ExportFormat, String> {
    ExportFormat::from_name(name).ok_or_else(|| {
        let names: Vec<&str> = ExportFormat::ALL.iter().map(|f| f.name()).collect();
        format!("unknown format '{name}'; expected one of: {}", names.join(", "))
    })
}

/// Picks the export format from `--format` or, failing that, from the output file name.
pub fn resolve_format(format: Option<ExportFormat>, out: &Path) -> anyhow::Result<ExportFormat> {
    let names: Vec<&str> = ExportFormat::ALL.iter().map(|f| f.name()).collect();
    if let Some(f) = format {
        return Ok(f);
    }
    let name = out.file_name().and_then(|n| n.to_str()).unwrap_or("");
    match ExportFormat::from_file_name(name) {
        Some((f, _)) => Ok(f),
        None => bail!("cannot tell the output format from '{}'; pass --format with one of: {}", out.display(), names.join(", ")),
    }
}

/// Writes `trace` to `out` atomically (see [`write_atomic`]); returns the bytes written.
pub fn write_export(trace: &Trace, format: ExportFormat, out: &Path) -> anyhow::Result<u64> {
    write_atomic(out, |w| export(trace, format, w).map_err(anyhow::Error::from))
}

/// Writes `out` atomically: a temporary file beside it, renamed into place, so a failed write
/// never leaves a half-written file or destroys an existing one (see [`write_atomic_via`]).
/// Returns the file's size.
pub fn write_atomic(out: &Path, write: impl FnOnce(&mut (dyn Write + Send)) -> anyhow::Result<()>) -> anyhow::Result<u64> {
    let dir = folder_of(out);
    let tmp = dir.join(format!(".{}.tmp-{}", out.file_name().and_then(|n| n.to_str()).unwrap_or("export"), std::process::id()));
    write_atomic_via(out, &tmp, write)
}

/// Writes `out` through the temporary file `tmp` (on `out`'s file system: a store keeps its
/// own, emptied on start): written, synced, renamed into place, and `out`'s folder synced, so
/// that once it returns the file is whole and survives a crash, and a failed write leaves
/// `out` as it was. Returns the file's size.
pub fn write_atomic_via(out: &Path, tmp: &Path, write: impl FnOnce(&mut (dyn Write + Send)) -> anyhow::Result<()>) -> anyhow::Result<u64> {
    let result = (|| -> anyhow::Result<u64> {
        let file = std::fs::File::create(tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
        let mut w = std::io::BufWriter::new(file);
        write(&mut w).with_context(|| format!("cannot write {}", out.display()))?;
        let file = w.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        let size = file.metadata()?.len();
        std::fs::rename(tmp, out).with_context(|| format!("cannot move the file into place at {}", out.display()))?;
        // The rename itself is durable once the folder is (where the platform can sync one).
        if let Ok(dir) = std::fs::File::open(folder_of(out)) {
            dir.sync_all().with_context(|| format!("cannot sync the folder of {}", out.display()))?;
        }
        Ok(size)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(tmp);
    }
    result
}

fn folder_of(out: &Path) -> &Path {
    out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// Adds `trace`'s TensorBoard event file to the log folder `dir` (created if missing) under a
/// name no other writer uses (`events.out.tfevents.<seconds>.<host>.memory-tracer.<pid>.<n>`),
/// created exclusively: the folder's other runs and event files are never overwritten.
/// Returns the file's path.
pub fn write_tensorboard_events(trace: &Trace, dir: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create the TensorBoard folder {}", dir.display()))?;
    let seconds = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map_or_else(|_| "localhost".to_owned(), |h| h.trim().to_owned());
    for n in 0..1000 {
        let path = dir.join(format!("events.out.tfevents.{seconds}.{host}.memory-tracer.{}.{n}", std::process::id()));
        let file = match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(|| format!("cannot create {}", path.display())),
        };
        let mut w = std::io::BufWriter::new(file);
        let written = export(trace, ExportFormat::Tensorboard, &mut w).map_err(anyhow::Error::from).and_then(|()| {
            let file = w.into_inner().map_err(|e| e.into_error())?;
            file.sync_all()?;
            Ok(())
        });
        if let Err(e) = written {
            let _ = std::fs::remove_file(&path);
            return Err(e).with_context(|| format!("cannot write {}", path.display()));
        }
        return Ok(path);
    }
    anyhow::bail!("cannot find a free event file name in {}", dir.display())
}
