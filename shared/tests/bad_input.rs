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
    // A BINUNICODE claiming 2 GiB in a 20-byte file: longer than the window, it is read in
    // pieces (its start kept, as a 100 MB metadata text is) and found truncated.
    let e = err(b"\x80\x04X\x00\x00\x00\x80abc");
    assert!(e.contains("2147483648 bytes") && e.contains("truncated"), "{e}");
    // Bytes of that size are still refused before reading.
    let e = err(b"\x80\x04B\x00\x00\x00\x80abc");
    assert!(e.contains("2147483648 bytes") && e.contains("at most 64 MiB"), "{e}");
    // One claiming 64 KiB: read as far as the input goes, then refused as truncated.
    let e = err(b"\x80\x04X\x00\x00\x01\x00abc");
    assert!(e.contains("truncated") && e.contains("needs 65536 bytes but only 3 remain"), "{e}");
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
    let cases: [&[u8]; 5] =
        [b"\x80\x02)(0l.", b"\x80\x02})(0u\x861.", b"\x80\x02}(0u\x88\x88J.", b"\x80\x02Kb((0u.", b"\x80\x02K\x01(\x85."];
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

// ---------------------------------------------------------------------------------------
// Hostile inputs: every input's cost is bounded by its size (issue 15). Each test below
// failed before its bound was added (an unbounded allocation, a quadratic walk or a silent
// wrap-around); `peak_heap_bytes` measures this thread's heap so that parallel tests do not
// disturb each other.

mod heap {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    thread_local! {
        static LIVE: Cell<usize> = const { Cell::new(0) };
        static PEAK: Cell<usize> = const { Cell::new(0) };
    }

    pub struct PerThread;

    fn grew(by: usize) {
        let _ = LIVE.try_with(|l| {
            l.set(l.get() + by);
            let _ = PEAK.try_with(|p| p.set(p.get().max(l.get())));
        });
    }

    fn shrank(by: usize) {
        let _ = LIVE.try_with(|l| l.set(l.get().saturating_sub(by)));
    }

    // SAFETY: every call is forwarded to `System` unchanged; the counters only observe sizes
    // (const thread-locals without destructors, which never allocate).
    unsafe impl GlobalAlloc for PerThread {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: forwarded unchanged.
            let p = unsafe { System.alloc(layout) };
            if !p.is_null() {
                grew(layout.size());
            }
            p
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: forwarded unchanged.
            unsafe { System.dealloc(ptr, layout) };
            shrank(layout.size());
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            // SAFETY: forwarded unchanged.
            let p = unsafe { System.realloc(ptr, layout, new_size) };
            if !p.is_null() {
                grew(new_size);
                shrank(layout.size());
            }
            p
        }
    }

    /// Peak bytes of heap this thread held while `f` ran, above what it held before.
    pub fn peak_heap_bytes<T>(f: impl FnOnce() -> T) -> (usize, T) {
        let base = LIVE.with(Cell::get);
        PEAK.with(|p| p.set(base));
        let out = f();
        (PEAK.with(Cell::get) - base, out)
    }
}

#[global_allocator]
static HEAP: heap::PerThread = heap::PerThread;

/// The bound the fuzz targets check too: 64 bytes of heap per input byte, plus 1 MiB.
fn assert_heap_bounded(input: &[u8], what: &str) -> Result<shared::Trace, ImportError> {
    let (peak, out) = heap::peak_heap_bytes(|| import(input, &ImportOptions::default()));
    let allowed = input.len() * 64 + (1 << 20);
    assert!(peak <= allowed, "{what}: {peak} bytes of heap for {} input bytes (allowed {allowed})", input.len());
    out
}

/// A minimal protocol-2 pickle writer for hostile snapshots.
#[derive(Default)]
struct Pk(Vec<u8>);

