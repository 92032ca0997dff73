//! Layer statistics as CSV, one row per layer, sorted by name.

use super::ExportError;
use crate::analysis::layer_stats;
use crate::model::Trace;
use std::io::Write;

/// Quotes a CSV field when it holds a comma, quote or newline (RFC 4180).
pub fn field(s: &str) -> std::borrow::Cow<'_, str> {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\"")).into()
    } else {
        s.into()
    }
}

/// Writes `header` and one line per row through a buffer; `line` writes a row without its
/// newline.
pub fn write_rows<T, W: Write>(
    out: W,
    header: &str,
    rows: impl IntoIterator<Item = T>,
    mut line: impl FnMut(&mut std::io::BufWriter<W>, T) -> std::io::Result<()>,
) -> Result<(), ExportError> {
    let mut w = std::io::BufWriter::new(out);
    writeln!(w, "{header}")?;
    for row in rows {
        line(&mut w, row)?;
        writeln!(w)?;
    }
    w.flush()?;
    Ok(())
}

pub const LAYER_STATS_HEADER: &str =
    "layer_name,peak_allocated,peak_reserved,total_allocations,total_deallocations,avg_fragmentation,duration_ms";

pub fn write_layer_stats(trace: &Trace, out: impl Write) -> Result<(), ExportError> {
    write_rows(out, LAYER_STATS_HEADER, layer_stats(trace).values(), |w, s| {
        write!(
            w,
            "{},{},{},{},{},{:.6},{:.6}",
            field(&s.layer_name),
            s.peak_allocated,
            s.peak_reserved,
            s.total_allocations,
            s.total_deallocations,
            s.avg_fragmentation,
            s.duration_ms
        )
    })
}
