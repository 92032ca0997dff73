//! Native capture on the CPU with real libtorch: what `collector trace` records must hold
//! together (phases, attribution, totals, nesting), for zoo and TorchScript models.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use capture::run::{trace_model, DeviceChoice, Mode, RunError, RunOptions};
use shared::model::{EventType, Phase};
use shared::Trace;
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Mutex;

/// One capture session per process at a time: tests take turns.
static TURN: Mutex<()> = Mutex::new(());

fn trace(opts: &RunOptions) -> Result<Trace, RunError> {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    trace_model(opts, &mut |_| {})
}

fn mlp(iterations: u32) -> RunOptions {
    let mut o = RunOptions::new("mlp");
    o.device = DeviceChoice::Cpu;
    o.iterations = iterations;
    o.input_shape = Some(vec![16, 784]);
    o.model.layers = Some(2);
    o.model.width = Some(128);
    o
}

fn op_names(t: &Trace, phase: Phase) -> Vec<&str> {
    t.ops.iter().filter(|o| o.phase == phase).map(|o| t.str(o.name)).collect()
}

#[test]
fn training_records_forward_backward_and_optimizer_ops() {
    let mut o = mlp(2);
    o.optimizer = "adam".parse().unwrap();
    let t = trace(&o).unwrap();
    let fwd = op_names(&t, Phase::Forward);
    let bwd = op_names(&t, Phase::Backward);
    let opt = op_names(&t, Phase::Optimizer);
    assert!(fwd.contains(&"aten::linear") && fwd.contains(&"aten::relu"), "forward ops: {fwd:?}");
    assert!(bwd.contains(&"AddmmBackward0") && bwd.contains(&"ReluBackward0"), "backward ops: {bwd:?}");
    assert!(opt.iter().any(|n| n.starts_with("aten::") && (n.contains("add") || n.contains("mul"))), "optimizer ops: {opt:?}");
    // Backward nodes get the layer of their forward op: fc1's AddmmBackward0 belongs to fc1.
    let layers_of = |name: &str| -> HashSet<&str> { t.ops.iter().filter(|o| t.str(o.name) == name).map(|o| t.str(o.layer)).collect() };
    assert_eq!(layers_of("AddmmBackward0"), ["fc1", "fc2", "out"].into_iter().collect());
    assert_eq!(layers_of("ReluBackward0"), ["relu1", "relu2"].into_iter().collect());
    // Optimizer work belongs to optimizer.step (or zero_grad).
    for op in t.ops.iter().filter(|o| o.phase == Phase::Optimizer) {
        assert!(t.str(op.layer).starts_with("optimizer."), "{} in {}", t.str(op.name), t.str(op.layer));
    }
    // Every event has a phase, and memory in each phase exists.
    let phases: HashSet<Phase> = (0..t.events.len()).map(|i| t.events.phase(i)).collect();
    for p in [Phase::Forward, Phase::Backward, Phase::Optimizer] {
        assert!(phases.contains(&p), "no memory events in {p:?}");
    }
    assert_eq!(t.iterations.len(), 2);
    assert!(t.iterations[0].end_ns <= t.iterations[1].start_ns);
}

#[test]
fn every_allocation_has_a_layer_totals_stay_non_negative_and_frees_match() {
    let t = trace(&mlp(3)).unwrap();
    assert!(t.events.len() > 50);
    let mut live: HashMap<u64, u64> = HashMap::new();
    let mut running: i128 = 0;
    let mut cursor = t.events.cursor();
    for i in 0..t.events.len() {
        let totals = cursor.advance();
        let e = t.memory_event(i);
        assert!(e.layer_name.is_some_and(|l| !l.is_empty()), "event {i} has no layer (not even `unattributed`)");
        match e.event_type {
            EventType::Alloc => {
                assert!(live.insert(e.address, e.size_bytes).is_none(), "address {:#x} allocated twice", e.address);
                running += i128::from(e.size_bytes);
            }
            EventType::Free => {
                // Every free matches an earlier allocation of the same block and size.
                let size = live.remove(&e.address).unwrap_or_else(|| panic!("free of {:#x} without an allocation", e.address));
                assert_eq!(size, e.size_bytes, "free size differs from its allocation");
                running -= i128::from(e.size_bytes);
            }
            other => panic!("unexpected {other:?} on CPU"),
        }
        assert!(running >= 0);
        // The reported total is the allocator's own, and it equals our running sum.
        assert_eq!(i128::from(totals.allocated_bytes), running, "event {i}");
    }
    // Parameters and optimizer state outlive the loop; activations do not.
    let end = t.events.final_totals()[0].allocated_bytes;
    assert!(end > 0 && (end as i128) == running);
    let attributed = (0..t.events.len()).filter(|&i| t.memory_event(i).layer_name != Some("unattributed")).count();
    assert!(attributed * 10 >= t.events.len() * 9, "only {attributed} of {} events attributed to layers", t.events.len());
}

