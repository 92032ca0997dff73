//! Memory Tracer's own trace format: JSON with a format tag and a version.
//!
//! Compatibility rule: `version` is bumped only when a field changes meaning or is removed.
//! A reader accepts every version up to its own ([`FORMAT_VERSION`]) and ignores unknown
//! fields, so adding a field never bumps the version; a file from a newer version is refused
//! with a message naming both versions. Events are stored as columns, as in memory.

use super::ImportError;
use crate::model::{EventType, Phase, StrId, Trace};

pub use crate::export::native::{FORMAT_TAG, FORMAT_VERSION};

/// The file's top-level object, read in one pass: `format` and `version` (written first) are
/// checked before `trace` is parsed, so that a newer file is refused by version and not by the
/// first field this build does not know.
struct FileVisitor<'a> {
    refused: &'a mut Option<ImportError>,
}

impl<'de> serde::de::Visitor<'de> for FileVisitor<'_> {
    type Value = Trace;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a Memory Tracer trace: an object with format, version and trace")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Trace, A::Error> {
        use serde::de::Error;
        let (mut format, mut version, mut trace) = (None::<String>, None::<u32>, None::<Trace>);
        let check = |format: &Option<String>, version: Option<u32>| -> Option<ImportError> {
            if let Some(format) = format.as_deref().filter(|f| *f != FORMAT_TAG) {
                return Some(bad("format", format!("expected \"{FORMAT_TAG}\", found \"{format}\"")));
            }
            match version {
                Some(v) if v > FORMAT_VERSION || v == 0 => Some(ImportError::UnsupportedVersion { found: v, supported: FORMAT_VERSION }),
                _ => None,
            }
        };
        while let Some(key) = map.next_key::<std::borrow::Cow<str>>()? {
            match key.as_ref() {
                "format" => format = Some(map.next_value()?),
                "version" => version = Some(map.next_value()?),
                "trace" => {
                    if let Some(e) = check(&format, version) {
                        *self.refused = Some(e);
                        return Err(A::Error::custom("refused"));
                    }
                    trace = Some(map.next_value()?);
                }
                _ => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        if let Some(e) = check(&format, version) {
            *self.refused = Some(e);
            return Err(A::Error::custom("refused"));
        }
        if format.is_none() {
            return Err(A::Error::missing_field("format"));
        }
        if version.is_none() {
            return Err(A::Error::missing_field("version"));
        }
        trace.ok_or_else(|| A::Error::missing_field("trace"))
    }
}

/// Imports a trace written by [`crate::export::native`].
pub fn import(data: &[u8]) -> Result<Trace, ImportError> {
    import_from(&mut serde_json::Deserializer::from_slice(data))
}

/// Imports a trace written by [`crate::export::native`], read from `reader` in one pass.
pub fn import_reader(reader: impl std::io::Read) -> Result<Trace, ImportError> {
    import_from(&mut serde_json::Deserializer::from_reader(reader))
}

fn import_from<'de, R: serde_json::de::Read<'de>>(de: &mut serde_json::Deserializer<R>) -> Result<Trace, ImportError> {
    use serde::Deserializer as _;
    let mut refused = None;
    let parsed = de.deserialize_map(FileVisitor { refused: &mut refused }).and_then(|t| de.end().map(|()| t));
    let mut trace = match parsed {
        Ok(t) => t,
        Err(_) if refused.is_some() => return Err(refused.take().unwrap_or(ImportError::Empty)),
        Err(e) if e.is_syntax() || e.is_eof() => return Err(ImportError::json(&e)),
        Err(e) => return Err(ImportError::Native { path: format!("line {} column {}", e.line(), e.column()), reason: e.to_string() }),
    };
    validate(&trace)?;
    trace.events.rebuild_index();
    Ok(trace)
}

fn bad(path: impl Into<String>, reason: impl Into<String>) -> ImportError {
    ImportError::Native { path: path.into(), reason: reason.into() }
}

/// Checks every cross-reference, so that analyses can index without checks.
fn validate(t: &Trace) -> Result<(), ImportError> {
    validate_events(t)?;
    validate_records(t)?;
    validate_stacks_and_notes(t)
}

