//! Bad input: every case gives an error that says what was expected and where; none panics.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches fail loudly by design

use shared::{import, ImportError, ImportOptions};
use std::path::PathBuf;

fn data(name: &str) -> Vec<u8> {
    std::fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data").join(name)).unwrap()
}

fn err(bytes: &[u8]) -> String {
    match import(bytes, &ImportOptions::default()) {
        Ok(_) => panic!("import of bad input succeeded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn empty_input() {
    assert!(matches!(import(b"", &ImportOptions::default()), Err(ImportError::Empty)));
    assert!(err(b"  \n\t").contains("empty"));
}

#[test]
fn truncated_pickle_names_the_offset() {
    let raw = data("mlp_adam_3steps.pickle");
    for cut in [3, 100, raw.len() / 2, raw.len() - 1] {
        let e = err(&raw[..cut]);
        assert!(e.contains("corrupt pickle at byte") && e.contains("truncated"), "cut {cut}: {e}");
    }
}

#[test]
fn corrupt_pickle_bytes_never_panic() {
    let raw = data("mlp_adam_3steps.pickle");
    // Flip bytes all over the file: each result is an error or a trace, never a panic.
    let mut errors = 0;
    for i in (2..raw.len()).step_by(397) {
        let mut bad = raw.clone();
        bad[i] ^= 0x5a;
        if import(&bad, &ImportOptions::default()).is_err() {
            errors += 1;
        }
    }
    assert!(errors > 0);
}

#[test]
fn pickle_of_another_kind() {
    // pickle.dumps({'weights': [1.0, 2.0]}, protocol=4)
    let other = b"\x80\x04\x95$\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x07weights\x94]\x94(G?\xf0\x00\x00\x00\x00\x00\x00G@\x00\x00\x00\x00\x00\x00\x00es.";
    let e = err(other);
    assert!(e.contains("not a PyTorch memory snapshot") && e.contains("'weights'"), "{e}");
    // pickle.dumps([1, 2], protocol=2)
    let e = err(b"\x80\x02]q\x00(K\x01K\x02e.");
    assert!(e.contains("a pickled list"), "{e}");
    // A pickle that would construct a Python object (torch.save-style).
    let e = err(b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\nq\x00.");
    assert!(e.contains("torch._utils._rebuild_tensor_v2") && e.contains("byte 2"), "{e}");
}

#[test]
fn snapshot_with_wrong_field_types_names_the_path() {
    // {'segments': [{'address': 'x', 'total_size': 1, 'device': 0, 'blocks': []}], 'device_traces': []}
    let p = b"\x80\x04\x95\\\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x08segments\x94]\x94}\x94(\x8c\x07address\x94\x8c\x01x\x94\x8c\ntotal_size\x94K\x01\x8c\x06device\x94K\x00\x8c\x06blocks\x94]\x94ua\x8c\rdevice_traces\x94]\x94u.";
    let e = err(p);
    assert!(e.contains("segments[0].address") && e.contains("expected an integer, found str"), "{e}");
}

#[test]
fn wrong_json() {
    let e = err(b"{\"traceEvents\": [ {\"ph\": \"X\", ");
    assert!(e.contains("line 1") && e.contains("column"), "{e}");
    let e = err(b"{\"traceEvents\": {\"not\": \"a list\"}}");
    assert!(e.contains("Chrome trace") && e.contains("expected"), "{e}");
    let e = err(b"{\"hello\": 1}");
    assert!(e.contains("without \"traceEvents\""), "{e}");
    let e = err(b"{\"traceEvents\": [{\"name\": \"[memory]\", \"ph\": \"i\", \"ts\": 1, \"args\": {}}]}");
    assert!(e.contains("Bytes"), "{e}");
}

#[test]
fn unknown_binary_and_text() {
    let e = err(b"\x00\x01\x02garbage");
    assert!(e.contains("unrecognised input") && e.contains("\\x00"), "{e}");
    let e = err(b"hello world");
    assert!(e.contains("unrecognised input"), "{e}");
}

#[test]
fn own_format_from_the_future_and_corrupt_references() {
    let e = err(b"{\"format\":\"memory-tracer\",\"version\":99,\"trace\":{}}");
    assert!(e.contains("version 99") && e.contains("reads version 1"), "{e}");
    // A valid trace whose event points at a device that does not exist.
    let trace = import(&data("convnet_profiler_trace.json"), &ImportOptions::default()).unwrap();
    let mut out = Vec::new();
    shared::export::export(&trace, shared::export::ExportFormat::Native, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let bad = text.replacen("\"device\":[0,", "\"device\":[7,", 1);
    assert_ne!(bad, text);
    let e = err(bad.as_bytes());
    assert!(e.contains("trace.events.device[0]") && e.contains("not in trace.devices"), "{e}");
}

#[test]
fn absurd_sizes_are_refused() {
    // A BINUNICODE claiming 2 GiB in a 20-byte file.
    let e = err(b"\x80\x04X\x00\x00\x00\x80abc");
    assert!(e.contains("exceeds"), "{e}");
    // A negative segment size in a snapshot.
    // {'segments': [{'address': 0, 'total_size': -5, 'device': 0, 'blocks': []}], 'device_traces': []}
    let p = b"\x80\x04\x95]\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x08segments\x94]\x94}\x94(\x8c\x07address\x94K\x00\x8c\ntotal_size\x94J\xfb\xff\xff\xff\x8c\x06device\x94K\x00\x8c\x06blocks\x94]\x94ua\x8c\rdevice_traces\x94]\x94u.";
    let e = err(p);
    assert!(e.contains("segments[0].total_size") && e.contains("-5"), "{e}");
}

#[test]
fn gzip_bomb_is_bounded() {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let zeros = vec![b' '; 1 << 20];
    for _ in 0..16 {
        gz.write_all(&zeros).unwrap();
    }
    let bomb = gz.finish().unwrap();
    let mut opts = ImportOptions::default();
    opts.max_decompressed_bytes = 4 << 20;
    let e = import(&bomb, &opts).unwrap_err();
    assert!(matches!(e, ImportError::TooLarge { limit_bytes } if limit_bytes == 4 << 20), "{e}");
    // A truncated gzip stream.
    let e = import(&bomb[..bomb.len() / 2], &ImportOptions::default()).unwrap_err().to_string();
    assert!(e.contains("gzip"), "{e}");
}

#[test]
fn extreme_numbers_do_not_overflow() {
    // Timestamps and durations far beyond u64 nanoseconds, a device id beyond i32.
    let chrome = br#"{"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "tid": 1, "ts": 1e30, "dur": 1e30},
        {"ph": "i", "name": "[memory]", "tid": 1, "ts": 1e30,
         "args": {"Bytes": 512, "Total Allocated": 512, "Total Reserved": 0, "Device Type": 1, "Device Id": 99999999999, "Addr": -1}}]}"#;
    let t = import(chrome, &ImportOptions::default()).unwrap();
    let s = shared::analysis::summary(&t);
    assert_eq!(s.peak_allocated_bytes, 512);
    for f in shared::export::ExportFormat::ALL {
        shared::export::export(&t, f, &mut Vec::new()).unwrap();
    }
    // A snapshot whose addresses sit at the top of the address space.
    // {'segments': [], 'device_traces': [[{'action': 'segment_alloc', 'addr': -2048, 'size': 2**21, 'time_us': 1},
    //   {'action': 'alloc', 'addr': -1024, 'size': 4096, 'time_us': 2}, {'action': 'free_requested', 'addr': -1024, 'size': 4096, 'time_us': 3},
    //   {'action': 'free_completed', 'addr': -1024, 'size': 4096, 'time_us': 4}]]}
    let p = SNAPSHOT_AT_TOP;
    let t = import(p, &ImportOptions::default()).unwrap();
    for f in shared::export::ExportFormat::ALL {
        shared::export::export(&t, f, &mut Vec::new()).unwrap();
    }
    let _ = shared::analysis::segments_at(&t, 3, 0);
}

#[test]
fn corrupt_json_and_native_bytes_never_panic() {
    let trace = import(&data("convnet_profiler_trace.json"), &ImportOptions::default()).unwrap();
    let mut native = Vec::new();
    shared::export::export(&trace, shared::export::ExportFormat::Native, &mut native).unwrap();
    for raw in [data("convnet_profiler_trace.json"), native] {
        let mut errors = 0;
        for i in (0..raw.len()).step_by(211) {
            let mut bad = raw.clone();
            bad[i] = b"0-9\"e,]}"[i % 8];
            if let Ok(t) = import(&bad, &ImportOptions::default()) {
                // Whatever imports must also analyse and export.
                let _ = shared::analysis::summary(&t);
                shared::export::export(&t, shared::export::ExportFormat::Timeline, &mut Vec::new()).unwrap();
            } else {
                errors += 1;
            }
        }
        assert!(errors > 0);
    }
}
const SNAPSHOT_AT_TOP: &[u8] = b"\x80\x04\x95\xd6\x00\x00\x00\x00\x00\x00\x00\x7d\x94\x28\x8c\x08\x73\x65\x67\x6d\x65\x6e\x74\x73\x94\x5d\x94\x8c\x0d\x64\x65\x76\x69\x63\x65\x5f\x74\x72\x61\x63\x65\x73\x94\x5d\x94\x5d\x94\x28\x7d\x94\x28\x8c\x06\x61\x63\x74\x69\x6f\x6e\x94\x8c\x0d\x73\x65\x67\x6d\x65\x6e\x74\x5f\x61\x6c\x6c\x6f\x63\x94\x8c\x04\x61\x64\x64\x72\x94\x4a\x00\xf8\xff\xff\x8c\x04\x73\x69\x7a\x65\x94\x4a\x00\x00\x20\x00\x8c\x07\x74\x69\x6d\x65\x5f\x75\x73\x94\x4b\x01\x75\x7d\x94\x28\x68\x07\x8c\x05\x61\x6c\x6c\x6f\x63\x94\x68\x09\x4a\x00\xfc\xff\xff\x68\x0a\x4d\x00\x10\x68\x0b\x4b\x02\x75\x7d\x94\x28\x68\x07\x8c\x0e\x66\x72\x65\x65\x5f\x72\x65\x71\x75\x65\x73\x74\x65\x64\x94\x68\x09\x4a\x00\xfc\xff\xff\x68\x0a\x4d\x00\x10\x68\x0b\x4b\x03\x75\x7d\x94\x28\x68\x07\x8c\x0e\x66\x72\x65\x65\x5f\x63\x6f\x6d\x70\x6c\x65\x74\x65\x64\x94\x68\x09\x4a\x00\xfc\xff\xff\x68\x0a\x4d\x00\x10\x68\x0b\x4b\x04\x75\x65\x61\x75\x2e";

/// Programs a coverage-free random search (2 M short opcode sequences) found panicking: a POP
/// or TUPLEn reaching below the last MARK left the mark past the stack's end. Values below a
/// MARK now belong to it, and POP of a bare MARK drops the mark, as in CPython.
#[test]
fn stack_below_a_mark_is_an_error_not_a_panic() {
    let cases: [&[u8]; 5] = [
        b"\x80\x02)(0l.",
        b"\x80\x02})(0u\x861.",
        b"\x80\x02}(0u\x88\x88J.",
        b"\x80\x02Kb((0u.",
        b"\x80\x02K\x01(\x85.",
    ];
    for bytes in cases {
        let e = err(bytes);
        assert!(e.contains("corrupt pickle at byte") || e.contains("expected"), "{bytes:02x?}: {e}");
    }
    // POP of a bare MARK drops it: `( 0 ]` leaves an empty list, which is a pickle (of the
    // wrong kind for a trace) rather than a corrupt one.
    let e = err(b"\x80\x02(0].");
    assert!(!e.contains("corrupt pickle"), "{e}");
}

#[test]
fn bytes_after_the_stop_opcode_are_refused() {
    let mut bytes = data("mlp_adam_3steps.pickle");
    bytes.extend_from_slice(b"trailing");
    let e = err(&bytes);
    assert!(e.contains("8 bytes follow the STOP opcode"), "{e}");
}
