//! The Python side reads two of these types: the options a traced process is handed
//! ([`CaptureOptions`], `MEMORY_TRACER_OPTIONS`, read by `_auto.py`, `_capture.py` and the
//! recorder fallback's `_history.py`) and
//! what `collector ingest --stats-json` prints ([`IngestStats`], read by the `MemoryTracer`
//! API in `_tracer.py`). Python has no copy of the types, so its readers are checked against
//! them here: every key Python reads is a field, and every option is read.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use protocol::frames::{CaptureOptions, IngestStats};
use std::collections::BTreeSet;

const PACKAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../collector/python/memory_tracer");

fn source(file: &str) -> String {
    std::fs::read_to_string(format!("{PACKAGE}/{file}")).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// The string keys after each `{receiver}.get("` or `{receiver}["` in `text`, for the given
/// receivers (whole names: `o` matches `int(o.get("x"` but not `foo.get("x"`).
fn keys_read(text: &str, receivers: &[&str]) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    for opener in [".get(\"", "[\""] {
        for (at, _) in text.match_indices(opener) {
            let before = &text[..at];
            let is_receiver =
                |r: &&str| before.strip_suffix(*r).is_some_and(|b| !b.ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == '.'));
            if !receivers.iter().any(is_receiver) {
                continue;
            }
            let rest = &text[at + opener.len()..];
            let key: String = rest.chars().take_while(|c| *c != '"').collect();
            keys.insert(key);
        }
    }
    keys
}

fn fields<T: serde::Serialize>(value: &T) -> BTreeSet<String> {
    match serde_json::to_value(value).unwrap() {
        serde_json::Value::Object(m) => m.keys().cloned().collect(),
        other => panic!("not an object: {other}"),
    }
}

#[test]
fn python_reads_exactly_the_capture_options() {
    let receivers = ["options", "self.options", "o", "_options()"];
    let mut read = keys_read(&source("_capture.py"), &receivers);
    read.extend(keys_read(&source("_auto.py"), &receivers));
    // The recorder fallback reads its own two (max_events, iteration_marker).
    let recorder = keys_read(&source("_history.py"), &receivers);
    assert!(recorder.contains("max_events"), "the scan found the recorder's reads: {recorder:?}");
    read.extend(recorder);
    let declared = fields(&CaptureOptions::default());
    let unknown: Vec<_> = read.difference(&declared).collect();
    assert!(unknown.is_empty(), "Python reads options CaptureOptions does not have: {unknown:?} (protocol/src/frames.rs)");
    let unread: Vec<_> = declared.difference(&read).collect();
    assert!(unread.is_empty(), "CaptureOptions has fields no Python code reads: {unread:?}");
}

#[test]
fn the_tracer_api_reads_only_fields_of_the_ingest_stats() {
    let read = keys_read(&source("_tracer.py"), &["self._need()"]);
    assert!(read.contains("layer_stats") && read.contains("summary"), "the scan found the API's reads: {read:?}");
    let trace = shared::Trace::new(shared::model::TraceMeta::new(shared::model::SourceFormat::MemoryTracer));
    let stats = fields(&IngestStats::of(&trace, std::path::Path::new("t.mtrace.json")));
    let unknown: Vec<_> = read.difference(&stats).collect();
    assert!(unknown.is_empty(), "MemoryTracer reads keys IngestStats lacks: {unknown:?} (protocol/src/frames.rs)");
}

#[test]
fn the_scan_finds_reads_and_skips_other_receivers() {
    let text = r#"int(o.get("a", 1)); self.options.get("b"); seg.get("c"); x = options["d"]; _options().get("e"); foo.get("f")"#;
    let keys = keys_read(text, &["options", "self.options", "o", "_options()"]);
    assert_eq!(keys, ["a", "b", "d", "e"].map(String::from).into_iter().collect());
}