/// The event columns: equal lengths, order, codes, devices, streams and strings.
fn validate_events(t: &Trace) -> Result<(), ImportError> {
    let e = &t.events;
    let n = e.ts_ns.len();
    for (name, len) in [
        ("size_bytes", e.size_bytes.len()),
        ("address", e.address.len()),
        ("layer", e.layer.len()),
        ("tag", e.tag.len()),
        ("device", e.device.len()),
        ("stream", e.stream.len()),
    ] {
        if len != n {
            return Err(bad(format!("trace.events.{name}"), format!("expected {n} entries like ts_ns, found {len}")));
        }
    }
    if n > u32::MAX as usize {
        return Err(bad("trace.events", "more than 2^32 events"));
    }
    if t.devices.len() > 256 {
        return Err(bad("trace.devices", format!("at most 256 devices, found {}", t.devices.len())));
    }
    if e.base_totals.len() != t.devices.len() {
        return Err(bad(
            "trace.events.base_totals",
            format!("expected one entry per device ({}), found {}", t.devices.len(), e.base_totals.len()),
        ));
    }
    let strings = t.strings.len();
    let str_ok = |id: StrId| id.is_none() || (id.0 as usize) < strings;
    for i in 0..n {
        if i > 0 && e.ts_ns[i] < e.ts_ns[i - 1] {
            return Err(bad(format!("trace.events.ts_ns[{i}]"), "timestamps must not decrease"));
        }
        let tag = e.tag[i];
        if EventType::from_u8(tag & 0x1f).is_none() || Phase::from_u8(tag >> 5).is_none() {
            return Err(bad(format!("trace.events.tag[{i}]"), format!("unknown event type/phase code {tag}")));
        }
        if e.device[i] as usize >= t.devices.len() {
            return Err(bad(format!("trace.events.device[{i}]"), format!("device {} is not in trace.devices", e.device[i])));
        }
        if e.stream[i] as usize >= t.streams.len() {
            return Err(bad(format!("trace.events.stream[{i}]"), format!("stream {} is not in trace.streams", e.stream[i])));
        }
        if !str_ok(e.layer[i]) {
            return Err(bad(format!("trace.events.layer[{i}]"), format!("string {} does not exist", e.layer[i].0)));
        }
    }
    for (k, o) in e.overrides.iter().enumerate() {
        if o.index as usize >= n || (k > 0 && o.index <= e.overrides[k - 1].index) {
            return Err(bad(format!("trace.events.overrides[{k}]"), "indices must be increasing event indices"));
        }
    }
    Ok(())
}

/// Streams, operators, tensors, scopes, segments, iterations, marks and device samples.
fn validate_records(t: &Trace) -> Result<(), ImportError> {
    let strings = t.strings.len();
    let str_ok = |id: StrId| id.is_none() || (id.0 as usize) < strings;
    for (k, s) in t.streams.iter().enumerate() {
        if !str_ok(*s) || s.is_none() {
            return Err(bad(format!("trace.streams[{k}]"), "not a string id"));
        }
    }
    let tensors = t.tensors.len() as u32;
    for (k, op) in t.ops.iter().enumerate() {
        let range_ok = |(a, b): (u32, u32)| a <= b && b <= tensors;
        if !str_ok(op.name) || !str_ok(op.layer) || !range_ok(op.inputs) || !range_ok(op.outputs) || op.end_ns < op.start_ns {
            return Err(bad(format!("trace.ops[{k}]"), "name, layer, tensor ranges or times are out of range"));
        }
    }
    for (k, tr) in t.tensors.iter().enumerate() {
        if tr.shape != u32::MAX && tr.shape as usize >= t.shapes.len() {
            return Err(bad(format!("trace.tensors[{k}].shape"), "shape index out of range"));
        }
    }
    for (k, s) in t.scopes.iter().enumerate() {
        if !str_ok(s.name) || s.end_ns < s.start_ns {
            return Err(bad(format!("trace.scopes[{k}]"), "name out of range or end before start"));
        }
    }
    for (k, s) in t.initial_segments.iter().enumerate() {
        if s.device as usize >= t.devices.len() {
            return Err(bad(format!("trace.initial_segments[{k}].device"), "device out of range"));
        }
        if s.private_pool.is_some_and(|p| p as usize >= t.pools.len()) {
            return Err(bad(format!("trace.initial_segments[{k}].private_pool"), "pool index out of range of trace.pools"));
        }
    }
    for (k, it) in t.iterations.iter().enumerate() {
        if it.end_ns < it.start_ns {
            return Err(bad(format!("trace.iterations[{k}]"), "end before start"));
        }
    }
    for (k, m) in t.marks.iter().enumerate() {
        if !str_ok(m.name) {
            return Err(bad(format!("trace.marks[{k}].name"), "string id out of range"));
        }
    }
    for (k, s) in t.device_samples.iter().enumerate() {
        if s.device as usize >= t.devices.len() {
            return Err(bad(format!("trace.device_samples[{k}].device"), "device out of range"));
        }
    }
    Ok(())
}

