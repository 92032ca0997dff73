//! Every wire type survives JSON both ways unchanged, and the shapes other programs depend on
//! (the viewer, `collector trace --progress-json` readers, EventSource listeners, scripts)
//! stay as they are spelled here.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use protocol::*;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::json;
use std::collections::BTreeMap;

/// `value` → JSON → value again is the same, and its JSON is `expected` when given.
fn round_trip<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(value: &T) -> serde_json::Value {
    let text = serde_json::to_string(value).unwrap();
    let back: T = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
    assert_eq!(&back, value, "{text}");
    serde_json::from_str(&text).unwrap()
}

/// Times and sizes in seconds and MB cross to the viewer and to clients exactly: the same bits
/// back (the viewer looks answers up by the bits of their window). Without serde_json's
/// `float_roundtrip`, about one in ten of these came back one unit in the last place off.
#[test]
fn numbers_cross_json_to_the_bit() {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut off = Vec::new();
    for _ in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let v = (x % 10_000_000_000) as f64 / 1e9 * 1.234567;
        let back: f64 = serde_json::from_str(&serde_json::to_string(&v).unwrap()).unwrap();
        if back.to_bits() != v.to_bits() {
            off.push((v, back));
        }
    }
    assert!(off.is_empty(), "{} of 20000 read back changed, as {:?}", off.len(), &off[..off.len().min(3)]);
    let mut info = info();
    info.tracing_time_ms = 10.993402306909223;
    round_trip(&info);
}

fn info() -> TraceInfo {
    let layer = LayerStatsBody {
        layer_name: "encoder.0".into(),
        peak_allocated: 1 << 30,
        peak_reserved: 3 << 29,
        total_allocations: 12,
        total_deallocations: 11,
        avg_fragmentation: 0.25,
        duration_ms: 1.5,
    };
    TraceInfo {
        model_name: "resnet18".into(),
        total_events: 2048,
        total_layers: 1,
        peak_allocated_mb: 1024.0,
        peak_reserved_mb: 1536.0,
        avg_fragmentation: 0.125,
        tracing_time_ms: 812.5,
        layer_stats: BTreeMap::from([("encoder.0".to_owned(), layer)]),
        peak_allocated_bytes: 1 << 30,
        peak_reserved_bytes: 3 << 29,
        device: Some("cuda:0".into()),
        source_format: "pytorch_snapshot".into(),
        dropped_events: 3,
    }
}

fn response() -> TraceResponse {
    TraceResponse { trace_id: "t-1".into(), info: info() }
}

#[test]
fn trace_records_round_trip() {
    let v = round_trip(&response());
    // `info` is flattened into the answer, as the seed service answered.
    assert_eq!(v["trace_id"], "t-1");
    assert_eq!(v["peak_allocated_bytes"], 1u64 << 30);
    let stored = StoredTrace {
        trace_id: "t-1".into(),
        created_unix_ms: 1_700_000_000_000,
        origin: Origin::Uploaded,
        file: "t-1.pickle".into(),
        original_name: Some("run.pickle".into()),
        file_size_bytes: 4096,
        exports: BTreeMap::from([("csv".to_owned(), ExportFile { file: "t-1.csv".into(), file_size_bytes: 10 })]),
        info: info(),
    };
    assert_eq!(round_trip(&stored)["origin"], "uploaded");
    assert_eq!(TraceResponse::from(&stored), response());
    round_trip(&WorkerAnswer::Imported(Box::new(info())));
    assert_eq!(round_trip(&WorkerAnswer::Exported { file_size_bytes: 7 }), json!({"exported": {"file_size_bytes": 7}}));
    assert_eq!(round_trip(&WorkerAnswer::Error("bad".into())), json!({"error": "bad"}));
    assert_eq!(round_trip(&ErrorBody { detail: "Trace x not found".into() }), json!({"detail": "Trace x not found"}));
}

