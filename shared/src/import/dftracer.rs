//! Importer of DFTracer `.pfw` traces: JSON lines (optionally after a `[` line), Chrome-style
//! events whose strings are hashed through metadata events (`ph: "M"`, names `FH` file hash,
//! `HH` host hash, `SH` string hash, `PR` process; `args.name` is the string, `args.value` the
//! hash). DFTracer 2 writes `ph` as a number (1 = complete, 4 = metadata) and no `[` line.
//!
//! DFTracer records spans (I/O calls, `compute`/`fetch` steps of AI workloads), not allocator
//! events: complete events (`ph: "X"`) become scopes and operators named `cat:name`, with
//! hashed file names resolved into the name when present. A DFTracer trace therefore has
//! layer times but no memory events.

use super::ImportError;
use crate::model::{EventRecord, LayerScope, OperatorEvent, Phase, SourceFormat, StrId, Totals, Trace, TraceMeta};
use serde::Deserialize;
use std::collections::HashMap;
use std::io::BufRead;

/// True if `body` holds one JSON object per line (the `.pfw` layout) rather than one JSON
/// document: its first non-empty line is a complete object, not followed by a comma, and a
/// second object line follows.
pub fn looks_like_jsonl(body: &[u8]) -> bool {
    let mut lines = body.split(|&b| b == b'\n').map(|l| l.trim_ascii()).filter(|l| !l.is_empty());
    let (Some(a), Some(b)) = (lines.next(), lines.next()) else {
        return false;
    };
    let object = |l: &[u8]| l.starts_with(b"{") && l.ends_with(b"}");
    object(a) && object(b) && serde_json::from_slice::<serde::de::IgnoredAny>(a).is_ok()
}

#[derive(Deserialize)]
struct Line {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    cat: Option<String>,
    #[serde(default)]
    ph: Option<serde_json::Value>,
    #[serde(default)]
    tid: Option<serde_json::Value>,
    #[serde(default)]
    ts: Option<f64>,
    #[serde(default)]
    dur: Option<f64>,
    #[serde(default)]
    args: Option<serde_json::Map<String, serde_json::Value>>,
}

