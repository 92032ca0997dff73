//! The trace diff: two hand-built traces whose differences are worked out here (peaks, layer
//! rows, classes, operators, curves), a trace against itself, real samples against each other
//! and across formats, two ranks of one merged trace, and inputs with nothing in them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use shared::analysis::diff::{
    diff, diff_devices, Alignment, ClassBytes, ClassSide, DiffError, OpCount, Presence, Side, TraceDiff, CURVE_POINTS,
};
use shared::analysis::profile::TensorClass;
use shared::model::{Device, EventRecord, EventType, IterationSpan, OperatorEvent, Phase, SourceFormat, StrId, TensorRef, TraceMeta};
use shared::ranks::merge::{merge, MergeInput};
use shared::{import, ImportOptions, Trace};
use std::path::PathBuf;

const W: u64 = 0x1000; // weight, 1000 B, before the iteration
const A1: u64 = 0x2000; // linear output, 200 B, read only in forward (OTHER)
const A2: u64 = 0x3000; // relu output, read in backward (ACT)
const E: u64 = 0x4000; // the side's extra allocation, in its own layer

/// What makes one hand-built side differ from the other.
struct Spec {
    act_bytes: u64,
    reserved_bytes: u64,
    extra_layer: &'static str,
    extra_bytes: u64,
    extra_op: &'static str,
    extra_op_count: u64,
}

const SPEC_A: Spec =
    Spec { act_bytes: 3000, reserved_bytes: 1 << 20, extra_layer: "old", extra_bytes: 500, extra_op: "aten::dropout", extra_op_count: 2 };
const SPEC_B: Spec =
    Spec { act_bytes: 5000, reserved_bytes: 2 << 20, extra_layer: "new", extra_bytes: 2000, extra_op: "aten::gelu", extra_op_count: 3 };

struct Builder {
    trace: Trace,
}

impl Builder {
    fn mem(&mut self, ts_ns: u64, event_type: EventType, address: u64, size_bytes: u64, phase: Phase, layer: &str) {
        let layer = if layer.is_empty() { StrId::NONE } else { self.trace.strings.intern(layer) };
        self.trace.events.push(EventRecord { ts_ns, event_type, phase, size_bytes, address, layer, device: 0, stream: 0, totals: None });
    }

    fn tensors(&mut self, list: &[(u64, u64)]) -> (u32, u32) {
        let start = self.trace.tensors.len() as u32;
        self.trace.tensors.extend(list.iter().map(|&(storage_id, size_bytes)| TensorRef { storage_id, size_bytes, shape: u32::MAX }));
        (start, self.trace.tensors.len() as u32)
    }

    fn op(&mut self, name: &str, phase: Phase, layer: &str, (start_ns, end_ns): (u64, u64), inputs: &[(u64, u64)], outputs: &[(u64, u64)]) {
        let (name, layer) = (self.trace.strings.intern(name), self.trace.strings.intern(layer));
        let (inputs, outputs) = (self.tensors(inputs), self.tensors(outputs));
        self.trace.ops.push(OperatorEvent { name, phase, seq_nr: -1, start_ns, end_ns, thread: 1, fwd_thread: 0, layer, inputs, outputs });
    }
}

/// One training iteration `[5, 100]` ns on cuda:0: a weight before it, linear → relu in
/// forward, relu's output read in backward, then the side's extra allocation and operators.
/// Allocated after each event: 1000 (W), 1200 (A1), 1200 + act (A2, the peak), 1200, 1000,
/// then 1000 + extra.
fn hand_built(s: &Spec) -> Trace {
    let mut b = Builder { trace: Trace::new(TraceMeta::new(SourceFormat::MemoryTracer)) };
    b.trace.device_index(Device { kind: "cuda".into(), index: 0, rank: None });
    b.trace.stream_index("default");
    b.mem(1, EventType::SegmentAlloc, 0x10_0000, s.reserved_bytes, Phase::Other, "");
    b.mem(2, EventType::Alloc, W, 1000, Phase::Other, "fc1");
    b.op("aten::linear", Phase::Forward, "fc1", (10, 20), &[(W, 1000)], &[(A1, 200)]);
    b.mem(15, EventType::Alloc, A1, 200, Phase::Forward, "fc1");
    b.op("aten::relu", Phase::Forward, "fc2", (30, 40), &[(A1, 200)], &[(A2, s.act_bytes)]);
    b.mem(35, EventType::Alloc, A2, s.act_bytes, Phase::Forward, "fc2");
    b.op("aten::threshold_backward", Phase::Backward, "fc2", (50, 60), &[(A2, s.act_bytes)], &[]);
    b.mem(65, EventType::Free, A2, s.act_bytes, Phase::Backward, "fc2");
    b.mem(66, EventType::Free, A1, 200, Phase::Backward, "fc1");
    b.mem(70, EventType::Alloc, E, s.extra_bytes, Phase::Other, s.extra_layer);
    for k in 0..s.extra_op_count {
        b.op(s.extra_op, Phase::Other, s.extra_layer, (72 + 4 * k, 74 + 4 * k), &[], &[]);
    }
    b.trace.iterations.push(IterationSpan { index: 0, start_ns: 5, end_ns: 100 });
    b.trace
}

