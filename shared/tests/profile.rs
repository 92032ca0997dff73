//! The graph profile on a hand-built training trace whose answer is worked out here, and on
//! the real Chrome trace sample (ranks without tensor classes).

use shared::analysis::profile::{graph_profile, ActivationStats, BreakdownRow, IterationRole, TensorClass};
use shared::export::profile::{
    write_activation_stats, write_memory_breakdown, write_node_stats, ACTIVATION_STATS_HEADER, MEMORY_BREAKDOWN_HEADER, NODE_STATS_HEADER,
};
use shared::model::{
    Device, EventRecord, EventType, IterationSpan, OperatorEvent, Phase, SourceFormat, StrId, TensorRef, TraceMeta, INPUT_LAYER,
};
use shared::Trace;

const W: u64 = 0x1000; // weight, 1000 B
const X: u64 = 0x2000; // input batch, 100 B
const A1: u64 = 0x3000; // linear output, 200 B, freed before backward
const A2: u64 = 0x4000; // relu output, 200 B, saved for backward
const L: u64 = 0x5000; // loss, 4 B
const G0: u64 = 0x6000; // autograd seed, 4 B
const G1: u64 = 0x7000; // gradient of A2, 200 B
const G2: u64 = 0x8000; // gradient of A1, 200 B
const GW: u64 = 0x9000; // weight gradient, 1000 B
const M: u64 = 0xA000; // momentum buffer, 1000 B

/// Builds a trace event by event; events must be added in time order.
struct Builder {
    trace: Trace,
    sizes: std::collections::HashMap<u64, u64>,
}

impl Builder {
    fn new() -> Self {
        let mut trace = Trace::new(TraceMeta::new(SourceFormat::MemoryTracer));
        trace.device_index(Device { kind: "cpu".into(), index: 0, rank: None });
        Self {
            trace,
            sizes: [(W, 1000), (X, 100), (A1, 200), (A2, 200), (L, 4), (G0, 4), (G1, 200), (G2, 200), (GW, 1000), (M, 1000)]
                .into_iter()
                .collect(),
        }
    }

    fn mem(&mut self, ts_ns: u64, event_type: EventType, address: u64, phase: Phase, layer: &str) {
        let layer = self.trace.strings.intern(layer);
        self.trace.events.push(EventRecord {
            ts_ns,
            event_type,
            phase,
            size_bytes: self.sizes[&address],
            address,
            layer,
            device: 0,
            stream: 0,
            totals: None,
        });
    }

    fn tensors(&mut self, addrs: &[u64]) -> (u32, u32) {
        let start = self.trace.tensors.len() as u32;
        for &a in addrs {
            self.trace.tensors.push(TensorRef { storage_id: a, size_bytes: self.sizes[&a], shape: u32::MAX });
        }
        (start, self.trace.tensors.len() as u32)
    }

    #[allow(clippy::too_many_arguments)]
    fn op(&mut self, name: &str, phase: Phase, layer: &str, start_ns: u64, end_ns: u64, inputs: &[u64], outputs: &[u64]) {
        let name = self.trace.strings.intern(name);
        let layer = if layer.is_empty() { StrId::NONE } else { self.trace.strings.intern(layer) };
        let inputs = self.tensors(inputs);
        let outputs = self.tensors(outputs);
        self.trace.ops.push(OperatorEvent { name, phase, seq_nr: -1, start_ns, end_ns, thread: 1, fwd_thread: 0, layer, inputs, outputs });
    }