/// Stacks, and the events' pools and notes.
fn validate_stacks_and_notes(t: &Trace) -> Result<(), ImportError> {
    let n = t.events.ts_ns.len();
    let strings = t.strings.len();
    let str_ok = |id: StrId| id.is_none() || (id.0 as usize) < strings;
    let st = &t.stacks;
    for (k, f) in st.frames.iter().enumerate() {
        if !str_ok(f.name) || !str_ok(f.filename) {
            return Err(bad(format!("trace.stacks.frames[{k}]"), "string id out of range"));
        }
    }
    for (k, &(a, b)) in st.stacks.iter().enumerate() {
        if a > b || b as usize > st.frame_ids.len() {
            return Err(bad(format!("trace.stacks.stacks[{k}]"), "range out of bounds"));
        }
    }
    if let Some(k) = st.frame_ids.iter().position(|&f| f as usize >= st.frames.len()) {
        return Err(bad(format!("trace.stacks.frame_ids[{k}]"), "frame index out of range"));
    }
    for (k, &(ev, s)) in st.event_stacks.iter().enumerate() {
        if ev as usize >= n || s as usize >= st.stacks.len() || (k > 0 && ev <= st.event_stacks[k - 1].0) {
            return Err(bad(format!("trace.stacks.event_stacks[{k}]"), "event or stack index out of range or unsorted"));
        }
    }
    for (k, &(ev, p)) in t.event_pools.iter().enumerate() {
        if ev as usize >= n || p as usize >= t.pools.len() || (k > 0 && ev <= t.event_pools[k - 1].0) {
            return Err(bad(format!("trace.event_pools[{k}]"), "expected increasing event indices and pools of trace.pools"));
        }
    }
    for (k, &(ev, bytes)) in t.event_requested.iter().enumerate() {
        let i = ev as usize;
        if i >= n || (k > 0 && ev <= t.event_requested[k - 1].0) {
            return Err(bad(format!("trace.event_requested[{k}]"), "expected increasing event indices within trace.events"));
        }
        if t.events.event_type(i) != EventType::Alloc || bytes == 0 || bytes > t.events.size_bytes[i] {
            return Err(bad(
                format!("trace.event_requested[{k}]"),
                format!("expected an alloc event and a request of 1 to {} bytes (its block)", t.events.size_bytes[i]),
            ));
        }
    }
    for (k, h) in t.event_holders.iter().enumerate() {
        let i = h.event as usize;
        let key = |h: &crate::model::EventHolder| (h.event, h.taken_ns);
        if i >= n || t.events.event_type(i) != EventType::Alloc || (k > 0 && key(h) < key(&t.event_holders[k - 1])) {
            return Err(bad(
                format!("trace.event_holders[{k}].event"),
                "expected alloc events of trace.events, in order of event and taken_ns",
            ));
        }
        if !str_ok(h.name) || !str_ok(h.module) || h.released_ns.is_some_and(|r| r < h.taken_ns) {
            return Err(bad(
                format!("trace.event_holders[{k}]"),
                "expected names within trace.strings and released_ns not before taken_ns",
            ));
        }
    }
    for (k, note) in t.event_notes.iter().enumerate() {
        if note.event as usize >= n || (k > 0 && note.event < t.event_notes[k - 1].event) {
            return Err(bad(format!("trace.event_notes[{k}].event"), "expected event indices in order, within trace.events"));
        }
        if note.text.is_none() || !str_ok(note.text) || note.stack.is_some_and(|s| s as usize >= st.stacks.len()) {
            return Err(bad(format!("trace.event_notes[{k}]"), "text or stack out of range"));
        }
    }
    Ok(())
}