fn data(name: &str) -> Vec<u8> {
    std::fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data").join(name)).unwrap()
}

fn load(name: &str) -> Trace {
    import(&data(name), &ImportOptions::default()).unwrap()
}

fn fact(sample: &str, key: &str) -> u64 {
    let facts: serde_json::Value = serde_json::from_slice(&data("facts.json")).unwrap();
    facts["samples"][sample][key].as_u64().unwrap()
}

const RESNET: &str = "resnet18_sgd_2steps.pickle";
const MLP: &str = "mlp_adam_3steps.pickle";

/// The diff survives JSON (what the server sends and the viewer reads); floats may move in
/// their last digit (serde_json's default parser), everything else comes back as it was.
fn round_trip(d: &TraceDiff) {
    let back: TraceDiff = serde_json::from_str(&serde_json::to_string(d).unwrap()).unwrap();
    let bytes =
        |t: &TraceDiff| (t.a.peak_allocated_bytes, t.b.peak_allocated_bytes, t.peak_allocated_delta_bytes, t.peak_reserved_delta_bytes);
    assert_eq!(bytes(&back), bytes(d));
    assert!(
        back.layers == d.layers
            && back.layers_match == d.layers_match
            && back.classes == d.classes
            && back.ops == d.ops
            && back.notes == d.notes
    );
    let maxima =
        |c: &[shared::analysis::diff::CurvePoint]| c.iter().map(|p| (p.allocated_min_bytes, p.allocated_max_bytes)).collect::<Vec<_>>();
    assert_eq!((maxima(&back.curves.a), maxima(&back.curves.b)), (maxima(&d.curves.a), maxima(&d.curves.b)));
}

fn curve_peak(points: &[shared::analysis::diff::CurvePoint]) -> u64 {
    points.iter().map(|p| p.allocated_max_bytes).max().unwrap_or(0)
}

#[test]
fn hand_built_peaks_and_when() {
    let d = diff(&hand_built(&SPEC_A), &hand_built(&SPEC_B));
    round_trip(&d);
    assert_eq!((d.a.peak_allocated_bytes, d.b.peak_allocated_bytes), (4200, 6200));
    assert_eq!((d.a.peak_reserved_bytes, d.b.peak_reserved_bytes), (1 << 20, 2 << 20));
    assert_eq!(d.peak_allocated_delta_bytes, 2000);
    assert_eq!(d.peak_reserved_delta_bytes, 1 << 20);
    for side in [&d.a, &d.b] {
        // The trace starts at its first event (1 ns); the peak is at 35 ns, 30 ns into [5, 100].
        assert!((side.peak_time_s - 34e-9).abs() < 1e-15, "{}", side.peak_time_s);
        let at = side.peak_in_iteration.unwrap();
        assert_eq!(at.iteration, 0);
        assert!((at.since_start_s - 30e-9).abs() < 1e-15 && (at.fraction - 30.0 / 95.0).abs() < 1e-12, "{at:?}");
        assert_eq!((side.iterations, side.iterations_from.as_str()), (1, "iteration marks"));
        assert_eq!((side.device.as_deref(), side.device_index, side.devices), (Some("cuda:0"), Some(0), 1));
        assert_eq!(side.events, 7);
        assert_eq!(side.source_format, "memory_tracer");
    }
    // Reserved but unallocated at the peak: 1 MiB − 4200 and 2 MiB − 6200.
    assert_eq!(d.a.unused_reserved_at_peak_bytes, (1 << 20) - 4200);
    assert_eq!(d.b.unused_reserved_at_peak_bytes, (2 << 20) - 6200);
}

