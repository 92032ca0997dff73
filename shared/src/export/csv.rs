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

pub const LAYER_STATS_HEADER: &str =
    "layer_name,peak_allocated,peak_reserved,total_allocations,total_deallocations,avg_fragmentation,duration_ms";

pub fn write_layer_stats(trace: &Trace, out: impl Write) -> Result<(), ExportError> {
    let mut w = std::io::BufWriter::new(out);
    writeln!(w, "{LAYER_STATS_HEADER}")?;
    for s in layer_stats(trace).values() {
        writeln!(
            w,
            "{},{},{},{},{},{:.6},{:.6}",
            field(&s.layer_name),
            s.peak_allocated,
            s.peak_reserved,
            s.total_allocations,
            s.total_deallocations,
            s.avg_fragmentation,
            s.duration_ms
        )?;
    }
    w.flush()?;
    Ok(())
}
