//! The graph profile of real CPU training runs (libtorch): the liveness of an MLP's
//! activations follows from what autograd saves, the breakdown adds up at every rank,
//! and `collector analyze` writes its files (`collector sweep` is tested through `collector`,
//! collector/tests/cli.rs).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capture::run::{trace_model, DeviceChoice, RunOptions};
use shared::analysis::profile::{graph_profile, GraphProfile, TensorClass};
use std::path::PathBuf;

fn tmpdir(name: &str) -> PathBuf {
    let d = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("profile-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// One traced run shared by the tests (one capture session per process at a time).
fn mlp_profile() -> &'static (shared::Trace, GraphProfile) {
    static RUN: std::sync::OnceLock<(shared::Trace, GraphProfile)> = std::sync::OnceLock::new();
    RUN.get_or_init(mlp_run)
}

fn mlp_run() -> (shared::Trace, GraphProfile) {
    let mut o = RunOptions::new("mlp");
    o.device = DeviceChoice::Cpu;
    o.iterations = 3;
    o.input_shape = Some(vec![8, 784]);
    o.model.layers = Some(2);
    o.model.width = Some(64);
    o.model.classes = Some(10);
    let t = trace_model(&o, &mut |_| {}).unwrap();
    let p = graph_profile(&t).unwrap();
    (t, p)
}

/// Rank of the node called `name` that ran in `layer`.
fn rank(p: &GraphProfile, name: &str, layer: &str) -> usize {
    let found: Vec<usize> = p.nodes.iter().filter(|n| n.node_name == name && n.layer == layer).map(|n| n.rank).collect();
    assert_eq!(found.len(), 1, "{name} in {layer}: {found:?}");
    found[0]
}

#[test]
fn mlp_activations_live_from_their_op_to_the_backward_ops_that_read_them() {
    let (_, p) = mlp_profile();
    // The MLP is fc1 → relu1 → fc2 → relu2 → out → log_softmax → nll_loss. Autograd saves
    // each relu's output (ReluBackward0 reads its result; the next linear's AddmmBackward0
    // reads it as mat1 for the weight gradient) and log_softmax's output (NllLossBackward0
    // and LogSoftmaxBackward0 read it). The linear outputs are not saved.
    let cases = [
        (
            rank(p, "aten::relu", "relu1"),
            rank(p, "aten::linear", "fc2"),
            rank(p, "AddmmBackward0", "fc2"),
            rank(p, "ReluBackward0", "relu1"),
        ),
        (
            rank(p, "aten::relu", "relu2"),
            rank(p, "aten::linear", "out"),
            rank(p, "AddmmBackward0", "out"),
            rank(p, "ReluBackward0", "relu2"),
        ),
        (
            rank(p, "aten::log_softmax", "loss"),
            rank(p, "aten::nll_loss", "loss"),
            rank(p, "NllLossBackward0", "loss"),
            rank(p, "LogSoftmaxBackward0", "loss"),
        ),
    ];
    for (created, last_fw, first_bw, last_bw) in cases {
        let a = p
            .activations
            .iter()
            .find(|a| a.creation_rank == created)
            .unwrap_or_else(|| panic!("no activation created at rank {created}: {:#?}", p.activations));
        assert_eq!((a.last_fw_use_rank, a.first_bw_use_rank, a.last_bw_use_rank), (last_fw, first_bw, last_bw), "{a:?}");
        assert!(a.inactive_time_s > 0.0 && a.recomp_time_s > 0.0 && a.recomp_memory_bytes >= a.median_mem_size_bytes);
    }
    for linear in ["fc1", "fc2", "out"] {
        let r = rank(p, "aten::linear", linear);
        assert!(p.activations.iter().all(|a| a.creation_rank != r), "the output of {linear} is not saved for backward");
        assert_eq!(p.nodes[r].node_type, Some(TensorClass::Other));
    }
    assert_eq!(p.nodes[rank(p, "aten::relu", "relu1")].node_type, Some(TensorClass::Act));
}

#[test]
fn mlp_breakdown_adds_up_and_classes_match_the_model() {
    let (t, p) = mlp_profile();
    for r in &p.breakdown {
        assert_eq!(r.weights + r.gradients + r.activations + r.optimizer_state + r.other, r.total_allocated, "rank {}", r.rank);
    }
    assert_eq!(p.breakdown[p.peak_rank].total_allocated, p.peak_bytes);
    // Weights: 784·64 + 64 + 64·64 + 64 + 64·10 + 10 floats; SGD momentum keeps one buffer
    // of the same size from the first step on.
    let params = 4 * (784 * 64 + 64 + 64 * 64 + 64 + 64 * 10 + 10);
    let first = &p.breakdown[0];
    assert_eq!(first.weights, params);
    assert_eq!(first.optimizer_state, params);
    // Every parameter gets its gradient by the end of backward.
    let before_optimizer = &p.breakdown[p.sections.optimizer_start_rank.unwrap() - 1];
    assert_eq!(before_optimizer.gradients, params);
    // The peak per rank is the run's peak unless it was reached in warm-up.
    assert!(p.peak_bytes <= shared::analysis::summary(t).peak_allocated_bytes);
}

#[test]
fn analyze_writes_csvs_json_and_charts() {
    let dir = tmpdir("analyze");
    let (t, _) = mlp_profile();
    let a = traceio::folders::analyze(t, &dir, "run").unwrap();
    for name in
        ["run_node_stats.csv", "run_warmup_node_stats.csv", "run_activation_stats.csv", "run_memory_breakdown.csv", "run_profile.json"]
    {
        assert!(a.files.contains(&dir.join(name)), "{name} missing from {:?}", a.files);
    }
    for chart in ["run_memory_vs_rank", "run_memory_breakdown"] {
        let png = std::fs::read(dir.join(format!("{chart}.png"))).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let svg = std::fs::read_to_string(dir.join(format!("{chart}.svg"))).unwrap();
        assert!(svg.contains("<svg") && svg.contains("operator rank"));
    }
    let nodes = std::fs::read_to_string(dir.join("run_node_stats.csv")).unwrap();
    assert_eq!(nodes.lines().count(), a.profile.nodes.len() + 1);
}