    /// One training step starting at `t`: linear → relu → sum, backward, SGD with momentum
    /// (the momentum buffer is created by `clone` in the first step and updated by `mul_` after).
    fn iteration(&mut self, index: u32, t: u64) {
        use EventType::{Alloc, Free};
        use Phase::{Backward as B, Forward as F, Optimizer as O};
        // Forward.
        self.op("aten::linear", F, "fc", t + 10, t + 20, &[X, W], &[A1]);
        self.mem(t + 15, Alloc, A1, F, "fc");
        self.op("aten::relu", F, "act", t + 30, t + 40, &[A1], &[A2]);
        self.mem(t + 35, Alloc, A2, F, "act");
        self.mem(t + 45, Free, A1, F, "fc");
        self.op("aten::sum", F, "loss", t + 50, t + 60, &[A2], &[L]);
        self.mem(t + 55, Alloc, L, F, "loss");
        // Backward.
        self.op("aten::ones_like", B, "", t + 70, t + 80, &[L], &[G0]);
        self.mem(t + 75, Alloc, G0, B, "loss");
        self.op("autograd::engine::evaluate_function: SumBackward0", B, "loss", t + 90, t + 100, &[], &[]);
        self.op("SumBackward0", B, "loss", t + 91, t + 99, &[G0], &[]);
        self.op("aten::expand", B, "loss", t + 92, t + 98, &[G0], &[G1]);
        self.mem(t + 95, Alloc, G1, B, "loss");
        self.mem(t + 101, Free, G0, B, "loss");
        self.mem(t + 102, Free, L, B, "loss");
        self.op("autograd::engine::evaluate_function: ReluBackward0", B, "act", t + 110, t + 120, &[], &[]);
        self.op("ReluBackward0", B, "act", t + 111, t + 119, &[G1, A2], &[]);
        self.op("aten::threshold_backward", B, "act", t + 112, t + 118, &[G1, A2], &[G2]);
        self.mem(t + 115, Alloc, G2, B, "act");
        self.mem(t + 121, Free, A2, B, "act");
        self.mem(t + 122, Free, G1, B, "act");
        self.op("autograd::engine::evaluate_function: AddmmBackward0", B, "fc", t + 130, t + 140, &[], &[]);
        self.op("aten::mm", B, "fc", t + 131, t + 139, &[G2, X], &[GW]);
        self.mem(t + 135, Alloc, GW, B, "fc");
        self.mem(t + 141, Free, G2, B, "fc");
        self.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", B, "fc", t + 150, t + 160, &[], &[]);
        self.op("torch::autograd::AccumulateGrad", B, "fc", t + 151, t + 159, &[GW], &[]);
        // Optimizer.
        if index == 0 {
            self.op("aten::clone", O, "optimizer.step", t + 165, t + 168, &[GW], &[M]);
            self.mem(t + 166, Alloc, M, O, "optimizer.step");
        } else {
            self.op("aten::mul_", O, "optimizer.step", t + 165, t + 168, &[M], &[M]);
        }
        self.op("aten::add_", O, "optimizer.step", t + 170, t + 180, &[W, GW], &[W]);
        self.mem(t + 185, Free, GW, O, "optimizer.zero_grad");
        self.trace.iterations.push(IterationSpan { index, start_ns: t, end_ns: t + 190 });
    }
}

fn hand_built(iterations: u32) -> Trace {
    let mut b = Builder::new();
    b.mem(1, EventType::Alloc, W, Phase::Other, "fc");
    b.mem(2, EventType::Alloc, X, Phase::Other, INPUT_LAYER);
    for k in 0..iterations {
        b.iteration(k, 1000 * (u64::from(k) + 1));
    }
    b.trace
}

#[test]
fn ranks_sections_and_warmup() {
    let p = graph_profile(&hand_built(3)).expect("profile");
    let names: Vec<&str> = p.nodes.iter().map(|n| n.node_name.as_str()).collect();
    assert_eq!(
        names,
        [
            "aten::linear",
            "aten::relu",
            "aten::sum",
            "aten::ones_like",
            "SumBackward0",
            "ReluBackward0",
            "AddmmBackward0",
            "torch::autograd::AccumulateGrad",
            "aten::mul_",
            "aten::add_"
        ]
    );
    // Iteration 0 creates the momentum buffer (clone), so it is reported apart.
    assert_eq!(p.warmup_nodes[8].node_name, "aten::clone");
    let roles: Vec<IterationRole> = p.iterations.iter().map(|i| i.role).collect();
    assert_eq!(roles, [IterationRole::Warmup, IterationRole::Steady, IterationRole::Steady]);
    assert_eq!(p.sections.forward_start_rank, Some(0));
    assert_eq!(p.sections.backward_start_rank, Some(3));
    assert_eq!(p.sections.optimizer_start_rank, Some(8));
    assert_eq!(p.sections.optimizer_end_rank, Some(9));
    // Every op of this trace lasts 10 ns except the momentum update (3 ns).
    assert!((p.nodes[0].median_run_time_s - 10e-9).abs() < 1e-15);
    assert!((p.nodes[8].median_run_time_s - 3e-9).abs() < 1e-15);
}

