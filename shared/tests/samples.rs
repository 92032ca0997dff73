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
    let allocated: u64 = segs.iter().flat_map(|s| &s.blocks).filter(|b| b.state == BlockState::Allocated).map(|b| b.size_bytes).sum();
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
    let mem: Vec<&serde_json::Value> = json["traceEvents"].as_array().unwrap().iter().filter(|e| e["name"] == "[memory]").collect();
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

#[test]
fn chrome_memory_events_belong_to_the_slice_open_at_their_time() {
    // An allocation inside aten::relu, which ends before aten::linear starts; a free inside a
    // backward node on another thread; one event outside any slice.
    let json = br#"{"traceEvents": [
      {"ph": "X", "cat": "cpu_op", "name": "aten::relu", "tid": 1, "ts": 10, "dur": 10},
      {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "tid": 1, "ts": 30, "dur": 10},
      {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: ReluBackward0", "tid": 2, "ts": 50, "dur": 10},
      {"ph": "i", "name": "[memory]", "tid": 1, "ts": 15, "args": {"Bytes": 1024, "Total Allocated": 1024, "Total Reserved": 2097152, "Device Type": 1, "Device Id": 0, "Addr": 4096}},
      {"ph": "i", "name": "[memory]", "tid": 2, "ts": 55, "args": {"Bytes": -1024, "Total Allocated": 0, "Total Reserved": 2097152, "Device Type": 1, "Device Id": 0, "Addr": 4096}},
      {"ph": "i", "name": "[memory]", "tid": 1, "ts": 70, "args": {"Bytes": 512, "Total Allocated": 512, "Total Reserved": 2097152, "Device Type": 1, "Device Id": 0, "Addr": 8192}}
    ]}"#;
    let t = import(json, &ImportOptions::default()).unwrap();
    let ev: Vec<_> = t.memory_events().collect();
    assert_eq!(ev[0].layer_name, Some("aten::relu"));
    assert_eq!(ev[0].phase, Phase::Forward);
    assert_eq!(ev[1].layer_name, Some("autograd::engine::evaluate_function: ReluBackward0"));
    assert_eq!(ev[1].phase, Phase::Backward);
    assert_eq!(ev[1].event_type, EventType::Free);
    assert_eq!(ev[2].layer_name, None);
    assert_eq!(ev[2].phase, Phase::Other);
    assert_eq!(ev[2].allocated_bytes, 512);
    assert_eq!(ev[0].reserved_bytes, 2097152);
    assert!((ev[0].fragmentation_ratio - (2097152.0 - 1024.0) / 2097152.0).abs() < 1e-12);
    assert_eq!(t.ops.iter().find(|o| t.str(o.name) == "aten::linear").unwrap().phase, Phase::Forward);
}

#[test]
fn dftracer_spans_resolve_hashes_and_phases() {
    let trace = import(&data("dftracer_sample.pfw.gz"), &ImportOptions::default()).unwrap();
    assert_eq!(trace.meta.source_format, SourceFormat::Dftracer);
    let names: Vec<&str> = trace.scopes.iter().map(|s| trace.str(s.name)).collect();
    // dftracer_sample.gen.py: 2 epochs × 3 steps of fetch, forward, backward, optimizer_step.
    for (name, phase) in [
        ("compute:forward", Phase::Forward),
        ("compute:backward", Phase::Backward),
        ("compute:optimizer_step", Phase::Optimizer),
        ("data:fetch", Phase::Other),
    ] {
        let spans: Vec<_> = trace.scopes.iter().filter(|s| trace.str(s.name) == name).collect();
        assert_eq!(spans.len(), 6, "{name}");
        assert!(spans.iter().all(|s| s.phase == phase && s.end_ns > s.start_ns), "{name}");
    }
    assert!(names.iter().any(|n| n.starts_with("POSIX:read [/tmp/dftrun/data/shard")), "{names:?}");
    assert_eq!(trace.events.len(), 0);
}

/// Leak detection on real snapshots: iterations come from the `Optimizer.step` annotations;
/// 3 Adam steps hold allocated memory flat (no leak), 2 SGD steps are too few to tell.
#[test]
fn snapshots_leak_nothing_and_say_so() {
    let t = shared::import(&data("mlp_adam_3steps.pickle"), &shared::ImportOptions::default()).unwrap();
    let r = shared::analysis::leaks::leaks(&t, 5);
    assert_eq!((r.iterations, r.iterations_from.as_str(), r.warmup), (3, "optimizer steps", 1));
    assert!(!r.leaking);
    assert_eq!(r.growth_per_iteration_bytes, 0);
    assert!(r.verdict.starts_with("no steady growth"), "{}", r.verdict);
    let t = shared::import(&data("resnet18_sgd_2steps.pickle"), &shared::ImportOptions::default()).unwrap();
    let r = shared::analysis::leaks::leaks(&t, 5);
    assert!(r.verdict.starts_with("not enough iterations to tell (2 found"), "{}", r.verdict);
}