#[test]
fn layer_scopes_nest_properly() {
    let mut o = RunOptions::new("resnet18");
    o.device = DeviceChoice::Cpu;
    o.iterations = 1;
    o.input_shape = Some(vec![1, 3, 32, 32]);
    let t = trace(&o).unwrap();
    assert!(t.scopes.iter().any(|s| t.str(s.name) == "layer1.0.conv1"));
    // On one thread, two scopes are either disjoint or one contains the other, and the
    // contained one is deeper and its name extends the container's path.
    for (i, a) in t.scopes.iter().enumerate() {
        for b in &t.scopes[i + 1..] {
            if a.thread != b.thread || b.start_ns >= a.end_ns || a.start_ns >= b.end_ns {
                continue;
            }
            let (outer, inner) = if a.start_ns <= b.start_ns && b.end_ns <= a.end_ns { (a, b) } else { (b, a) };
            assert!(
                outer.start_ns <= inner.start_ns && inner.end_ns <= outer.end_ns,
                "{} and {} overlap without nesting",
                t.str(a.name),
                t.str(b.name)
            );
            if outer.depth != inner.depth {
                assert!(outer.depth < inner.depth);
                assert!(
                    t.str(inner.name).starts_with(&format!("{}.", t.str(outer.name))),
                    "{} inside {}",
                    t.str(inner.name),
                    t.str(outer.name)
                );
            }
        }
    }
    // Forward convolutions are attributed to conv layers; their backward too.
    let conv_layers: HashSet<&str> = t.ops.iter().filter(|o| t.str(o.name) == "ConvolutionBackward0").map(|o| t.str(o.layer)).collect();
    assert!(conv_layers.contains("conv1") && conv_layers.contains("layer4.1.conv2"), "{conv_layers:?}");
}

#[test]
fn inference_has_no_backward_or_optimizer() {
    let mut o = mlp(1);
    o.mode = Mode::Infer;
    let t = trace(&o).unwrap();
    assert!(!t.ops.is_empty());
    assert!(t.ops.iter().all(|op| op.phase != Phase::Backward && op.phase != Phase::Optimizer));
}

#[test]
fn event_limit_drops_and_counts() {
    let mut o = mlp(2);
    o.max_events = 20;
    let t = trace(&o).unwrap();
    assert_eq!(t.events.len(), 20);
    assert!(t.dropped_events > 0);
    assert!(t.meta.warnings.iter().any(|w| w.contains("dropped")), "{:?}", t.meta.warnings);
}

fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("MEMORY_TRACER_PYTHON") {
        return p.into();
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
    home.join(".cache/memory-tracer/torch-venv/bin/python")
}

#[test]
fn torchscript_model_gets_module_paths() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("torchscript");
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("make.py");
    std::fs::write(
        &script,
        "import sys, torch, torch.nn as nn\n\
         class Net(nn.Module):\n    def __init__(s):\n        super().__init__()\n        s.features = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())\n        s.head = nn.Linear(8, 4)\n    def forward(s, x):\n        return s.head(s.features(x).mean((2, 3)))\n\
         torch.jit.script(Net()).save(sys.argv[1])\n",
    )
    .unwrap();
    let model = dir.join("net.pt");
    let status = std::process::Command::new(python())
        .arg(&script)
        .arg(&model)
        .status()
        .expect("the torch venv's python (run `cargo xtask install-tools`)");
    assert!(status.success());
    let mut o = RunOptions::new("torchscript");
    o.torchscript = Some(model);
    o.device = DeviceChoice::Cpu;
    o.iterations = 2;
    o.input_shape = Some(vec![2, 3, 16, 16]);
    let t = trace(&o).unwrap();
    let op_layers: HashSet<&str> = t.ops.iter().filter(|o| o.phase == Phase::Forward).map(|o| t.str(o.layer)).collect();
    for want in ["features.0", "features.1", "head"] {
        assert!(op_layers.contains(want), "no forward op in {want}: {op_layers:?}");
    }
    let conv_bwd: HashSet<&str> = t.ops.iter().filter(|o| t.str(o.name) == "ConvolutionBackward0").map(|o| t.str(o.layer)).collect();
    assert_eq!(conv_bwd, ["features.0"].into_iter().collect());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_models_shapes_and_devices_say_what_is_valid() {
    let err = |o: &RunOptions| trace(o).unwrap_err().to_string();
    let e = err(&RunOptions::new("resnet9000"));
    assert!(e.contains("unknown model `resnet9000`") && e.contains("resnet50") && e.contains("gpt"), "{e}");

    let mut o = RunOptions::new("resnet18");
    o.device = DeviceChoice::Cpu;
    o.input_shape = Some(vec![8, 224, 224]);
    let e = err(&o);
    assert!(e.contains("expected 4 dimensions") && e.contains("8,3,224,224"), "{e}");
    o.input_shape = Some(vec![8, 3, 0, 224]);
    assert!(err(&o).contains("at least 1"));

    let mut o = mlp(1);
    o.batch_size = Some(-4);
    assert!(err(&o).contains("at least 1"));

    if !tch::Cuda::is_available() {
        let mut o = mlp(1);
        o.device = DeviceChoice::Cuda(0);
        let e = err(&o);
        assert!(e.contains("cuda:0") && e.contains("--device cpu"), "{e}");
    }
    assert!("cuda:x".parse::<DeviceChoice>().unwrap_err().contains("expected cpu, cuda or cuda:N"));
    assert!("tpu".parse::<DeviceChoice>().is_err());
    assert!("sgd2".parse::<capture::run::OptimizerKind>().unwrap_err().contains("sgd, adam or adamw"));

    let mut o = mlp(1);
    o.torchscript = Some("/nonexistent/model.pt".into());
    let e = err(&o);
    assert!(e.contains("cannot load TorchScript model /nonexistent/model.pt") && !e.contains("frame #"), "{e}");
}