#[test]
fn node_types_follow_the_tensor_classes() {
    let p = graph_profile(&hand_built(3)).expect("profile");
    use TensorClass::*;
    let types: Vec<TensorClass> = p.nodes.iter().map(|n| n.node_type.expect("classified")).collect();
    // linear makes A1 (a temporary), relu makes A2 (saved for ReluBackward0), sum makes the
    // loss (read by the backward seed), mm makes the weight gradient, mul_ updates the
    // momentum buffer, add_ updates the weight.
    assert_eq!(types, [Other, Act, Act, Other, Other, Other, Grad, Other, OptState, Param]);
    assert_eq!(p.warmup_nodes[8].node_type, Some(OptState), "clone creates the momentum buffer");
}

#[test]
fn activation_liveness_is_worked_out_by_hand() {
    let p = graph_profile(&hand_built(3)).expect("profile");
    // A2 (relu output): made at rank 1, read last in forward by sum (2), first and last read
    // in backward by ReluBackward0 (5). It sits idle from the end of sum (t+60) to the start
    // of ReluBackward0 (t+110). Rebuilding it needs relu and, since A1 was freed, linear:
    // 20 ns and A1 + A2 = 400 B.
    // L (the loss): made and last read in forward at rank 2, read by the seed (3).
    let expected = [
        ActivationStats {
            activation_name: "act:aten::relu#1".into(),
            creation_rank: 1,
            last_fw_use_rank: 2,
            first_bw_use_rank: 5,
            last_bw_use_rank: 5,
            median_mem_size_bytes: 200,
            inactive_time_s: 50e-9,
            recomp_time_s: 20e-9,
            recomp_memory_bytes: 400,
        },
        ActivationStats {
            activation_name: "loss:aten::sum#2".into(),
            creation_rank: 2,
            last_fw_use_rank: 2,
            first_bw_use_rank: 3,
            last_bw_use_rank: 3,
            median_mem_size_bytes: 4,
            inactive_time_s: 10e-9,
            recomp_time_s: 10e-9,
            recomp_memory_bytes: 4,
        },
    ];
    assert_eq!(p.activations.len(), expected.len(), "{:#?}", p.activations);
    for (got, want) in p.activations.iter().zip(&expected) {
        assert_eq!(
            (&got.activation_name, got.creation_rank, got.last_fw_use_rank, got.first_bw_use_rank, got.last_bw_use_rank),
            (&want.activation_name, want.creation_rank, want.last_fw_use_rank, want.first_bw_use_rank, want.last_bw_use_rank)
        );
        assert_eq!(got.median_mem_size_bytes, want.median_mem_size_bytes);
        assert_eq!(got.recomp_memory_bytes, want.recomp_memory_bytes, "{}", got.activation_name);
        assert!((got.inactive_time_s - want.inactive_time_s).abs() < 1e-15, "{got:?}");
        assert!((got.recomp_time_s - want.recomp_time_s).abs() < 1e-15, "{got:?}");
    }
}

#[test]
fn breakdown_adds_up_and_matches_the_hand_count_at_the_peak() {
    let trace = hand_built(3);
    let p = graph_profile(&trace).expect("profile");
    for r in &p.breakdown {
        assert_eq!(r.weights + r.gradients + r.activations + r.optimizer_state + r.other, r.total_allocated, "rank {}", r.rank);
    }
    // The peak is the weight gradient's allocation in AddmmBackward0: W + X + M + G2 + GW.
    assert_eq!(p.peak_rank, 6);
    assert_eq!(p.peak_bytes, 3300);
    assert_eq!(
        p.breakdown[6],
        BreakdownRow { rank: 6, weights: 1000, gradients: 1000, activations: 0, optimizer_state: 1000, other: 300, total_allocated: 3300 }
    );
    // Before relu: W + X + M, and A1 (a temporary).
    assert_eq!(
        p.breakdown[1],
        BreakdownRow { rank: 1, weights: 1000, gradients: 0, activations: 200, optimizer_state: 1000, other: 300, total_allocated: 2500 }
    );
    assert_eq!(p.breakdown.iter().map(|r| r.total_allocated).max(), Some(p.peak_bytes));
}

