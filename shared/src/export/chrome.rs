//! Chrome trace JSON that Perfetto and chrome://tracing open: a counter track of allocated and
//! reserved bytes per device (and per private pool), instant events for annotations and
//! allocator tags, and slices for layer scopes and operators per thread.

use super::ExportError;
use crate::analysis::nested_spans;
use crate::model::Trace;
use serde::Serialize;
use std::borrow::Cow;
use std::io::Write;

const PID: u32 = 1;

/// One event of the Trace Event Format, with its fields in alphabetical order (as readers and
/// the goldens see them); absent ones are left out.
#[derive(Serialize)]
struct Event<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    args: Option<Args<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cat: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<f64>,
    name: Cow<'a, str>,
    ph: &'static str,
    pid: u32,
    /// An instant event's scope (`p`: the process).
    #[serde(skip_serializing_if = "Option::is_none")]
    s: Option<&'static str>,
    tid: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    ts: Option<f64>,
}

/// What an event carries in `args`.
#[derive(Serialize)]
#[serde(untagged)]
enum Args<'a> {
    /// A process or thread name (`M` events).
    Name { name: Cow<'a, str> },
    /// A memory counter (`C` events).
    Memory { allocated_bytes: u64, reserved_bytes: u64 },
    /// An annotation's allocation (`i` events).
    Block { address: String, size_bytes: u64 },
}

impl<'a> Event<'a> {
    fn new(ph: &'static str, name: impl Into<Cow<'a, str>>, tid: u64) -> Self {
        Event { args: None, cat: None, dur: None, name: name.into(), ph, pid: PID, s: None, tid, ts: None }
    }
}

pub fn write(trace: &Trace, out: impl Write) -> Result<(), ExportError> {
    let start = trace.start_ns();
    let us = |ns: u64| (ns - start) as f64 / 1000.0;
    let mut w = std::io::BufWriter::new(out);
    w.write_all(b"{\"displayTimeUnit\":\"ms\",\"traceEvents\":[")?;
    let mut first = true;
    let mut emit = |w: &mut std::io::BufWriter<_>, v: Event| -> Result<(), ExportError> {
        if !first {
            w.write_all(b",\n")?;
        }
        first = false;
        serde_json::to_writer(&mut *w, &v)?;
        Ok(())
    };
    let title = trace.meta.model.clone().unwrap_or_else(|| "memory trace".into());
    emit(&mut w, Event { args: Some(Args::Name { name: title.into() }), ..Event::new("M", "process_name", 0) })?;
    let ev = &trace.events;
    let mut cursor = ev.cursor();
    for i in 0..ev.len() {
        let t = cursor.advance();
        let dev = trace.devices.get(ev.device[i] as usize).map(|d| d.to_string()).unwrap_or_default();
        emit(
            &mut w,
            Event {
                args: Some(Args::Memory { allocated_bytes: t.allocated_bytes, reserved_bytes: t.reserved_bytes }),
                ts: Some(us(ev.ts_ns[i])),
                ..Event::new("C", format!("memory {dev}"), 0)
            },
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
                Event {
                    args: Some(Args::Memory { allocated_bytes: t.allocated_bytes, reserved_bytes: t.reserved_bytes }),
                    ts: Some(us(ev.ts_ns[i])),
                    ..Event::new("C", format!("memory {dev} pool {pool}"), 0)
                },
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
            Event {
                args: Some(Args::Block { address: format!("0x{:x}", ev.address[i]), size_bytes: ev.size_bytes[i] }),
                cat: Some(kind),
                s: Some("p"),
                ts: Some(us(n.ts_ns.max(start))),
                ..Event::new("i", trace.str(n.text), 0)
            },
        )?;
    }
    for (tid, spans) in nested_spans(trace) {
        emit(&mut w, Event { args: Some(Args::Name { name: format!("thread {tid}").into() }), ..Event::new("M", "thread_name", tid) })?;
        for s in spans {
            emit(
                &mut w,
                Event {
                    dur: Some((s.end_ns - s.start_ns) as f64 / 1000.0),
                    ts: Some(us(s.start_ns)),
                    ..Event::new("X", trace.str(s.name), tid)
                },
            )?;
        }
    }
    w.write_all(b"]}\n")?;
    w.flush()?;
    Ok(())
}
