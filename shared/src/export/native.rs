//! Writes Memory Tracer's own format (see [`crate::import::native`] for the compatibility rule).

use super::ExportError;
use crate::model::Trace;
use serde::Serialize;
use std::io::Write;

/// Value of the `format` field.
pub const FORMAT_TAG: &str = "memory-tracer";
/// The version this build writes and the newest it reads.
pub const FORMAT_VERSION: u32 = 1;

#[derive(Serialize)]
struct File<'a> {
    // `format` first: format detection looks for it at the start of the file.
    format: &'static str,
    version: u32,
    trace: &'a Trace,
}

pub fn write(trace: &Trace, mut out: impl Write) -> Result<(), ExportError> {
    let mut w = std::io::BufWriter::new(&mut out);
    serde_json::to_writer(&mut w, &File { format: FORMAT_TAG, version: FORMAT_VERSION, trace })?;
    w.write_all(b"\n")?;
    w.flush()?;
    Ok(())
}
