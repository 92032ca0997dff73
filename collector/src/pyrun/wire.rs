//! The stream a shim inside a Python process writes to the collector (`mt_stream_open`):
//! frames of `u32 kind, u32 length` (little endian) and a payload. Every frame is checked
//! (kind, length, record size, string ids in order), so a broken or hostile peer gets an error
//! naming the frame, never a panic or an unbounded allocation.

use protocol::frames::{End, Hello, Note};
use record::{MtHolder, MtRecord};
use std::io::{ErrorKind, Read};

pub use record::{FRAME_END, FRAME_HELLO, FRAME_HOLDERS, FRAME_NOTE, FRAME_RECORDS, FRAME_STRINGS};

/// The largest frame accepted (the shim sends at most 16384 records, 896 KiB, per frame).
pub const MAX_FRAME_BYTES: usize = 64 << 20;
const RECORD_BYTES: usize = std::mem::size_of::<MtRecord>();
const HOLDER_BYTES: usize = std::mem::size_of::<MtHolder>();

/// Everything one process sent.
#[derive(Debug, Default)]
pub struct ProcessStream {
    pub hello: Option<Hello>,
    pub end: Option<End>,
    pub notes: Vec<Note>,
    pub records: Vec<MtRecord>,
    /// Holders taking and letting go of storages (`collector trace --holders`).
    pub holders: Vec<MtHolder>,
    /// The shim's strings; id `i` is `strings[i - 1]`.
    pub strings: Vec<String>,
    /// Why the stream stopped early (cut mid-frame, a malformed frame), if it did.
    pub error: Option<String>,
    /// Fields of its frames this collector does not know (`hello.foo`): a package newer than
    /// the collector, or a writer out of step with `protocol::frames`.
    pub unknown_fields: Vec<String>,
    pub bytes: u64,
    /// The folder where the process may leave snapshot files, which its notes name (the
    /// recorder fallback; see `pyrun::history`).
    pub snapshot_dir: Option<std::path::PathBuf>,
}

impl ProcessStream {
    pub fn pid(&self) -> Option<u64> {
        self.hello.as_ref().and_then(|h| h.pid).or_else(|| self.notes.iter().find_map(|n| n.pid))
    }
}

/// Reads frames until the peer closes. `on_records` sees each batch as it arrives (live views).
/// A stream cut mid-frame or a malformed frame ends the reading; what came before is kept
/// and [`ProcessStream::error`] says where it stopped.
/// `on_records` gets each batch of records with the process's capture header (sent first).
pub fn read_stream(mut r: impl Read, on_records: &mut dyn FnMut(Option<&Hello>, &[MtRecord])) -> ProcessStream {
    let mut s = ProcessStream::default();
    if let Err(e) = read_frames(&mut r, &mut s, on_records) {
        s.error = Some(e);
    }
    s
}

fn read_frames(r: &mut impl Read, s: &mut ProcessStream, on_records: &mut dyn FnMut(Option<&Hello>, &[MtRecord])) -> Result<(), String> {
    let mut payload = Vec::new();
    for frame in 0u64.. {
        let mut header = [0u8; 8];
        match read_full(r, &mut header).map_err(|e| format!("reading frame {frame}: {e}"))? {
            0 => return Ok(()),
            8 => {}
            n => return Err(format!("the stream ended inside the header of frame {frame} ({n} of 8 bytes)")),
        }
        let kind = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        let len = u32::from_le_bytes([header[4], header[5], header[6], header[7]]) as usize;
        if len > MAX_FRAME_BYTES {
            return Err(format!("frame {frame} (kind {kind}) claims {len} bytes; at most {MAX_FRAME_BYTES} expected"));
        }
        payload.resize(len, 0);
        let n = read_full(r, &mut payload).map_err(|e| format!("reading frame {frame}: {e}"))?;
        if n != len {
            return Err(format!("the stream ended inside frame {frame} (kind {kind}): {n} of {len} bytes"));
        }
        s.bytes += 8 + len as u64;
        take_frame(s, kind, &payload, on_records).map_err(|e| format!("frame {frame} (kind {kind}, {len} bytes): {e}"))?;
    }
    Ok(())
}