#[test]
fn child_lines_keep_their_shape() {
    let lines = [
        (ChildLine::Started { iterations: 3 }, json!({"kind": "started", "iterations": 3})),
        (ChildLine::Iteration { done: 1, of: 3, seconds: 0.5 }, json!({"kind": "iteration", "done": 1, "of": 3, "seconds": 0.5})),
        (ChildLine::Memory { points: vec![[1, 2, 3]], rank: None }, json!({"kind": "memory", "points": [[1, 2, 3]]})),
        (ChildLine::Memory { points: vec![[1, 2, 3]], rank: Some(1) }, json!({"kind": "memory", "points": [[1, 2, 3]], "rank": 1})),
        (
            ChildLine::Error { class: FailureClass::OutOfMemory, detail: "CUDA out of memory".into() },
            json!({"kind": "error", "class": "out_of_memory", "detail": "CUDA out of memory"}),
        ),
        (
            ChildLine::Error { class: FailureClass::NoCuda, detail: "no GPU".into() },
            json!({"kind": "error", "class": "no_cuda", "detail": "no GPU"}),
        ),
    ];
    for (line, expected) in lines {
        assert_eq!(round_trip(&line), expected);
    }
    assert_eq!(round_trip(&ChildLine::Done { info: info() })["kind"], "done");
    for class in [FailureClass::NoCuda, FailureClass::Invalid, FailureClass::OutOfMemory, FailureClass::Model, FailureClass::Internal] {
        round_trip(&class);
    }
}

#[test]
fn live_events_name_their_kind() {
    let events = [
        LiveEvent::Status { state: JobState::Queued, device: "cuda:0".into(), model: "gpt".into() },
        LiveEvent::Started { iterations: 2 },
        LiveEvent::Iteration { done: 2, of: 2, seconds: 1.0 },
        LiveEvent::Memory { points: vec![[0, 1, 2]], rank: Some(0) },
        LiveEvent::Done { trace: response() },
        LiveEvent::Failed { status: 422, detail: "bad shape".into() },
    ];
    for e in events {
        let v = round_trip(&e);
        // The JSON's `kind` is the SSE event name the viewer listens for.
        assert_eq!(v["kind"], e.kind());
        assert_eq!(e.is_terminal(), matches!(e.kind(), "done" | "failed"));
    }
    let status = round_trip(&LiveEvent::Status { state: JobState::Running, device: "cpu".into(), model: "mlp".into() });
    assert_eq!(status, json!({"kind": "status", "state": "running", "device": "cpu", "model": "mlp"}));
    for s in [JobState::Queued, JobState::Running, JobState::Done, JobState::Failed] {
        assert_eq!(round_trip(&s), json!(s.as_str()));
    }
    for o in [Origin::Traced, Origin::Uploaded] {
        assert_eq!(round_trip(&o), json!(o.as_str()));
    }
}