#[test]
fn library_tracer_traces_a_closure_with_named_layers() {
    use capture::tracer::MemoryTracer;
    use tch::{nn, Device, Kind, Tensor};
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let tracer = MemoryTracer::new(100_000, "cpu", true).unwrap();
    assert!(tracer.get_layer_stats().is_err(), "no trace yet");
    let vs = nn::VarStore::new(Device::Cpu);
    let fc1 = nn::linear(vs.root() / "fc1", 256, 512, Default::default());
    let fc2 = nn::linear(vs.root() / "fc2", 512, 10, Default::default());
    let x = Tensor::randn([32, 256], (Kind::Float, Device::Cpu));
    let out = tracer
        .trace(|| {
            let h = tracer.trace_module("fc1", &fc1, &x).relu();
            tracer.trace_module("fc2", &fc2, &h)
        })
        .unwrap();
    assert_eq!(out.size(), [32, 10]);
    let peaks = tracer.get_peak_memory_per_layer().unwrap();
    // fc1's output is 32*512 floats: the peak inside fc1 is at least that.
    assert!(peaks["fc1"] >= 32 * 512 * 4, "{peaks:?}");
    let stats = tracer.get_layer_stats().unwrap();
    assert!(stats["fc2"].total_allocations >= 1);
    let frag = tracer.get_fragmentation_stats().unwrap();
    assert_eq!(frag.avg_fragmentation, 0.0, "the CPU allocator caches nothing");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("tracer");
    std::fs::create_dir_all(&dir).unwrap();
    tracer.export_flame_graph(dir.join("f.speedscope.json")).unwrap();
    tracer.export_timeline(dir.join("t.json")).unwrap();
    let timeline: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("t.json")).unwrap()).unwrap();
    let events = timeline["events"].as_array().unwrap();
    assert!(events.iter().any(|e| e["layer_name"] == "fc1" && e["phase"] == "other"));
    let speedscope: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("f.speedscope.json")).unwrap()).unwrap();
    assert!(speedscope["shared"]["frames"].as_array().unwrap().iter().any(|f| f["name"] == "fc1"));
    // Thread-safe: traces from two threads run one after the other.
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| tracer.trace(|| Tensor::ones([1024], (Kind::Float, Device::Cpu)).sum(None)).unwrap());
        }
    });
    assert!(!tracer.trace_data().unwrap().events.is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The transformer takes token ids (batch, sequence) or embeddings (batch, sequence, width),
/// the width then taken from the shape, as the API guide's `[4, 128, 512]` example sends.
#[test]
fn the_transformer_takes_token_ids_or_embeddings() {
    let mut o = RunOptions::new("transformer");
    o.device = DeviceChoice::Cpu;
    o.iterations = 1;
    o.model.layers = Some(1);
    o.input_shape = Some(vec![2, 16, 64]);
    let t = trace(&o).unwrap();
    let ops: HashSet<&str> = t.ops.iter().map(|o| t.str(o.name)).collect();
    assert!(!ops.contains("aten::embedding"), "embeddings skip the embedding layer");
    assert_eq!(t.meta.input_shape, Some(vec![2, 16, 64]));

    o.input_shape = Some(vec![2, 16]);
    o.model.width = Some(64);
    let t = trace(&o).unwrap();
    assert!(t.ops.iter().any(|op| t.str(op.name) == "aten::embedding"), "token ids go through it");

    o.input_shape = Some(vec![2, 16, 32]);
    let e = trace(&o).unwrap_err().to_string();
    assert!(e.contains("embeddings must be 64 wide"), "{e}");
}
