//! The real samples in `tests/data/` (recorded with PyTorch 2.11 on an H100) import, and the
//! peaks computed from them equal what PyTorch's own counters reported (`facts.json`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches fail loudly by design

use shared::analysis::{layer_stats, segments_at, summary};
use shared::model::{BlockState, EventType, Phase, SourceFormat};
use shared::{import, ImportOptions};
use std::path::PathBuf;

fn data(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data").join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

fn fact(sample: &str, key: &str) -> u64 {
    let facts: serde_json::Value = serde_json::from_slice(&data("facts.json")).unwrap();
    facts["samples"][sample][key].as_u64().unwrap_or_else(|| panic!("facts.json lacks {sample}.{key}"))
}

#[test]
fn snapshot_peaks_match_pytorch_counters_exactly() {
    for sample in ["mlp_adam_3steps.pickle", "resnet18_sgd_2steps.pickle"] {
        let trace = import(&data(sample), &ImportOptions::default()).unwrap();
        assert_eq!(trace.meta.source_format, SourceFormat::PytorchSnapshot);
        let s = summary(&trace);
        assert_eq!(s.peak_allocated_bytes, fact(sample, "max_allocated"), "{sample}: max_allocated");
        assert_eq!(s.peak_reserved_bytes, fact(sample, "max_reserved"), "{sample}: max_reserved");
        assert_eq!(s.final_allocated_bytes, fact(sample, "end_allocated"), "{sample}: end_allocated");
        assert_eq!(s.final_reserved_bytes, fact(sample, "end_reserved"), "{sample}: end_reserved");
    }
}

#[test]
fn snapshot_replay_ends_in_the_recorded_final_state() {
    // The segments replayed to the last event must be the snapshot's own `segments`.
    let trace = import(&data("resnet18_sgd_2steps.pickle"), &ImportOptions::default()).unwrap();
    let segs = segments_at(&trace, trace.events.len() - 1, 0);
    let reserved: u64 = segs.iter().map(|s| s.size_bytes).sum();
    let allocated: u64 = segs
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state == BlockState::Allocated)
        .map(|b| b.size_bytes)
        .sum();
    assert_eq!(reserved, fact("resnet18_sgd_2steps.pickle", "end_reserved"));
    assert_eq!(allocated, fact("resnet18_sgd_2steps.pickle", "end_allocated"));
    assert_eq!(segs.len(), 25);
}

#[test]
fn snapshot_events_carry_phases_stacks_and_optimizer_layer() {
    let trace = import(&data("mlp_adam_3steps.pickle"), &ImportOptions::default()).unwrap();
    let ev = &trace.events;
    let allocs = (0..ev.len()).filter(|&i| ev.event_type(i) == EventType::Alloc).count();
    assert_eq!(allocs, 108);
    assert!((0..ev.len()).all(|i| ev.event_type(i) != EventType::Alloc || trace.stacks.stack_of_event(i).is_some()));
    assert!((0..ev.len()).any(|i| ev.phase(i) == Phase::Backward));
    assert!((0..ev.len()).any(|i| ev.phase(i) == Phase::Optimizer));
    let stats = layer_stats(&trace);
    let adam = &stats["Optimizer.step#Adam.step"];
    assert!(adam.total_allocations > 0 && adam.duration_ms > 0.0, "{adam:?}");
}

#[test]
fn chrome_trace_memory_matches_its_own_totals() {
    let raw = data("convnet_profiler_trace.json");
    let trace = import(&raw, &ImportOptions::default()).unwrap();
    assert_eq!(trace.meta.source_format, SourceFormat::ChromeTrace);
    let json: serde_json::Value = serde_json::from_slice(&raw).unwrap();
    let mem: Vec<&serde_json::Value> =
        json["traceEvents"].as_array().unwrap().iter().filter(|e| e["name"] == "[memory]").collect();
    let max_alloc = mem.iter().map(|e| e["args"]["Total Allocated"].as_u64().unwrap()).max().unwrap();
    let max_res = mem.iter().map(|e| e["args"]["Total Reserved"].as_u64().unwrap()).max().unwrap();
    let s = summary(&trace);
    assert_eq!(s.total_events, mem.len());
    assert_eq!(s.peak_allocated_bytes, max_alloc);
    assert_eq!(s.peak_reserved_bytes, max_res);
    assert_eq!(trace.meta.device_name.as_deref(), Some("NVIDIA H100 80GB HBM3"));
    let cpu_ops = json["traceEvents"].as_array().unwrap().iter().filter(|e| e["cat"] == "cpu_op").count();
    assert_eq!(trace.ops.len(), cpu_ops);
    assert!(trace.ops.iter().any(|o| o.phase == Phase::Backward));
    assert!(trace.ops.iter().any(|o| o.phase == Phase::Optimizer));
    assert!(trace.ops.iter().any(|o| o.phase == Phase::Forward));
}

#[test]
fn every_pickle_protocol_imports_to_the_same_trace() {
    use shared::export::{export, ExportFormat};
    let native = |raw: &[u8]| {
        let mut out = Vec::new();
        export(&import(raw, &ImportOptions::default()).unwrap(), ExportFormat::Native, &mut out).unwrap();
        out
    };
    let reference = native(&data("mlp_adam_3steps.pickle"));
    for proto in [2, 3, 5] {
        let raw = data(&format!("mlp_adam_3steps.protocol{proto}.pickle"));
        assert_eq!(raw[1], proto, "fixture is not protocol {proto}");
        assert!(native(&raw) == reference, "protocol {proto} imports differently");
    }
}