#[test]
fn requests_take_their_defaults() {
    let req: TraceRequest = serde_json::from_value(json!({"model_name": "resnet18"})).unwrap();
    assert_eq!(req.max_events, TraceRequest::DEFAULT_MAX_EVENTS);
    assert!(req.enable_fragmentation);
    assert_eq!(req.input_shape, None);
    // `of_model` is what a request naming only the model (and `max_events`) parses to.
    assert_eq!(TraceRequest::of_model("resnet18", TraceRequest::DEFAULT_MAX_EVENTS), req);
    let full = TraceRequest {
        model_name: "gpt".into(),
        input_shape: Some(vec![4, 128]),
        batch_size: Some(4),
        max_events: 1_000_000,
        enable_fragmentation: false,
        device: Some("cuda:1".into()),
        mode: Some("infer".into()),
        iterations: Some(5),
        optimizer: Some("adamw".into()),
        world_size: Some(2),
        strategy: Some("fsdp".into()),
    };
    round_trip(&full);
    round_trip(&LiveRequest { model_name: "train.py".into(), device: None, job: None, nnodes: None, node_rank: None, node_wait_s: None });
    round_trip(&LiveRequest {
        model_name: "train.py".into(),
        device: Some("live".into()),
        job: Some("torchrun:h:1".into()),
        nnodes: Some(2),
        node_rank: Some(1),
        node_wait_s: Some(5),
    });
    let old: LiveRequest = serde_json::from_str(r#"{"model_name": "train.py", "device": null}"#).unwrap();
    assert_eq!((old.job, old.nnodes, old.node_rank), (None, None, None), "old clients' requests still read");
    round_trip(&NodePartAccepted { trace_id: "t".into(), node: 1, status: "waiting".into(), waiting_for: vec![0], wait_s: 300 });
    round_trip(&LiveLineQuery { node: Some(1) });
    round_trip(&LiveAccepted { trace_id: "t".into(), status: "running".into() });
    round_trip(&WaitQuery { wait: Some(false) });
    round_trip(&JobAccepted { trace_id: "t".into(), status: "queued".into(), events_url: "/e".into(), trace_url: "/t".into() });
    round_trip(&DiffRequest { a: "a".into(), b: "b".into(), device_a: Some(1), device_b: None });
    round_trip(&ExportRequest { trace_id: "t".into(), format: "csv".into() });
    round_trip(&ExportResponse { trace_id: "t".into(), format: "csv".into(), download_url: "/d".into(), file_size_bytes: 9 });
    round_trip(&UploadQuery { filename: Some("a.pickle".into()), trace_id: None, node: None });
    round_trip(&AdviceQuery { budget: Some("6GiB".into()), top: Some(3) });
}

#[test]
fn lists_round_trip() {
    let row = TraceRow {
        trace_id: "t".into(),
        model_name: "m".into(),
        origin: Origin::Traced,
        original_name: None,
        created_unix_ms: 1,
        file_size_bytes: 2,
        total_events: 3,
        peak_allocated_bytes: 4,
        peak_reserved_bytes: 5,
        device: Some("cpu".into()),
        source_format: "memory_tracer".into(),
    };
    round_trip(&ListResponse { active_traces: vec!["t".into()], count: 1, traces: vec![row] });
    round_trip(&DeleteResponse { message: "gone".into(), remaining_traces: 0 });
    let job = JobRow {
        trace_id: "t".into(),
        state: JobState::Failed,
        model_name: "m".into(),
        device: "cpu".into(),
        iterations_done: 1,
        iterations: 3,
        age_s: 2.5,
        error: Some("out of memory".into()),
        world_size: 2,
        strategy: Some("ddp".into()),
    };
    round_trip(&JobsResponse { jobs: vec![job], running: 0, queued: 0 });
    round_trip(&HealthResponse {
        status: "healthy".into(),
        device: "cpu".into(),
        version: "0.1.0".into(),
        cuda_available: false,
        cuda_device_count: 0,
        tracing_available: true,
        torch_version: Some("2.11.0".into()),
        jobs_running: 0,
        jobs_queued: 0,
        stored_traces: 1,
        store_bytes: 10,
        models: vec!["mlp".into()],
    });
}

#[test]
fn out_of_memory_is_recognised_in_every_wording() {
    for m in [
        "CUDA out of memory. Tried to allocate 2.00 GiB",
        "torch.OutOfMemoryError: CUDA error",
        "DefaultCPUAllocator: not enough memory: you tried to allocate 1099511627776 bytes.",
        "DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes",
    ] {
        assert!(is_out_of_memory(m), "{m}");
        assert_eq!(FailureClass::of_torch_error(m), FailureClass::OutOfMemory);
    }
    assert_eq!(FailureClass::of_torch_error("shape '[2, 3]' is invalid for input of size 4"), FailureClass::Model);
}

#[test]
fn trace_info_agrees_with_the_summary() {
    let raw = std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/mlp_adam_3steps.pickle")).unwrap();
    let trace = shared::import(&raw, &shared::ImportOptions::default()).unwrap();
    let s = shared::analysis::summary(&trace);
    let i = trace_info(&trace, "fallback", 12.0);
    assert_eq!(i.peak_allocated_bytes, s.peak_allocated_bytes);
    assert_eq!(i.peak_reserved_bytes, s.peak_reserved_bytes);
    assert_eq!(i.total_events, s.total_events);
    assert_eq!(i.peak_allocated_mb, s.peak_allocated_bytes as f64 / 1048576.0);
    assert_eq!(i.tracing_time_ms, 12.0);
    // Through a JSON value: serde_json's text parser may round the last digit of a float.
    let back: TraceInfo = serde_json::from_value(serde_json::to_value(&i).unwrap()).unwrap();
    assert_eq!(back, i);
}