#[test]
fn hand_built_layer_rows_by_change() {
    let d = diff(&hand_built(&SPEC_A), &hand_built(&SPEC_B));
    let rows: Vec<(&str, Presence, i64, i64, i64)> = d
        .layers
        .iter()
        .map(|r| (r.layer_name.as_str(), r.presence, r.peak_delta_bytes, r.allocated_delta_bytes, r.allocations_delta))
        .collect();
    assert_eq!(
        rows,
        [
            ("new", Presence::OnlyB, 3000, 2000, 1),
            ("fc2", Presence::Both, 2000, 2000, 0),
            ("old", Presence::OnlyA, -1500, -500, -1),
            ("fc1", Presence::Both, 0, 0, 0),
        ]
    );
    let fc2 = &d.layers[1];
    assert_eq!((fc2.a.unwrap().peak_allocated_bytes, fc2.b.unwrap().peak_allocated_bytes), (4200, 6200));
    assert_eq!((fc2.a.unwrap().allocated_bytes, fc2.b.unwrap().allocated_bytes), (3000, 5000));
    let fc1 = &d.layers[3];
    assert_eq!((fc1.a.unwrap().allocations, fc1.a.unwrap().allocated_bytes, fc1.a.unwrap().peak_allocated_bytes), (2, 1200, 1200));
    assert!(d.layers[0].a.is_none() && d.layers[2].b.is_none());
    assert!(!d.layers_match);
    // Half of the five layers are common: a mismatch, not a different model.
    let note = d.notes.iter().find(|n| n.starts_with("the layers do not match")).unwrap();
    assert_eq!(note, "the layers do not match: 1 of 3 layers of A are not in B and 1 of 3 layers of B are not in A");
}

#[test]
fn hand_built_classes_and_operators() {
    let d = diff(&hand_built(&SPEC_A), &hand_built(&SPEC_B));
    // At relu (rank 1), the peak: the weight, relu's output (read in backward) and linear's.
    let side = |act| ClassSide::Available {
        rank: 1,
        node_name: "aten::relu".into(),
        total_allocated_bytes: 1200 + act,
        bytes: ClassBytes { weights_bytes: 1000, gradients_bytes: 0, optimizer_state_bytes: 0, activations_bytes: act, other_bytes: 200 },
    };
    assert_eq!(d.classes.a, side(3000));
    assert_eq!(d.classes.b, side(5000));
    let rows: Vec<(TensorClass, u64, u64, i64)> = d.classes.rows.iter().map(|r| (r.class, r.a_bytes, r.b_bytes, r.delta_bytes)).collect();
    assert_eq!(
        rows,
        [
            (TensorClass::Param, 1000, 1000, 0),
            (TensorClass::Grad, 0, 0, 0),
            (TensorClass::OptState, 0, 0, 0),
            (TensorClass::Act, 3000, 5000, 2000),
            (TensorClass::Other, 200, 200, 0),
        ]
    );
    let ops = d.ops.as_ref().unwrap();
    assert_eq!(ops.only_in_a, [OpCount { name: "aten::dropout".into(), count: 2 }]);
    assert_eq!(ops.only_in_b, [OpCount { name: "aten::gelu".into(), count: 3 }]);
    assert_eq!(ops.common, 3);
}

#[test]
fn hand_built_curves_align_by_iteration_and_keep_the_peak() {
    let d = diff(&hand_built(&SPEC_A), &hand_built(&SPEC_B));
    assert_eq!(d.curves.alignment, Alignment::Iteration);
    assert_eq!((curve_peak(&d.curves.a), curve_peak(&d.curves.b)), (4200, 6200));
    for c in [&d.curves.a, &d.curves.b] {
        assert!(!c.is_empty() && c.len() <= CURVE_POINTS);
        assert!(c.windows(2).all(|w| w[0].x <= w[1].x));
        // The first event (1 ns) is before the iteration [5, 100]: x in [-1, 0).
        assert!((c[0].x + 1.0).abs() < 1e-9, "{:?}", c[0]);
        // The peak's bucket starts near 35 ns, 30/95 into iteration 0.
        let peak = c.iter().find(|p| p.allocated_max_bytes == curve_peak(c)).unwrap();
        assert!(peak.x > 0.0 && peak.x < 30.0 / 95.0 + 1e-9, "{peak:?}");
    }
    // Without iterations, seconds since the start, and the notes say why.
    let mut b = hand_built(&SPEC_B);
    b.iterations.clear();
    let d = diff(&hand_built(&SPEC_A), &b);
    assert_eq!(d.curves.alignment, Alignment::Seconds);
    assert_eq!(d.curves.b[0].x, 0.0);
    assert!(d.curves.b.last().unwrap().x < 70e-9 + 1e-15);
    assert!(d.b.peak_in_iteration.is_none());
    assert!(
        d.notes.iter().any(|n| n == "the curves are aligned by seconds since each trace's start: B has no iterations"),
        "{:?}",
        d.notes
    );
}

