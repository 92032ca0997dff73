//! DFTracer `.pfw.gz` export: one JSON event per line, as DFTracer 2 writes them (`ph` 1 for
//! a complete event, 4 for metadata; `ts` and `dur` in integer microseconds), compressed as a
//! series of independent gzip members of about [`CHUNK_BYTES`] each, so that DFTracer's
//! indexers (and any gzip reader) can seek to a chunk without inflating what precedes it.
//!
//! What it holds, in categories of its own so that [`crate::import::dftracer`] reads it back:
//! - `mt_device` metadata: each device (`kind`, `index`, `rank`) with the memory it held
//!   before the first event, in the trace's device order; `mt_meta`: the trace's metadata.
//! - `mt_memory` complete events of zero duration: every memory event, named by its type
//!   (`alloc`, `free`, ...), `tid` its device's position, with size, address, stream, layer,
//!   phase, and the allocated and reserved totals after it.
//! - `mt_layer` and `mt_op` complete events: layer scopes and operators on their threads.
//!
//! Every event carries its exact nanosecond times in `args` (`ts_ns`, `end_ns`): integer
//! microseconds are what other DFTracer readers expect, and would round ours.

use super::ExportError;
use crate::model::{EventType, Trace};
use serde_json::json;
use std::io::Write;

/// Uncompressed bytes per gzip member.
pub const CHUNK_BYTES: usize = 1 << 20;

/// Lines into independent gzip members.
struct Chunked<W: Write> {
    out: W,
    line: Vec<u8>,
    chunk: Vec<u8>,
    chunk_bytes: usize,
}

impl<W: Write> Chunked<W> {
    fn event(&mut self, v: &serde_json::Value) -> Result<(), ExportError> {
        self.line.clear();
        serde_json::to_writer(&mut self.line, v)?;
        self.line.push(b'\n');
        self.chunk.extend_from_slice(&self.line);
        if self.chunk.len() >= self.chunk_bytes {
            self.flush_chunk()?;
        }
        Ok(())
    }

    fn flush_chunk(&mut self) -> Result<(), ExportError> {
        if self.chunk.is_empty() {
            return Ok(());
        }
        let mut gz = flate2::write::GzEncoder::new(&mut self.out, flate2::Compression::default());
        gz.write_all(&self.chunk)?;
        gz.finish()?;
        self.chunk.clear();
        Ok(())
    }
}

pub fn write(trace: &Trace, out: impl Write) -> Result<(), ExportError> {
    write_chunked(trace, out, CHUNK_BYTES)
}

/// [`write`] with gzip members of about `chunk_bytes` uncompressed bytes.
pub fn write_chunked(trace: &Trace, out: impl Write, chunk_bytes: usize) -> Result<(), ExportError> {
    let mut w = Chunked { out, line: Vec::new(), chunk: Vec::with_capacity(chunk_bytes.min(CHUNK_BYTES) + 4096), chunk_bytes };
    let us = |ns: u64| ns / 1000;
    w.event(&json!({"name": "mt_meta", "cat": "mt_memory", "pid": 0, "tid": 0, "ph": 4, "args": {"name": "meta", "value": trace.meta}}))?;
    for (d, dev) in trace.devices.iter().enumerate() {
        let base = trace.events.base_totals.get(d).copied().unwrap_or_default();
        w.event(&json!({"name": "mt_device", "cat": "mt_memory", "pid": 0, "tid": d, "ph": 4,
            "args": {"name": dev.to_string(), "value": d, "kind": dev.kind, "index": dev.index, "rank": dev.rank,
                     "allocated": base.allocated_bytes, "reserved": base.reserved_bytes}}))?;
    }
    let ev = &trace.events;
    let mut cursor = ev.cursor();
    let mut id = 0u64;
    for i in 0..ev.len() {
        let t = cursor.advance();
        let rec = ev.record(i);
        id += 1;
        let mut args = json!({"ts_ns": rec.ts_ns, "size": rec.size_bytes, "addr": rec.address,
            "allocated": t.allocated_bytes, "reserved": t.reserved_bytes, "phase": rec.phase.as_str()});
        if let Some(stream) = trace.streams.get(rec.stream as usize) {
            args["stream"] = json!(trace.str(*stream));
        }
        if !rec.layer.is_none() {
            args["layer"] = json!(trace.str(rec.layer));
        }
        w.event(&json!({"id": id, "name": rec.event_type.as_str(), "cat": "mt_memory", "pid": 0, "tid": rec.device,
            "ts": us(rec.ts_ns), "dur": 0, "ph": 1, "args": args}))?;
    }
    for s in &trace.scopes {
        id += 1;
        w.event(&json!({"id": id, "name": trace.str(s.name), "cat": "mt_layer", "pid": 0, "tid": s.thread,
            "ts": us(s.start_ns), "dur": us(s.end_ns.saturating_sub(s.start_ns)), "ph": 1,
            "args": {"ts_ns": s.start_ns, "end_ns": s.end_ns, "depth": s.depth, "phase": s.phase.as_str()}}))?;
    }
    for o in &trace.ops {
        id += 1;
        let mut args = json!({"ts_ns": o.start_ns, "end_ns": o.end_ns, "phase": o.phase.as_str(), "seq_nr": o.seq_nr,
            "fwd_thread": o.fwd_thread});
        if !o.layer.is_none() {
            args["layer"] = json!(trace.str(o.layer));
        }
        w.event(&json!({"id": id, "name": trace.str(o.name), "cat": "mt_op", "pid": 0, "tid": o.thread,
            "ts": us(o.start_ns), "dur": us(o.end_ns.saturating_sub(o.start_ns)), "ph": 1, "args": args}))?;
    }
    w.flush_chunk()?;
    w.out.flush()?;
    Ok(())
}

/// The event types by the names [`write`] gives them.
pub fn event_type(name: &str) -> Option<EventType> {
    EventType::ALL.into_iter().find(|t| t.as_str() == name)
}
