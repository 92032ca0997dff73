//! The importers read streams: a snapshot imported from memory, from a reader that hands out
//! a few bytes at a time, and from gzip must be the same trace, and so must the same snapshot
//! pickled differently (no memo at all; entries shared through the memo), since the streaming
//! snapshot importer compacts entries as they arrive and gives their values back.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use shared::export::{export, ExportFormat};
use shared::import::pickle::{self, Pickle, Value, ValueId};
use shared::{import, import::import_reader, ImportOptions};
use std::io::{Read, Write};
use std::path::PathBuf;

const PICKLES: [&str; 6] = [
    "mlp_adam_3steps.pickle",
    "mlp_adam_3steps.protocol2.pickle",
    "mlp_adam_3steps.protocol3.pickle",
    "mlp_adam_3steps.protocol5.pickle",
    "resnet18_sgd_2steps.pickle",
    "oom_mlp.pickle",
];

fn data(name: &str) -> Vec<u8> {
    std::fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data").join(name)).unwrap()
}

fn native(trace: &shared::model::Trace) -> String {
    let mut out = Vec::new();
    export(trace, ExportFormat::Native, &mut out).unwrap();
    String::from_utf8(out).unwrap()
}

/// Hands out at most `step` bytes per read, so that every argument straddles reads.
struct Trickle<'a> {
    data: &'a [u8],
    step: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.step.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

fn gzip(raw: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(raw).unwrap();
    enc.finish().unwrap()
}

/// Pads `raw` past the importers' 1 MiB head, so that the streamed path runs and not the
/// in-memory one: a snapshot is a pickle, so padding goes in as an extra key of its dict.
fn long(raw: &[u8]) -> Vec<u8> {
    let p = pickle::parse(raw).unwrap();
    let mut w = Writer::default();
    w.out.extend_from_slice(b"\x80\x02");
    w.value(&p, p.root, Some(2 << 20));
    w.out.push(b'.');
    w.out
}

#[test]
fn a_snapshot_streamed_in_pieces_or_gzipped_is_the_same_trace() {
    for name in PICKLES {
        let raw = data(name);
        let expected = native(&import(&raw, &ImportOptions::default()).unwrap());
        let padded = long(&raw);
        assert!(padded.len() > 2 << 20);
        for step in [3, 4096] {
            let t = import_reader(Trickle { data: &padded, step }, &ImportOptions::default())
                .unwrap_or_else(|e| panic!("{name} in {step}-byte reads: {e}"));
            assert_eq!(native(&t), expected, "{name} in {step}-byte reads");
        }
        let t = import_reader(gzip(&padded).as_slice(), &ImportOptions::default()).unwrap();
        assert_eq!(native(&t), expected, "{name} gzipped, streamed");
        let t = import(&gzip(&raw), &ImportOptions::default()).unwrap();
        assert_eq!(native(&t), expected, "{name} gzipped, in memory");
    }
}

#[test]
fn a_snapshot_pickled_without_a_memo_or_with_shared_entries_is_the_same_trace() {
    for name in ["mlp_adam_3steps.pickle", "resnet18_sgd_2steps.pickle"] {
        let raw = data(name);
        let expected = native(&import(&raw, &ImportOptions::default()).unwrap());
        let p = pickle::parse(&raw).unwrap();

        // Python's pickler in fast mode: no memo, every frame written out again.
        let mut w = Writer::default();
        w.out.extend_from_slice(b"\x80\x02");
        w.value(&p, p.root, None);
        w.out.push(b'.');
        assert_eq!(native(&import(&w.out, &ImportOptions::default()).unwrap()), expected, "{name} without a memo");

        // Python's pickler on objects that share nothing: every dict, list and string
        // memoized (so the memo names each frame and each "N/A"), none fetched again.
        let mut w = Writer { memo_all: true, ..Writer::default() };
        w.out.extend_from_slice(b"\x80\x02");
        w.value(&p, p.root, None);
        w.out.push(b'.');
        assert_eq!(native(&import(&w.out, &ImportOptions::default()).unwrap()), expected, "{name} with every object memoized");

        // Every entry twice: once written out, once as a copy; and once written out, once
        // fetched from the memo. Both are the same snapshot, the same trace or the same
        // refusal (allocating every block twice can pass the reserved memory).
        let twice = |shared: bool| {
            let mut w = Writer { twice: Some(shared), ..Writer::default() };
            w.out.extend_from_slice(b"\x80\x02");
            w.value(&p, p.root, None);
            w.out.push(b'.');
            import(&w.out, &ImportOptions::default()).map(|t| native(&t)).map_err(|e| e.to_string())
        };
        let copies = twice(false);
        assert_ne!(copies.as_ref().ok(), Some(&expected));
        assert_eq!(twice(true), copies, "{name}: entries shared through the memo");
    }
}