#[test]
fn a_trace_against_itself_is_all_zero() {
    for t in [hand_built(&SPEC_A), load(RESNET), load("convnet_profiler_trace.json")] {
        let d = diff(&t, &t);
        round_trip(&d);
        assert_eq!((d.peak_allocated_delta_bytes, d.peak_reserved_delta_bytes), (0, 0));
        assert_eq!(d.a, d.b);
        assert!(!d.layers.is_empty());
        assert!(d.layers.iter().all(|r| r.presence == Presence::Both
            && r.peak_delta_bytes == 0
            && r.allocated_delta_bytes == 0
            && r.allocations_delta == 0
            && r.a == r.b));
        assert!(d.layers_match);
        assert!(d.classes.rows.iter().all(|r| r.delta_bytes == 0));
        assert_eq!(d.classes.a, d.classes.b);
        if let Some(ops) = &d.ops {
            assert!(ops.only_in_a.is_empty() && ops.only_in_b.is_empty() && ops.common > 0);
        }
        assert_eq!(d.curves.a, d.curves.b);
        assert!(!d.notes.iter().any(|n| n.contains("do not match")), "{:?}", d.notes);
    }
}

#[test]
fn two_real_snapshots_of_different_models() {
    let d = diff(&load(RESNET), &load(MLP));
    round_trip(&d);
    // PyTorch's own counters (facts.json).
    assert_eq!(d.a.peak_allocated_bytes, fact(RESNET, "max_allocated"));
    assert_eq!(d.b.peak_allocated_bytes, fact(MLP, "max_allocated"));
    assert_eq!(d.peak_allocated_delta_bytes, fact(MLP, "max_allocated") as i64 - fact(RESNET, "max_allocated") as i64);
    assert_eq!(d.peak_reserved_delta_bytes, fact(MLP, "max_reserved") as i64 - fact(RESNET, "max_reserved") as i64);
    assert_eq!((d.a.iterations, d.b.iterations), (2, 3));
    assert_eq!(d.curves.alignment, Alignment::Iteration);
    assert_eq!(curve_peak(&d.curves.a), fact(RESNET, "max_allocated"));
    assert_eq!(curve_peak(&d.curves.b), fact(MLP, "max_allocated"));
    assert!(d.curves.a.len() <= CURVE_POINTS && d.curves.b.len() <= CURVE_POINTS);
    assert!(!d.layers_match);
    assert!(
        d.notes.iter().any(|n| n.starts_with("the layers do not match") && n.ends_with("are these traces of the same model?")),
        "{:?}",
        d.notes
    );
    assert!(d.layers.iter().any(|r| r.presence == Presence::OnlyA) && d.layers.iter().any(|r| r.presence == Presence::OnlyB));
    // Snapshots record no operators: no classes, no operator lists, and the notes say so.
    for c in [&d.classes.a, &d.classes.b] {
        assert!(matches!(c, ClassSide::Unavailable { reason } if reason.contains("no operators")), "{c:?}");
    }
    assert!(d.classes.rows.is_empty() && d.ops.is_none());
    for side in ["A", "B"] {
        let want = format!("{side} is a PyTorch snapshot without operators: the per-class breakdown and operator lists need operator data");
        assert!(d.notes.contains(&want), "{:?}", d.notes);
    }
}

#[test]
fn a_snapshot_against_its_own_format_copy_and_a_profiler_trace() {
    // The same run as a .pickle and as a .mtrace.json.
    let snapshot = load(RESNET);
    let mut native = Vec::new();
    shared::export::native::write(&snapshot, &mut native).unwrap();
    let native = import(&native, &ImportOptions::default()).unwrap();
    let d = diff(&snapshot, &native);
    assert_eq!((d.peak_allocated_delta_bytes, d.peak_reserved_delta_bytes), (0, 0));
    assert!(d.layers_match && d.layers.iter().all(|r| r.peak_delta_bytes == 0));
    // A profiler trace has operators but no tensor addresses; the snapshot has neither.
    let d = diff(&load("convnet_profiler_trace.json"), &snapshot);
    assert!(
        matches!(&d.classes.a, ClassSide::Unavailable { reason } if reason.contains("no tensor storage addresses")),
        "{:?}",
        d.classes.a
    );
    assert!(d.ops.is_none());
    assert!(d.notes.iter().any(|n| n.starts_with("A has no per-class breakdown:")), "{:?}", d.notes);
    assert_eq!(d.b.peak_allocated_bytes, fact(RESNET, "max_allocated"));
}