fn as_key(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn phase_of(cat: &str, name: &str) -> Phase {
    let n = name.to_ascii_lowercase();
    if n.contains("backward") {
        Phase::Backward
    } else if n.contains("optimizer") || n.contains("step") && cat.eq_ignore_ascii_case("pytorch") {
        Phase::Optimizer
    } else if n.contains("forward") {
        Phase::Forward
    } else {
        Phase::Other
    }
}

/// Longest file name appended to a span's label (`cat:name [file]`). Real paths are under
/// PATH_MAX (4096); a longer one is cut, so that one long hashed name referenced by every
/// span costs neither a copy per span nor quadratic time.
const MAX_FILE_LABEL_BYTES: usize = 4096;

/// Imports a DFTracer trace.
pub fn import(data: &[u8]) -> Result<Trace, ImportError> {
    import_reader(data)
}

/// Imports a DFTracer trace from a reader, one line at a time (gzip input streams through
/// here). I/O errors come back as [`ImportError::Read`].
pub fn import_reader(mut reader: impl BufRead) -> Result<Trace, ImportError> {
    let mut trace = Trace::new(TraceMeta::new(SourceFormat::Dftracer));
    let mut hashes: HashMap<String, String> = HashMap::new();
    let mut spans: Vec<(u64, u64, String, String, u64, Option<String>)> = Vec::new(); // start, end, cat, name, tid, fhash
    let mut raw = Vec::new();
    let mut own = OwnEvents::default();
    for i in 0.. {
        raw.clear();
        if reader.read_until(b'\n', &mut raw).map_err(|e| ImportError::Read { reason: e.to_string() })? == 0 {
            break;
        }
        let line_no = i + 1;
        let l = raw.trim_ascii();
        let l = l.strip_suffix(b",").unwrap_or(l);
        if l.is_empty() || l == b"[" || l == b"]" {
            continue;
        }
        let ev: Line = serde_json::from_slice(l)
            .map_err(|e| ImportError::Dftracer { line: line_no, reason: format!("expected one JSON event object per line: {e}") })?;
        let ph = match &ev.ph {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Number(n)) => n.to_string(),
            _ => String::new(),
        };
        let name = ev.name.clone().unwrap_or_default();
        let args = ev.args.as_ref();
        if matches!(ev.cat.as_deref(), Some("mt_memory" | "mt_layer" | "mt_op")) {
            own.line(&mut trace, &ev, &ph, line_no)?;
            continue;
        }
        // DFTracer 2 writes `ph` as a number: 1 = complete ("X"), 4 = metadata ("M").
        match ph.as_str() {
            "M" | "4" => {
                if let (Some(n), Some(v)) =
                    (args.and_then(|a| a.get("name")).and_then(|v| v.as_str()), args.and_then(|a| a.get("value")).and_then(as_key))
                {
                    if matches!(name.as_str(), "FH" | "HH" | "SH") {
                        hashes.insert(v, n.to_owned());
                    }
                }
            }
            "X" | "1" => {
                let ts =
                    ev.ts.ok_or_else(|| ImportError::Dftracer { line: line_no, reason: "a complete event (ph X) has no \"ts\"".into() })?;
                let start = (ts.max(0.0) * 1000.0).round() as u64;
                let end = start.saturating_add((ev.dur.unwrap_or(0.0).max(0.0) * 1000.0).round() as u64);
                let tid = ev.tid.as_ref().and_then(|t| t.as_u64()).unwrap_or(0);
                let fhash = args.and_then(|a| a.get("fhash")).and_then(as_key);
                spans.push((start, end, ev.cat.clone().unwrap_or_default(), name, tid, fhash));
            }
            _ => {}
        }
    }
    if spans.is_empty() && hashes.is_empty() && !own.seen {
        return Err(ImportError::Dftracer { line: 1, reason: "no DFTracer events (metadata or complete events) found".into() });
    }
    spans.sort_by_key(|s| (s.4, s.0, std::cmp::Reverse(s.1)));
    let mut depth_stack: Vec<u64> = Vec::new();
    let mut last_tid = None;
    for (start, end, cat, name, tid, fhash) in spans {
        if last_tid != Some(tid) {
            depth_stack.clear();
            last_tid = Some(tid);
        }
        while depth_stack.last().is_some_and(|&e| e <= start) {
            depth_stack.pop();
        }
        let mut label = if cat.is_empty() { name.clone() } else { format!("{cat}:{name}") };
        if let Some(file) = fhash.as_ref().and_then(|h| hashes.get(h)) {
            let mut cut = file.len().min(MAX_FILE_LABEL_BYTES);
            while !file.is_char_boundary(cut) {
                cut -= 1;
            }
            let more = if cut < file.len() { "…" } else { "" };
            label.push_str(&format!(" [{}{more}]", &file[..cut]));
        }
        let id = trace.strings.intern(&label);
        let phase = phase_of(&cat, &name);
        trace.scopes.push(LayerScope {
            name: id,
            start_ns: start,
            end_ns: end,
            depth: depth_stack.len().min(u16::MAX as usize) as u16,
            phase,
            thread: tid,
        });
        trace.ops.push(OperatorEvent {
            name: id,
            phase,
            seq_nr: -1,
            start_ns: start,
            end_ns: end,
            thread: tid,
            fwd_thread: 0,
            layer: StrId::NONE,
            inputs: (0, 0),
            outputs: (0, 0),
        });
        depth_stack.push(end);
    }
    trace.scopes.sort_by_key(|s| (s.start_ns, std::cmp::Reverse(s.end_ns)));
    trace.ops.sort_by_key(|o| (o.start_ns, std::cmp::Reverse(o.end_ns)));
    trace.finish();
    Ok(trace)
}

/// Reads the events Memory Tracer's own DFTracer export writes ([`crate::export::dftracer`]):
/// devices and metadata, memory events, layer scopes and operators, with exact times.
#[derive(Default)]
struct OwnEvents {
    seen: bool,
    streams: HashMap<String, u16>,
}

fn phase_named(name: Option<&str>) -> Phase {
    match name {
        Some("forward") => Phase::Forward,
        Some("backward") => Phase::Backward,
        Some("optimizer") => Phase::Optimizer,
        _ => Phase::Other,
    }
}