/// A snapshot whose trace buffer wrapped holds annotations from long before its first entry
/// (`tests/data/wrapped_annotations.gen.py` adds them, and some after its last, to the MLP
/// sample): only what falls within the entries' time is kept, cut there, so the timeline,
/// the layers and the iterations are those of the memory data.
#[test]
fn annotations_outside_the_trace_entries_are_left_out() {
    let plain = import(&data("mlp_adam_3steps.pickle"), &ImportOptions::default()).unwrap();
    let wrapped = import(&data("wrapped_annotations.pickle"), &ImportOptions::default()).unwrap();
    assert_eq!(wrapped.events.ts_ns, plain.events.ts_ns);
    let (a, b) = (summary(&plain), summary(&wrapped));
    assert_eq!((b.peak_allocated_bytes, b.peak_time_s), (a.peak_allocated_bytes, a.peak_time_s));
    assert_eq!(b.duration_s, a.duration_s, "the trace spans its entries, not its annotations");
    assert_eq!(wrapped.start_ns(), plain.start_ns());
    // The 110 spans wholly outside are gone; the two that cross an end are cut there.
    let (first, last) = (*plain.events.ts_ns.first().unwrap(), *plain.events.ts_ns.last().unwrap());
    assert_eq!(wrapped.scopes.len(), plain.scopes.len() + 2);
    let cut = |name: &str| wrapped.scopes.iter().find(|s| wrapped.str(s.name) == name).map(|s| (s.start_ns, s.end_ns));
    assert_eq!(cut("data loading"), Some((first, first + 1_000_000)));
    assert_eq!(cut("evaluation"), Some((last - 1_000_000, last)));
    for s in &wrapped.scopes {
        assert!(s.start_ns >= first && s.end_ns <= last, "{} at {}..{}", wrapped.str(s.name), s.start_ns, s.end_ns);
    }
    assert!(wrapped.meta.warnings.iter().any(|w| w.starts_with("110 annotated spans outside")), "{:?}", wrapped.meta.warnings);
    let iterations = |t: &shared::Trace| shared::analysis::leaks::leaks(t, 3).iterations;
    assert_eq!(iterations(&wrapped), iterations(&plain), "iterations counted only where there is memory data");
}

fn shape_fact(sample: &str, key: &str) -> u64 {
    let facts: serde_json::Value = serde_json::from_slice(&data("shape_facts.json")).unwrap();
    facts["samples"][sample][key].as_u64().unwrap_or_else(|| panic!("shape_facts.json lacks {sample}.{key}"))
}

/// A real snapshot with `expandable_segments:True` (`tests/gpu/shape_snapshots.py`): its
/// segments grow by `segment_map` entries inside their ranges, so what existed before
/// recording is each final segment less the ranges the entries map. Counting the whole final
/// segment as there from the start gave 230 MiB reserved where PyTorch counted 126 MiB.
#[test]
fn an_expandable_segments_snapshot_reserves_what_pytorch_counted() {
    let name = "expandable_mlp.pickle";
    let trace = import(&data(name), &ImportOptions::default()).unwrap();
    let s = summary(&trace);
    assert_eq!(s.peak_allocated_bytes, shape_fact(name, "max_allocated"), "max_allocated");
    assert_eq!(s.peak_reserved_bytes, shape_fact(name, "max_reserved"), "max_reserved");
    assert_eq!(s.final_allocated_bytes, shape_fact(name, "end_allocated"), "end_allocated");
    assert_eq!(s.final_reserved_bytes, shape_fact(name, "end_reserved"), "end_reserved");
    // The replay ends in the snapshot's own state: every final block, at its address.
    let segs = segments_at(&trace, trace.events.len() - 1, 0);
    let reserved: u64 = segs.iter().map(|s| s.size_bytes).sum();
    assert_eq!(reserved, shape_fact(name, "end_reserved"));
}

/// A real snapshot whose recorder wrapped (2000 entries of 200 steps): its end state is
/// exact, its window's peak is PyTorch's (the steps repeat), and the annotations from before
/// the window are left out.
#[test]
fn a_wrapped_recorders_snapshot_ends_in_pytorchs_state() {
    let name = "wrapped_mlp.pickle";
    let trace = import(&data(name), &ImportOptions::default()).unwrap();
    let s = summary(&trace);
    // The buffer's 2000 entries (counted from a second snapshot taken just after).
    assert!(trace.events.len().abs_diff(shape_fact(name, "entries") as usize) <= 2, "{} events", trace.events.len());
    assert_eq!(s.peak_allocated_bytes, shape_fact(name, "max_allocated"), "max_allocated");
    assert_eq!(s.final_allocated_bytes, shape_fact(name, "end_allocated"), "end_allocated");
    assert_eq!(s.final_reserved_bytes, shape_fact(name, "end_reserved"), "end_reserved");
    assert!(trace.meta.warnings.iter().any(|w| w.contains("annotated spans outside the trace entries' time")), "{:?}", trace.meta.warnings);
    let first = *trace.events.ts_ns.first().unwrap();
    assert!(trace.scopes.iter().all(|sc| sc.start_ns >= first), "a scope before the first entry");
    // Batches of 64, 96 and 128 in turn leave 128, 192 and 256 KiB of input alive at the
    // steps' ends: a median step of +64 KiB, but no growth over the window, so no leak.
    let leaks = shared::analysis::leaks::leaks(&trace, 3);
    assert!(!leaks.leaking, "{}", leaks.verdict);
}