fn merged() -> Trace {
    merge(vec![
        MergeInput { trace: load(RESNET), rank: 0, label: RESNET.into() },
        MergeInput { trace: load(MLP), rank: 1, label: MLP.into() },
    ])
    .unwrap()
}

#[test]
fn two_ranks_of_one_merged_trace() {
    let m = merged();
    let d = diff_devices(&m, Some(0), &m, Some(1)).unwrap();
    let alone = diff(&load(RESNET), &load(MLP));
    // Each side is its rank alone: its events, peaks and layers.
    for (got, want) in [(&d.a, &alone.a), (&d.b, &alone.b)] {
        assert_eq!(
            (got.events, got.peak_allocated_bytes, got.peak_reserved_bytes),
            (want.events, want.peak_allocated_bytes, want.peak_reserved_bytes)
        );
        assert_eq!(got.devices, 2);
    }
    assert_eq!(d.a.device.as_deref(), Some("cuda:0 (rank 0)"));
    assert_eq!(d.b.device.as_deref(), Some("cuda:0 (rank 1)"));
    assert_eq!(d.layers, alone.layers);
    assert_eq!(d.peak_allocated_delta_bytes, alone.peak_allocated_delta_bytes);
    assert_eq!(curve_peak(&d.curves.b), fact(MLP, "max_allocated"));
    assert!(d.notes.contains(&"B has 2 devices; compared cuda:0 (rank 1) (as asked)".to_owned()), "{:?}", d.notes);
    // Unasked, each side is its peak device: ResNet's rank.
    let d = diff(&m, &m);
    assert_eq!(d.a.device.as_deref(), Some("cuda:0 (rank 0)"));
    assert!(
        d.notes.contains(&"A has 2 devices; compared cuda:0 (rank 0) (the device with the highest allocated peak)".to_owned()),
        "{:?}",
        d.notes
    );
    // A device that does not exist is an error naming the side.
    let e = diff_devices(&m, None, &m, Some(2)).unwrap_err();
    assert_eq!(e, DiffError::NoSuchDevice { side: Side::B, index: 2, devices: 2 });
    assert_eq!(e.to_string(), "device 2 of B does not exist: B has 2 devices, so the index must be below 2");
}

#[test]
fn two_ranks_keep_their_own_operators_and_classes() {
    let m = merge(vec![
        MergeInput { trace: hand_built(&SPEC_A), rank: 0, label: "a".into() },
        MergeInput { trace: hand_built(&SPEC_B), rank: 1, label: "b".into() },
    ])
    .unwrap();
    let d = diff_devices(&m, Some(0), &m, Some(1)).unwrap();
    let alone = diff(&hand_built(&SPEC_A), &hand_built(&SPEC_B));
    assert_eq!(d.ops, alone.ops);
    assert_eq!(d.classes, alone.classes);
    assert_eq!(d.layers, alone.layers);
    assert_eq!((d.a.ops, d.b.ops), (5, 6));
}

#[test]
fn empty_traces_do_not_panic() {
    let empty = Trace::new(TraceMeta::new(SourceFormat::MemoryTracer));
    let mut device_only = Trace::new(TraceMeta::new(SourceFormat::PytorchSnapshot));
    device_only.device_index(Device { kind: "cuda".into(), index: 0, rank: None });
    device_only.device_index(Device { kind: "cuda".into(), index: 1, rank: None });
    for (a, b) in [(&empty, &empty), (&empty, &device_only), (&device_only, &empty)] {
        let d = diff(a, b);
        round_trip(&d);
        assert_eq!(d.peak_allocated_delta_bytes, 0);
        assert!(d.layers.is_empty() && d.curves.a.is_empty() && d.curves.b.is_empty() && d.ops.is_none());
        assert!(d.layers_match);
        assert!(d.notes.iter().any(|n| n.contains("has no memory events")), "{:?}", d.notes);
    }
    let d = diff(&empty, &load(MLP));
    assert_eq!(d.peak_allocated_delta_bytes, fact(MLP, "max_allocated") as i64);
    assert!(
        !d.layers_match && d.notes.iter().any(|n| n.starts_with("the layers do not match: A attributes memory to no layer")),
        "{:?}",
        d.notes
    );
    assert!(diff_devices(&empty, Some(0), &empty, None).is_err());
    assert!(diff_devices(&device_only, Some(1), &device_only, Some(0)).is_ok());
}
