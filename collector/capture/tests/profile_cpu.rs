//! The graph profile of real CPU training runs (libtorch): the liveness of an MLP's
//! activations follows from what autograd saves, the breakdown adds up at every rank,
//! `collector analyze` writes its files, and `collector sweep` survives an out-of-memory batch.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capture::run::{trace_model, DeviceChoice, RunOptions};
use shared::analysis::profile::{graph_profile, GraphProfile, TensorClass};
use shared::analysis::sweep::{read_sweep, SweepStatus};
use std::path::PathBuf;
use std::process::Command;

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mt-profile-{}-{name}", std::process::id()));
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
    let a = collector::analyze::analyze(t, &dir, "run").unwrap();
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

#[test]
fn sweep_reports_an_out_of_memory_batch_and_goes_on() {
    let dir = tmpdir("sweep");
    // 20,000,000 × 784 floats is a 62.7 GB input; the address-space limit makes sure it cannot
    // be allocated on any machine, so the allocator's own error is what the sweep sees.
    let script = format!(
        "ulimit -v 16000000 && exec '{}' sweep --model mlp --layers 1 --width 32 --device cpu --iterations 2 --batch-sizes 4,20000000,8 -o '{}'",
        env!("CARGO_BIN_EXE_collector-capture"),
        dir.display()
    );
    let out = Command::new("bash").arg("-c").arg(&script).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report = read_sweep(&std::fs::read(dir.join("sweep.json")).unwrap()).unwrap();
    let status: Vec<(u64, SweepStatus)> = report.runs.iter().map(|r| (r.batch_size, r.status)).collect();
    assert_eq!(status, [(4, SweepStatus::Ok), (20_000_000, SweepStatus::OutOfMemory), (8, SweepStatus::Ok)], "{stderr}");
    let oom = &report.runs[1];
    assert!(oom.error.as_deref().unwrap_or("").contains("allocate"), "{:?}", oom.error);
    assert!(oom.peak_allocated_bytes.is_none() && oom.curve.is_empty());
    let (a, b) = (&report.runs[0], &report.runs[2]);
    assert!(b.peak_allocated_bytes.unwrap() > a.peak_allocated_bytes.unwrap(), "a bigger batch needs more memory");
    assert_eq!(a.curve.len(), b.curve.len(), "same graph at every batch size");
    assert!(dir.join(a.trace_file.as_ref().unwrap()).exists());
    let csv = std::fs::read_to_string(dir.join("sweep.csv")).unwrap();
    assert!(csv.lines().nth(2).unwrap().starts_with("20000000,out_of_memory,,,,,,"), "{csv}");
    for chart in ["sweep_peak_vs_batch", "sweep_latency_vs_batch", "sweep_memory_vs_rank"] {
        assert!(std::fs::metadata(dir.join(format!("{chart}.png"))).unwrap().len() > 1000);
        assert!(dir.join(format!("{chart}.svg")).exists());
    }
}

#[test]
fn sweep_refuses_an_unknown_model_before_running() {
    let dir = tmpdir("sweep-bad");
    let out = Command::new(env!("CARGO_BIN_EXE_collector-capture"))
        .args(["sweep", "--model", "nope", "--device", "cpu", "--batch-sizes", "4,8", "-o"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unknown model `nope`"), "{stderr}");
    assert!(!dir.join("sweep.json").exists());
}