/// A pickle writer for plain values (protocol 2 opcodes), without a memo unless `twice` asks
/// for entries to be shared through it.
#[derive(Default)]
struct Writer {
    out: Vec<u8>,
    /// Write each entry of `device_traces` twice: `Some(true)` the second time as a memo GET.
    twice: Option<bool>,
    /// Memoize every string, list and dict, as Python's pickler does.
    memo_all: bool,
    next_memo: u32,
}

impl Writer {
    fn str(&mut self, s: &str) {
        self.out.push(b'X');
        self.out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        self.out.extend_from_slice(s.as_bytes());
        self.memoize();
    }

    fn memoize(&mut self) {
        if self.memo_all {
            self.out.push(b'r');
            self.out.extend_from_slice(&self.next_memo.to_le_bytes());
            self.next_memo += 1;
        }
    }

    fn value(&mut self, p: &Pickle, id: ValueId, pad: Option<usize>) {
        match p.get(id) {
            Value::None => self.out.push(b'N'),
            Value::Bool(b) => self.out.push(if *b { 0x88 } else { 0x89 }),
            Value::Int(i) => {
                self.out.extend_from_slice(&[0x8a, 8]);
                self.out.extend_from_slice(&i.to_le_bytes());
            }
            Value::BigInt(b) => {
                self.out.extend_from_slice(&[0x8a, b.len() as u8]);
                self.out.extend_from_slice(b);
            }
            Value::Float(f) => {
                self.out.push(b'G');
                self.out.extend_from_slice(&f.to_be_bytes());
            }
            Value::Str(s) => self.str(s),
            Value::Bytes(b) => {
                self.out.push(b'B');
                self.out.extend_from_slice(&(b.len() as u32).to_le_bytes());
                self.out.extend_from_slice(b);
            }
            Value::List(items) | Value::Set(items) => {
                self.out.push(b']');
                self.memoize();
                for chunk in items.chunks(1000) {
                    if let [one] = chunk {
                        self.value(p, *one, None);
                        self.out.push(b'a');
                        continue;
                    }
                    self.out.push(b'(');
                    for &item in chunk {
                        self.value(p, item, None);
                    }
                    self.out.push(b'e');
                }
            }
            Value::Tuple(items) => {
                self.out.push(b'(');
                for &item in items {
                    self.value(p, item, None);
                }
                self.out.push(b't');
            }
            Value::Dict(items) => {
                self.out.push(b'}');
                self.memoize();
                self.out.push(b'(');
                for &(k, v) in items {
                    self.value(p, k, None);
                    let is_traces = matches!(p.get(k), Value::Str(s) if s == "device_traces");
                    match (self.twice, p.get(v)) {
                        (Some(shared), Value::List(devices)) if is_traces => {
                            self.out.push(b']');
                            for &dev in devices {
                                let Value::List(entries) = p.get(dev) else { panic!("a device trace is a list") };
                                self.out.extend_from_slice(b"](");
                                for &e in entries {
                                    self.value(p, e, None);
                                    if shared {
                                        let key = self.next_memo;
                                        self.next_memo += 1;
                                        self.out.push(b'r');
                                        self.out.extend_from_slice(&key.to_le_bytes());
                                        self.out.push(b'j');
                                        self.out.extend_from_slice(&key.to_le_bytes());
                                    } else {
                                        self.value(p, e, None);
                                    }
                                }
                                self.out.extend_from_slice(b"ea");
                            }
                        }
                        _ => self.value(p, v, None),
                    }
                }
                if let Some(n) = pad {
                    self.str("padding");
                    self.str(&" ".repeat(n));
                }
                self.out.push(b'u');
            }
        }
    }
}