#[test]
fn a_single_iteration_is_its_own_reference() {
    let p = graph_profile(&hand_built(1)).expect("profile");
    assert!(p.warmup_nodes.is_empty());
    assert_eq!(p.iterations[0].role, IterationRole::Steady);
    assert_eq!(p.nodes[8].node_name, "aten::clone");
}

#[test]
fn a_trace_without_operators_is_refused_with_a_reason() {
    let mut t = hand_built(1);
    t.ops.clear();
    let e = graph_profile(&t).expect_err("no ops");
    assert!(e.to_string().contains("no operators"), "{e}");
}

/// Every line has as many cells as the header, none empty, none NaN or infinite.
fn check_csv(text: &str, header: &str) -> usize {
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(header));
    let cols = header.split(',').count();
    let mut rows = 0;
    for line in lines {
        let cells: Vec<&str> = line.split(',').collect();
        assert_eq!(cells.len(), cols, "{line}");
        for c in cells {
            assert!(!c.is_empty(), "empty cell in {line}");
            assert!(!c.eq_ignore_ascii_case("nan") && !c.contains("inf"), "bad number in {line}");
        }
        rows += 1;
    }
    rows
}

#[test]
fn csvs_have_the_required_headers_and_full_cells() {
    let p = graph_profile(&hand_built(3)).expect("profile");
    let mut out = Vec::new();
    write_node_stats(&p.nodes, &mut out).expect("write");
    assert_eq!(check_csv(std::str::from_utf8(&out).expect("utf8"), NODE_STATS_HEADER), 10);
    assert_eq!(NODE_STATS_HEADER, "rank,node_name,node_type,gtype,median_run_time_s,median_peak_mem_bytes,median_active_mem_bytes,device");
    assert!(std::str::from_utf8(&out).expect("utf8").contains("\n6,AddmmBackward0,GRAD,backward,0.000000010,3300,2300,cpu:0\n"));
    let mut out = Vec::new();
    write_activation_stats(&p.activations, &mut out).expect("write");
    assert_eq!(check_csv(std::str::from_utf8(&out).expect("utf8"), ACTIVATION_STATS_HEADER), 2);
    assert_eq!(ACTIVATION_STATS_HEADER, "activation_name,creation_rank,last_fw_use_rank,first_bw_use_rank,last_bw_use_rank,median_mem_size_bytes,inactive_time_s,recomp_time_s,recomp_memory_bytes");
    let mut out = Vec::new();
    write_memory_breakdown(&p.breakdown, &mut out).expect("write");
    assert_eq!(check_csv(std::str::from_utf8(&out).expect("utf8"), MEMORY_BREAKDOWN_HEADER), 10);
    assert_eq!(MEMORY_BREAKDOWN_HEADER, "rank,weights,gradients,activations,optimizer_state,other,total_allocated");
}

#[test]
fn chrome_trace_sample_gives_ranks_and_memory_but_says_what_it_cannot_classify() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/convnet_profiler_trace.json");
    let bytes = std::fs::read(path).expect("sample");
    let trace = shared::import(&bytes, &shared::ImportOptions::default()).expect("import");
    let p = graph_profile(&trace).expect("profile");
    let summary = shared::analysis::summary(&trace);
    assert!(p.nodes.len() > 10);
    assert_eq!(p.sections.forward_start_rank, Some(0));
    let bw = p.sections.backward_start_rank.expect("backward");
    assert!(p.nodes[..bw].iter().all(|n| n.gtype == Phase::Forward));
    assert!(p.nodes.iter().any(|n| n.gtype == Phase::Optimizer));
    assert!(p.nodes.iter().all(|n| n.node_type.is_none()));
    assert!(p.activations.is_empty() && p.breakdown.is_empty());
    assert_eq!(p.not_derivable.len(), 1);
    // One step in the sample: its peak per rank is the trace's peak, unless it fell between ops.
    assert!(p.peak_bytes <= summary.peak_allocated_bytes && p.peak_bytes > 0);
    let mut out = Vec::new();
    write_node_stats(&p.nodes, &mut out).expect("write");
    check_csv(std::str::from_utf8(&out).expect("utf8"), NODE_STATS_HEADER);
}