impl OwnEvents {
    fn line(&mut self, trace: &mut Trace, ev: &Line, ph: &str, line: usize) -> Result<(), ImportError> {
        self.seen = true;
        let bad = |reason: String| ImportError::Dftracer { line, reason };
        let empty = serde_json::Map::new();
        let args = ev.args.as_ref().unwrap_or(&empty);
        let num = |key: &str| args.get(key).and_then(|v| v.as_u64());
        let text = |key: &str| args.get(key).and_then(|v| v.as_str());
        let name = ev.name.as_deref().unwrap_or_default();
        match (ev.cat.as_deref(), ph) {
            (Some("mt_memory"), "M" | "4") if name == "mt_meta" => {
                let meta = args.get("value").cloned().ok_or_else(|| bad("mt_meta has no \"value\"".into()))?;
                trace.meta = serde_json::from_value(meta).map_err(|e| bad(format!("mt_meta: expected the trace's metadata: {e}")))?;
            }
            (Some("mt_memory"), "M" | "4") if name == "mt_device" => {
                let kind = text("kind").ok_or_else(|| bad("mt_device has no \"kind\"".into()))?;
                let index = args.get("index").and_then(|v| v.as_i64()).unwrap_or(-1).clamp(i32::MIN as i64, i32::MAX as i64) as i32;
                let rank = num("rank").and_then(|r| u32::try_from(r).ok());
                if trace.devices.len() >= 256 {
                    return Err(bad("more than 256 devices".into()));
                }
                let d = trace.device_index(crate::model::Device { kind: kind.to_owned(), index, rank });
                trace.events.set_base_totals(
                    d as usize,
                    Totals { allocated_bytes: num("allocated").unwrap_or(0), reserved_bytes: num("reserved").unwrap_or(0) },
                );
            }
            (Some("mt_memory"), "X" | "1") => {
                let event_type = crate::export::dftracer::event_type(name).ok_or_else(|| bad(format!("unknown memory event '{name}'")))?;
                let device = ev.tid.as_ref().and_then(|t| t.as_u64()).filter(|&d| (d as usize) < trace.devices.len());
                let device = device.ok_or_else(|| bad("a memory event's tid names no device of an earlier mt_device line".into()))? as u8;
                let stream = match text("stream") {
                    Some(s) => match self.streams.get(s) {
                        Some(&i) => i,
                        None => {
                            if trace.streams.len() > u16::MAX as usize {
                                return Err(bad("more than 65536 streams".into()));
                            }
                            let i = trace.stream_index(s);
                            self.streams.insert(s.to_owned(), i);
                            i
                        }
                    },
                    None => 0,
                };
                let layer = text("layer").map_or(StrId::NONE, |l| trace.strings.intern(l));
                let totals = match (num("allocated"), num("reserved")) {
                    (Some(a), Some(r)) => Some(Totals { allocated_bytes: a, reserved_bytes: r }),
                    _ => None,
                };
                trace.events.push(EventRecord {
                    ts_ns: num("ts_ns").unwrap_or_else(|| (ev.ts.unwrap_or(0.0).max(0.0) * 1000.0) as u64),
                    event_type,
                    phase: phase_named(text("phase")),
                    size_bytes: num("size").unwrap_or(0),
                    address: num("addr").unwrap_or(0),
                    layer,
                    device,
                    stream,
                    totals,
                });
            }
            (Some("mt_layer" | "mt_op"), "X" | "1") => {
                let start = num("ts_ns").unwrap_or_else(|| (ev.ts.unwrap_or(0.0).max(0.0) * 1000.0) as u64);
                let end = num("end_ns").unwrap_or_else(|| start.saturating_add((ev.dur.unwrap_or(0.0).max(0.0) * 1000.0) as u64));
                let thread = ev.tid.as_ref().and_then(|t| t.as_u64()).unwrap_or(0);
                let id = trace.strings.intern(name);
                let phase = phase_named(text("phase"));
                if ev.cat.as_deref() == Some("mt_layer") {
                    let depth = num("depth").unwrap_or(0).min(u16::MAX as u64) as u16;
                    trace.scopes.push(LayerScope { name: id, start_ns: start, end_ns: end.max(start), depth, phase, thread });
                } else {
                    let layer = text("layer").map_or(StrId::NONE, |l| trace.strings.intern(l));
                    trace.ops.push(OperatorEvent {
                        name: id,
                        phase,
                        seq_nr: args.get("seq_nr").and_then(|v| v.as_i64()).unwrap_or(-1),
                        start_ns: start,
                        end_ns: end.max(start),
                        thread,
                        fwd_thread: num("fwd_thread").unwrap_or(0),
                        layer,
                        inputs: (0, 0),
                        outputs: (0, 0),
                    });
                }
            }
            _ => {}
        }
        Ok(())
    }
}