/// What a DFTracer export keeps of a trace, with names instead of ids: every memory event with
/// its totals, every scope and every operator.
fn dftracer_view(t: &shared::model::Trace) -> (shared::analysis::Summary, Vec<String>, Vec<String>, Vec<String>) {
    let ev = &t.events;
    let mut cursor = ev.cursor();
    let events = (0..ev.len())
        .map(|i| {
            let totals = cursor.advance();
            let r = ev.record(i);
            let stream = t.streams.get(r.stream as usize).map(|s| t.str(*s).to_owned()).unwrap_or_default();
            format!(
                "{} {:?} {:?} {} {} {} {} {stream} {} {}",
                r.ts_ns,
                r.event_type,
                r.phase,
                r.size_bytes,
                r.address,
                t.str(r.layer),
                t.devices[r.device as usize],
                totals.allocated_bytes,
                totals.reserved_bytes
            )
        })
        .collect();
    let scopes =
        t.scopes.iter().map(|s| format!("{} {} {} {} {:?} {}", t.str(s.name), s.start_ns, s.end_ns, s.depth, s.phase, s.thread)).collect();
    let ops = t
        .ops
        .iter()
        .map(|o| {
            format!(
                "{} {:?} {} {} {} {} {} {}",
                t.str(o.name),
                o.phase,
                o.seq_nr,
                o.start_ns,
                o.end_ns,
                o.thread,
                o.fwd_thread,
                t.str(o.layer)
            )
        })
        .collect();
    (shared::analysis::summary(t), events, scopes, ops)
}

#[test]
fn a_dftracer_export_reads_back_as_the_same_events_scopes_and_operators() {
    for name in ["resnet18_sgd_2steps.pickle", "convnet_profiler_trace.json", "oom_program.mtrace.json"] {
        let trace = import(&data(name), &ImportOptions::default()).unwrap();
        let mut out = Vec::new();
        export(&trace, ExportFormat::Dftracer, &mut out).unwrap();
        let back = import(&out, &ImportOptions::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
        let (a, b) = (dftracer_view(&trace), dftracer_view(&back));
        assert!(!a.1.is_empty(), "{name} has memory events");
        assert_eq!(a.1, b.1, "{name}: memory events");
        assert_eq!(a.2, b.2, "{name}: scopes");
        assert_eq!(a.3, b.3, "{name}: operators");
        assert_eq!(format!("{:?}", a.0), format!("{:?}", b.0), "{name}: summary");
        assert_eq!(back.meta.model, trace.meta.model);
        // One JSON event per line inside gzip members that each decompress on their own.
        let mut text = String::new();
        flate2::read::MultiGzDecoder::new(out.as_slice()).read_to_string(&mut text).unwrap();
        assert!(text.lines().all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()), "{name}: a line is not one JSON event");
        assert_eq!(text.lines().count(), 1 + trace.devices.len() + trace.events.len() + trace.scopes.len() + trace.ops.len());
    }
    // In several gzip members: each inflates alone and ends at a line's end.
    let trace = import(&data("resnet18_sgd_2steps.pickle"), &ImportOptions::default()).unwrap();
    let mut out = Vec::new();
    shared::export::dftracer::write_chunked(&trace, &mut out, 64 << 10).unwrap();
    let mut members = 0;
    let mut rest = out.as_slice();
    while !rest.is_empty() {
        let mut dec = flate2::bufread::GzDecoder::new(rest);
        let mut chunk = Vec::new();
        dec.read_to_end(&mut chunk).unwrap();
        assert!(chunk.len() < (64 << 10) + 4096 && chunk.ends_with(b"\n"), "{} bytes", chunk.len());
        rest = dec.into_inner();
        members += 1;
    }
    assert!(members >= 4, "{members} gzip members");
    assert_eq!(dftracer_view(&import(&out, &ImportOptions::default()).unwrap()).1, dftracer_view(&trace).1);
}
