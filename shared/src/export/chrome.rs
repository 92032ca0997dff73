//! Chrome trace JSON that Perfetto and chrome://tracing open: a counter track of allocated and
//! reserved bytes per device (and per private pool), instant events for annotations and
//! allocator tags, and slices for layer scopes and operators per thread.

use super::ExportError;
use crate::analysis::nested_spans;
use crate::model::Trace;
use serde_json::json;
use std::io::Write;

const PID: u32 = 1;

pub fn write(trace: &Trace, out: impl Write) -> Result<(), ExportError> {
    let start = trace.start_ns();
    let us = |ns: u64| (ns - start) as f64 / 1000.0;
    let mut w = std::io::BufWriter::new(out);
    w.write_all(b"{\"displayTimeUnit\":\"ms\",\"traceEvents\":[")?;
    let mut first = true;
    let mut emit = |w: &mut std::io::BufWriter<_>, v: serde_json::Value| -> Result<(), ExportError> {
        if !first {
            w.write_all(b",\n")?;
        }
        first = false;
        serde_json::to_writer(&mut *w, &v)?;
        Ok(())
    };
    let title = trace.meta.model.clone().unwrap_or_else(|| "memory trace".into());
    emit(&mut w, json!({"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "args": {"name": title}}))?;
    let ev = &trace.events;
    let mut cursor = ev.cursor();
    for i in 0..ev.len() {
        let t = cursor.advance();
        let dev = trace.devices.get(ev.device[i] as usize).map(|d| d.to_string()).unwrap_or_default();
        emit(
            &mut w,
            json!({"ph": "C", "name": format!("memory {dev}"), "pid": PID, "tid": 0, "ts": us(ev.ts_ns[i]),
                   "args": {"allocated_bytes": t.allocated_bytes, "reserved_bytes": t.reserved_bytes}}),
        )?;
    }
    // Private pools: a counter track each, fed by their own events.
    if !trace.pools.is_empty() {
        let mut running: crate::hash::FastMap<(u8, u16), crate::model::Totals> = crate::hash::FastMap::default();
        for &(i, p) in &trace.event_pools {
            let i = i as usize;
            let t = running.entry((ev.device[i], p)).or_default();
            *t = t.after(ev.event_type(i), ev.size_bytes[i]);
            let dev = trace.devices.get(ev.device[i] as usize).map(|d| d.to_string()).unwrap_or_default();
            let pool = trace.pools.get(p as usize).map(|p| p.to_string()).unwrap_or_default();
            emit(
                &mut w,
                json!({"ph": "C", "name": format!("memory {dev} pool {pool}"), "pid": PID, "tid": 0, "ts": us(ev.ts_ns[i]),
                       "args": {"allocated_bytes": t.allocated_bytes, "reserved_bytes": t.reserved_bytes}}),
            )?;
        }
    }
    // Annotations and allocator tags, where they were attached (user metadata rides on every
    // event of its thread: the own format keeps it).
    for n in trace.event_notes.iter().filter(|n| n.kind != crate::model::NoteKind::UserMetadata) {
        let i = n.event as usize;
        let kind = if n.kind == crate::model::NoteKind::Annotation { "annotation" } else { "allocator" };
        emit(
            &mut w,
            json!({"ph": "i", "s": "p", "name": trace.str(n.text), "cat": kind, "pid": PID, "tid": 0, "ts": us(n.ts_ns.max(start)),
                   "args": {"address": format!("0x{:x}", ev.address[i]), "size_bytes": ev.size_bytes[i]}}),
        )?;
    }
    for (tid, spans) in nested_spans(trace) {
        emit(&mut w, json!({"ph": "M", "name": "thread_name", "pid": PID, "tid": tid, "args": {"name": format!("thread {tid}")}}))?;
        for s in spans {
            emit(
                &mut w,
                json!({"ph": "X", "name": trace.str(s.name), "pid": PID, "tid": tid, "ts": us(s.start_ns),
                       "dur": (s.end_ns - s.start_ns) as f64 / 1000.0}),
            )?;
        }
    }
    w.write_all(b"]}\n")?;
    w.flush()?;
    Ok(())
}