/// A JSON frame as its type, or an error saying what was expected and what was wrong; the
/// top-level fields its type does not have go to `unknown` as `name.field`.
fn frame<T: serde::de::DeserializeOwned + serde::Serialize>(
    payload: &[u8],
    what: &str,
    name: &str,
    unknown: &mut Vec<String>,
) -> Result<T, String> {
    let value: serde_json::Value = serde_json::from_slice(payload).map_err(|e| format!("expected {what} as a JSON object: {e}"))?;
    let serde_json::Value::Object(fields) = &value else {
        return Err(format!("expected {what} as a JSON object, found {}", kind_of(&value)));
    };
    let keys: Vec<String> = fields.keys().cloned().collect();
    // The error names the field: `counters.mem_kept: invalid type: …`.
    let typed: T = serde_path_to_error::deserialize(value).map_err(|e| format!("expected {what}: {e}"))?;
    if let Ok(serde_json::Value::Object(known)) = serde_json::to_value(&typed) {
        for k in keys.into_iter().filter(|k| !known.contains_key(k)) {
            let field = format!("{name}.{k}");
            if !unknown.contains(&field) {
                unknown.push(field);
            }
        }
    }
    Ok(typed)
}

fn kind_of(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

fn take_frame(
    s: &mut ProcessStream,
    kind: u32,
    payload: &[u8],
    on_records: &mut dyn FnMut(Option<&Hello>, &[MtRecord]),
) -> Result<(), String> {
    match kind {
        FRAME_HELLO => s.hello = Some(frame(payload, "a capture header (protocol::frames::Hello)", "hello", &mut s.unknown_fields)?),
        FRAME_END => s.end = Some(frame(payload, "a capture end (protocol::frames::End)", "end", &mut s.unknown_fields)?),
        // A note is kept whatever it holds: one that does not read says so where notes are shown.
        FRAME_NOTE => {
            let note = frame(payload, "a note (protocol::frames::Note)", "note", &mut s.unknown_fields);
            s.notes.push(note.unwrap_or_else(|e| Note { kind: "malformed".into(), detail: Some(e), ..Note::default() }));
        }
        FRAME_RECORDS => {
            if !payload.len().is_multiple_of(RECORD_BYTES) {
                return Err(format!("a records frame must hold whole {RECORD_BYTES}-byte records"));
            }
            let start = s.records.len();
            s.records.extend(payload.chunks_exact(RECORD_BYTES).map(MtRecord::from_le_bytes));
            on_records(s.hello.as_ref(), &s.records[start..]);
        }
        FRAME_HOLDERS => {
            if !payload.len().is_multiple_of(HOLDER_BYTES) {
                return Err(format!("a holders frame must hold whole {HOLDER_BYTES}-byte holders"));
            }
            s.holders.extend(payload.chunks_exact(HOLDER_BYTES).map(MtHolder::from_le_bytes));
        }
        FRAME_STRINGS => {
            let mut p = payload;
            while !p.is_empty() {
                if p.len() < 8 {
                    return Err("a string entry needs an 8-byte head (id, length)".into());
                }
                let id = u32::from_le_bytes([p[0], p[1], p[2], p[3]]) as usize;
                let len = u32::from_le_bytes([p[4], p[5], p[6], p[7]]) as usize;
                if id != s.strings.len() + 1 {
                    return Err(format!("string id {id} out of order; expected {}", s.strings.len() + 1));
                }
                let Some(bytes) = p.get(8..8 + len) else {
                    return Err(format!("string {id} claims {len} bytes past the frame's end"));
                };
                s.strings.push(String::from_utf8_lossy(bytes).into_owned());
                p = &p[8 + len..];
            }
        }
        other => return Err(format!("unknown frame kind {other}; expected 1 to 6")),
    }
    Ok(())
}

/// Fills `buf` unless the stream ends first; returns the bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn frame(kind: u32, payload: &[u8]) -> Vec<u8> {
        let mut v = kind.to_le_bytes().to_vec();
        v.extend((payload.len() as u32).to_le_bytes());
        v.extend(payload);
        v
    }

    fn record_bytes(r: &MtRecord) -> Vec<u8> {
        let mut v = Vec::new();
        for x in [r.ts_ns, r.id, r.value as u64, r.a, r.b] {
            v.extend(x.to_le_bytes());
        }
        for x in [r.op, r.name, r.thread] {
            v.extend(x.to_le_bytes());
        }
        v.extend([r.kind, r.device_type as u8, r.device_index as u8, r.phase]);
        v.extend(r.c.to_le_bytes());
        v
    }

    #[test]
    fn frames_round_trip() {
        let rec = MtRecord {
            ts_ns: 5,
            id: 0xABC,
            value: -512,
            a: 1024,
            b: 2048,
            op: 3,
            name: 1,
            thread: 7,
            kind: 1,
            device_type: 1,
            device_index: 0,
            phase: 2,
            c: 4096,
        };
        let mut strings = 1u32.to_le_bytes().to_vec();
        strings.extend(3u32.to_le_bytes());
        strings.extend(b"fc1");
        let mut bytes = frame(FRAME_HELLO, br#"{"pid": 42}"#);
        bytes.extend(frame(FRAME_STRINGS, &strings));
        bytes.extend(frame(FRAME_RECORDS, &[record_bytes(&rec), record_bytes(&rec)].concat()));
        bytes.extend(frame(FRAME_END, br#"{"reason": "exit"}"#));
        let mut seen = 0;
        let s = read_stream(&bytes[..], &mut |_, r| seen += r.len());
        assert_eq!(s.error, None);
        assert_eq!((s.pid(), seen, s.strings.as_slice()), (Some(42), 2, ["fc1".to_string()].as_slice()));
        let r = s.records[1];
        assert_eq!((r.ts_ns, r.id, r.value, r.a, r.b, r.op, r.name, r.thread), (5, 0xABC, -512, 1024, 2048, 3, 1, 7));
        assert_eq!((r.kind, r.device_type, r.device_index, r.phase), (1, 1, 0, 2));
        assert!(s.end.is_some());
    }

    #[test]
    fn a_note_that_does_not_read_is_kept_as_malformed_and_the_stream_goes_on() {
        let bytes = [
            frame(FRAME_NOTE, br#"{"kind": "recorder_snapshot", "pid": 3, "pieces": "not a list"}"#),
            frame(FRAME_NOTE, br#"{"kind": "no_torch", "pid": 4}"#),
        ]
        .concat();
        let s = read_stream(&bytes[..], &mut |_, _| {});
        assert_eq!(s.error, None);
        assert_eq!(s.notes.len(), 2);
        assert_eq!(s.notes[0].kind, "malformed");
        assert!(s.notes[0].detail.as_deref().is_some_and(|d| d.contains("pieces")), "{:?}", s.notes[0]);
        assert_eq!((s.notes[1].kind.as_str(), s.notes[1].pid), ("no_torch", Some(4)));
    }

    #[test]
    fn fields_the_types_do_not_have_are_named() {
        let bytes = [frame(FRAME_HELLO, br#"{"pid": 1, "shiny": true}"#), frame(FRAME_END, br#"{"reason": "exit", "later": 2}"#)].concat();
        let s = read_stream(&bytes[..], &mut |_, _| {});
        assert_eq!((s.error, s.unknown_fields), (None, vec!["hello.shiny".to_owned(), "end.later".to_owned()]));
    }

    #[test]
    fn malformed_streams_are_errors_that_keep_what_came_before() {
        let good = frame(FRAME_HELLO, br#"{"pid": 1}"#);
        let cases: Vec<(Vec<u8>, &str)> = vec![
            ([good.clone(), frame(FRAME_RECORDS, &[0u8; 63])].concat(), "whole 64-byte records"),
            ([good.clone(), frame(9, b"")].concat(), "unknown frame kind 9"),
            ([good.clone(), frame(FRAME_END, b"not json")].concat(), "expected a capture end (protocol::frames::End) as a JSON object"),
            ([good.clone(), frame(FRAME_END, b"[1, 2]")].concat(), "as a JSON object, found an array"),
            ([good.clone(), frame(FRAME_END, br#"{"counters": {"mem_kept": "many"}}"#)].concat(), "expected a capture end"),
            ([good.clone(), 2u32.to_le_bytes().to_vec(), u32::MAX.to_le_bytes().to_vec()].concat(), "at most"),
            ([good.clone(), frame(FRAME_RECORDS, &[0u8; 112])[..60].to_vec()].concat(), "ended inside frame 1"),
            ([good.clone(), vec![1, 2, 3]].concat(), "inside the header of frame 1"),
            ([good.clone(), frame(FRAME_STRINGS, &[2, 0, 0, 0, 0, 0, 0, 0])].concat(), "string id 2 out of order"),
            ([good.clone(), frame(FRAME_STRINGS, &[1, 0, 0, 0, 9, 0, 0, 0, b'x'])].concat(), "past the frame's end"),
        ];
        for (bytes, want) in cases {
            let s = read_stream(&bytes[..], &mut |_, _| {});
            let err = s.error.clone().unwrap_or_default();
            assert!(err.contains(want), "{err:?} should contain {want:?}");
            assert_eq!(s.pid(), Some(1), "the hello before the bad frame is kept");
        }
    }
}