impl Pk {
    fn new() -> Self {
        Pk(b"\x80\x02".to_vec())
    }
    fn op(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    fn s(&mut self, s: &str) -> &mut Self {
        self.0.push(b'X');
        self.0.extend_from_slice(&(s.len() as u32).to_le_bytes());
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    fn int(&mut self, i: i32) -> &mut Self {
        self.0.push(b'J');
        self.0.extend_from_slice(&i.to_le_bytes());
        self
    }
    fn put(&mut self, key: u32) -> &mut Self {
        self.0.push(b'r');
        self.0.extend_from_slice(&key.to_le_bytes());
        self
    }
    fn get(&mut self, key: u32) -> &mut Self {
        self.0.push(b'j');
        self.0.extend_from_slice(&key.to_le_bytes());
        self
    }
    /// `{'segments': <segments>, 'device_traces': <traces>, ...}`: call with the writer after
    /// `segments` and `device_traces` keys' values are pushed by `body`.
    fn snapshot(body: impl FnOnce(&mut Pk)) -> Vec<u8> {
        let mut p = Pk::new();
        p.op(b"}(");
        body(&mut p);
        p.op(b"u.");
        p.0
    }
}

#[test]
fn pickle_memo_keys_cannot_grow_the_memo() {
    // 20 000 PUTs, each 4096 keys past the last: 100 KB that made the memo's vector
    // 80 k × 4096 slots (640 MB) before; the keys now go to a map.
    let mut p = Pk::new();
    p.op(b"N");
    for k in 1..=20_000u32 {
        p.put(k * 4096);
    }
    p.op(b".");
    let e = assert_heap_bounded(&p.0, "sparse memo keys").unwrap_err().to_string();
    assert!(e.contains("a pickled None"), "{e}");
    // A key stored far away is still found.
    let mut p = Pk::new();
    p.op(b"}(").s("segments").op(b"]").put(4_000_000_000).s("device_traces").get(4_000_000_000).op(b"u.");
    import(&p.0, &ImportOptions::default()).unwrap();
}

#[test]
fn pickle_values_stay_within_one_per_input_byte() {
    // 1 MB of NONE opcodes: a million values, each one byte of input.
    let mut p = Pk::new();
    p.0.extend(std::iter::repeat_n(b'N', 1 << 20));
    p.op(b".");
    let e = assert_heap_bounded(&p.0, "a million values").unwrap_err().to_string();
    assert!(e.contains("a pickled None"), "{e}");
}

#[test]
fn pickle_append_to_a_value_below_a_mark_is_an_error() {
    // `] ( N a`: APPEND's list lies below the MARK, which owns it (CPython: stack underflow).
    for (bytes, what) in [
        (&b"\x80\x02](Na."[..], "APPEND without a list"),
        (b"\x80\x02}(NNs.", "SETITEM without a dict"),
        (b"\x80\x02N(2.", "DUP on an empty stack"),
        (b"\x80\x02N(\x94.", "memoize on an empty stack"),
    ] {
        let e = err(bytes);
        assert!(e.contains(what), "{bytes:02x?}: {e}");
    }
}

#[test]
fn snapshot_shared_references_count_as_what_they_expand_to() {
    // One trace entry with 2 000 junk keys, referenced 100 000 times (5 bytes each): the walk
    // would read 2 × 10^8 dict items from 0.5 MB. Now refused, naming the cause.
    let bytes = Pk::snapshot(|p| {
        p.s("segments").op(b"]").s("device_traces").op(b"]]");
        p.op(b"}").put(0).op(b"(");
        p.s("action").s("alloc").s("addr").int(4096).s("size").int(512).s("time_us").int(1);
        for k in 0..2000 {
            p.s(&format!("junk{k}")).int(k);
        }
        p.op(b"u0(");
        for _ in 0..100_000 {
            p.get(0);
        }
        p.op(b"ea");
    });
    let started = std::time::Instant::now();
    let e = err(&bytes);
    assert!(e.contains("device_traces[0]") && e.contains("shared references"), "{e}");
    assert!(started.elapsed().as_secs() < 10, "took {:?}", started.elapsed());
}

#[test]
fn snapshot_allocator_settings_expand_within_a_node_budget() {
    // allocator_settings = L5, L(k+1) = [Lk] * 64: 64^5 (10^9) JSON nodes from 2 KB.
    let bytes = Pk::snapshot(|p| {
        p.s("segments").op(b"]").s("device_traces").op(b"]").s("allocator_settings");
        p.op(b"]").put(0).op(b"0");
        for level in 1..=5u32 {
            p.op(b"](");
            for _ in 0..64 {
                p.get(level - 1);
            }
            p.op(b"e").put(level).op(b"0");
        }
        p.get(5);
    });
    let t = assert_heap_bounded(&bytes, "allocator settings").unwrap();
    fn nodes(v: &serde_json::Value) -> usize {
        1 + match v {
            serde_json::Value::Array(a) => a.iter().map(nodes).sum(),
            serde_json::Value::Object(m) => m.values().map(nodes).sum(),
            _ => 0,
        }
    }
    let settings = t.meta.allocator_settings.as_ref().unwrap();
    assert!(nodes(settings) <= 4096 + 1, "{} nodes", nodes(settings));
}

#[test]
fn snapshot_device_counts_are_checked_before_use() {
    let bytes = Pk::snapshot(|p| {
        p.s("segments").op(b"]").s("device_traces").op(b"](");
        for _ in 0..300 {
            p.op(b"]");
        }
        p.op(b"e");
    });
    let e = err(&bytes);
    assert!(e.contains("device_traces") && e.contains("300 devices; expected at most 255"), "{e}");
    let bytes = Pk::snapshot(|p| {
        p.s("segments").op(b"]}(");
        p.s("address").int(0).s("total_size").int(1 << 21).s("device").int(100_000).s("blocks").op(b"]");
        p.op(b"ua").s("device_traces").op(b"]");
    });
    let e = err(&bytes);
    assert!(e.contains("segments[0].device") && e.contains("100000 is out of range"), "{e}");
}

/// A snapshot of `n` allocations, each on a stream of its own.
fn snapshot_with_streams(n: i32) -> Vec<u8> {
    Pk::snapshot(|p| {
        p.s("segments").op(b"]").s("device_traces").op(b"]](");
        for i in 0..n {
            p.op(b"}(").s("action").s("alloc").s("addr").int(i * 512).s("size").int(512);
            p.s("stream").int(i + 1).s("time_us").int(i).op(b"u");
        }
        p.op(b"ea");
    })
}

#[test]
fn snapshot_streams_are_looked_up_in_a_map_and_bounded() {
    // 30 000 streams: a linear search per entry made this 4.5 × 10^8 string comparisons.
    let started = std::time::Instant::now();
    let t = assert_heap_bounded(&snapshot_with_streams(30_000), "30 000 streams").unwrap();
    assert_eq!(t.streams.len(), 30_000);
    assert!(started.elapsed().as_secs() < 10, "took {:?}", started.elapsed());
    // Stream indices are 16 bits: the 65 537th stream is refused instead of wrapping.
    let e = err(&snapshot_with_streams(70_000));
    assert!(e.contains("more than 65536 distinct streams"), "{e}");
}

/// A Chrome trace of `events` (JSON objects) after a `{"traceEvents": [` head.
fn chrome_doc(events: impl Iterator<Item = String>) -> Vec<u8> {
    let mut doc = b"{\"traceEvents\": [".to_vec();
    for (i, e) in events.enumerate() {
        if i > 0 {
            doc.push(b',');
        }
        doc.extend_from_slice(e.as_bytes());
    }
    doc.extend_from_slice(b"]}");
    doc
}

#[test]
fn chrome_deep_module_nesting_is_linear() {
    // 20 000 nested modules: every slice's module path used to be joined from the whole stack
    // (quadratic time, and 20 000 paths of up to 200 KB kept at once).
    let n = 20_000u64;
    let doc = chrome_doc((0..n).map(|i| {
        format!(r#"{{"ph":"X","cat":"python_function","name":"nn.Module: m{i}","tid":1,"ts":{},"dur":{}}}"#, 1 + i, 2 * (n - i) + 10)
    }).chain(std::iter::once(
        r#"{"ph":"i","name":"[memory]","tid":1,"ts":20010,"args":{"Bytes":512,"Total Allocated":512,"Total Reserved":0,"Device Type":1,"Device Id":0,"Addr":1}}"#.to_owned(),
    )));
    let started = std::time::Instant::now();
    let t = assert_heap_bounded(&doc, "deep module nesting").unwrap();
    assert!(started.elapsed().as_secs() < 10, "took {:?}", started.elapsed());
    let longest = t.scopes.iter().map(|s| t.str(s.name).len()).max().unwrap();
    assert!(longest <= 1024, "a module path of {longest} bytes");
    assert_eq!(t.scopes.len(), n as usize);
    assert!(t.str(t.scopes[0].name) == "m0" && t.str(t.scopes[2].name) == "m0.m1.m2");
}

#[test]
fn chrome_device_count_is_bounded() {
    let doc = chrome_doc((0..300).map(|d| {
        format!(r#"{{"ph":"i","name":"[memory]","ts":{d},"args":{{"Bytes":512,"Total Allocated":512,"Device Type":1,"Device Id":{d}}}}}"#)
    }));
    let e = err(&doc);
    assert!(e.contains("more than 256 distinct devices"), "{e}");
}

#[test]
fn chrome_events_stream_instead_of_buffering_the_document() {
    // 200 000 events the importer ignores and odd thread ids: the untagged enum buffered the
    // whole document as serde values (about 100 bytes per 12-byte event) before reading it.
    let doc = chrome_doc((0..200_000).map(|i| if i % 2 == 0 { r#"{"ph":"B","x":1}"#.to_owned() } else { r#"{"tid":[[0]]}"#.to_owned() }));
    let (peak, out) = heap::peak_heap_bytes(|| import(&doc, &ImportOptions::default()));
    out.unwrap();
    assert!(peak < doc.len(), "{peak} bytes of heap for {} input bytes", doc.len());
}

#[test]
fn dftracer_file_labels_are_bounded() {
    // One hashed file name of 1 MB, referenced by 2 000 spans: a 1 MB label built per span.
    let mut doc = format!("{{\"name\":\"FH\",\"ph\":\"M\",\"args\":{{\"name\":\"/{}\",\"value\":\"f1\"}}}}\n", "a".repeat(1 << 20));
    for i in 0..2000 {
        doc.push_str(&format!("{{\"name\":\"read\",\"cat\":\"POSIX\",\"ph\":\"X\",\"ts\":{i},\"dur\":1,\"args\":{{\"fhash\":\"f1\"}}}}\n"));
    }
    let t = assert_heap_bounded(doc.as_bytes(), "long file label").unwrap();
    let label = t.str(t.scopes[0].name);
    assert!(label.starts_with("POSIX:read [/aaa") && label.ends_with("…]") && label.len() < 4200, "{} bytes", label.len());
}

/// `{"traceEvents": [` + `{},` × n + `{}]}`, gzip-compressed: a few hundred KB that expand
/// to megabytes.
fn chrome_gzip_bomb(events: usize) -> Vec<u8> {
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(b"{\"traceEvents\": [").unwrap();
    let chunk = b"{},".repeat(1 << 16);
    for _ in 0..events >> 16 {
        gz.write_all(&chunk).unwrap();
    }
    gz.write_all(b"{}]}").unwrap();
    gz.finish().unwrap()
}

#[test]
fn gzip_chrome_traces_stream_into_the_importer() {
    // 12 MB decompressed: held whole (and as serde values) before; now the importer's state
    // and a reader's buffers.
    let bomb = chrome_gzip_bomb(4 << 20);
    let (peak, out) = heap::peak_heap_bytes(|| import(&bomb, &ImportOptions::default()));
    out.unwrap();
    assert!(peak < 4 << 20, "{peak} bytes of heap for a {}-byte bomb", bomb.len());
    // The decompression bound still holds while streaming, and a corrupt stream is a gzip error.
    let mut opts = ImportOptions::default();
    opts.max_decompressed_bytes = 4 << 20;
    let e = import(&bomb, &opts).unwrap_err();
    assert!(matches!(e, ImportError::TooLarge { limit_bytes } if limit_bytes == 4 << 20), "{e}");
    let e = import(&bomb[..bomb.len() * 3 / 4], &ImportOptions::default()).unwrap_err().to_string();
    assert!(e.contains("gzip"), "{e}");
}

#[test]
fn gzip_dftracer_streams_line_by_line() {
    use std::io::Write;
    let line = b"{\"name\":\"FH\",\"cat\":\"POSIX\",\"ph\":\"M\",\"args\":{\"name\":\"x\",\"value\":\"y\"}}\n";
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    for _ in 0..300_000 {
        gz.write_all(line).unwrap();
    }
    let bomb = gz.finish().unwrap();
    let (peak, out) = heap::peak_heap_bytes(|| import(&bomb, &ImportOptions::default()));
    out.unwrap();
    assert!(peak < 4 << 20, "{peak} bytes of heap for {} decompressed bytes", line.len() * 300_000);
}

#[test]
fn chrome_input_dims_cost_at_most_64_bytes_per_input_byte() {
    // One operator whose only input is a 1-D shape of 500 000 zeros (2 bytes each), and one
    // nested 100 levels deep: read as serde values, then as a shape.
    let zeros = vec!["0"; 500_000].join(",");
    let deep = format!("{}0{}", "[".repeat(100), "]".repeat(100));
    let doc = chrome_doc(
        [
            format!(
                r#"{{"ph":"X","cat":"cpu_op","name":"aten::mm","ts":1,"dur":1,"args":{{"Input Dims":[[{zeros}]],"Input type":["float"]}}}}"#
            ),
            format!(
                r#"{{"ph":"X","cat":"cpu_op","name":"aten::mm","ts":2,"dur":1,"args":{{"Input Dims":{deep},"Input type":["float"]}}}}"#
            ),
        ]
        .into_iter(),
    );
    let t = assert_heap_bounded(&doc, "a long shape").unwrap();
    assert_eq!(t.tensors.len(), 1);
}
