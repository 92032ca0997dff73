//! The MemoryTracer API's timeline JSON: `{"events": [...], "layer_stats": {...}, "summary": {...}}`.
//! Events are written one at a time, so a million-event trace never exists twice in memory.

use super::ExportError;
use crate::analysis::{layer_stats, summary};
use crate::model::Trace;
use std::io::Write;

pub fn write(trace: &Trace, out: impl Write) -> Result<(), ExportError> {
    let mut w = std::io::BufWriter::new(out);
    w.write_all(b"{\"events\":[")?;
    for (i, e) in trace.memory_events().enumerate() {
        if i > 0 {
            w.write_all(b",")?;
        }
        serde_json::to_writer(&mut w, &e)?;
    }
    w.write_all(b"],\"layer_stats\":")?;
    serde_json::to_writer(&mut w, &layer_stats(trace))?;
    w.write_all(b",\"summary\":")?;
    serde_json::to_writer(&mut w, &summary(trace))?;
    w.write_all(b"}\n")?;
    w.flush()?;
    Ok(())
}
