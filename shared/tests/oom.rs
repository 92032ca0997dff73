//! The out-of-memory explanation on real CUDA out-of-memories (an H100 under a 1 GiB
//! per-process limit, `tests/gpu/oom_samples.py`): PyTorch's snapshot with its `oom` action
//! and the same program traced by `collector trace`. Both must tell what PyTorch's own error
//! message said: 2.00 GiB asked, 125.41 MiB allocated, 12.59 MiB reserved but unallocated.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use shared::analysis::oom::oom;
use shared::{import, ImportOptions, Trace};
use std::path::PathBuf;

fn data(name: &str) -> Vec<u8> {
    std::fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data").join(name)).unwrap()
}

fn load(name: &str) -> Trace {
    import(&data(name), &ImportOptions::default()).unwrap()
}

fn facts() -> serde_json::Value {
    serde_json::from_slice(&data("oom_facts.json")).unwrap()
}

/// Adam's two state tensors per parameter of the MLP, each rounded up to 512 bytes.
fn state_bytes() -> u64 {
    let params: [u64; 6] = [512 * 2048, 2048, 2048 * 2048, 2048, 2048 * 10, 10];
    params.iter().map(|n| 2 * (n * 4).div_ceil(512) * 512).sum()
}

#[test]
fn both_real_out_of_memories_are_explained_as_pytorch_reported_them() {
    let f = facts();
    assert!(f["message"].as_str().unwrap().contains("Tried to allocate 2.00 GiB"));
    for name in ["oom_mlp.pickle", "oom_program.mtrace.json"] {
        let r = oom(&load(name), 10).unwrap_or_else(|| panic!("{name} has an out-of-memory"));
        assert_eq!(r.ooms, 1, "{name}");
        assert_eq!(r.requested_bytes, 2 << 30, "{name}");
        // As PyTorch's message rounds them: 125.41 MiB allocated, 12.59 MiB reserved unused.
        let mib = |b: u64| format!("{:.2} MiB", b as f64 / 1048576.0);
        let message = f["message"].as_str().unwrap();
        assert!(message.contains(&format!("{} is allocated by PyTorch", mib(r.allocated_bytes))), "{name}: {}", r.allocated_bytes);
        assert!(message.contains(&format!("{} is reserved by PyTorch but unallocated", mib(r.unused_reserved_bytes))), "{name}");
        assert_eq!((r.allocated_bytes, r.reserved_bytes), (131_499_520, f["reserved_at_oom"].as_u64().unwrap()), "{name}");
        // Everything live is accounted for: the groups add up to what was allocated.
        let sum: u64 = r.by_phase.iter().map(|g| g.bytes).sum::<u64>() + r.unrecorded_bytes;
        assert_eq!(sum, r.allocated_bytes, "{name}");
        assert_eq!(
            r.by_phase.iter().find(|g| g.name.starts_with("optimizer")).map(|g| (g.bytes, g.allocations)),
            Some((state_bytes(), 12)),
            "{name}"
        );
        assert!(
            r.verdict.starts_with("out of memory on cuda:0 at ") && r.verdict.contains("a request of 2.00 GiB failed"),
            "{}",
            r.verdict
        );
    }
    let snap = oom(&load("oom_mlp.pickle"), 10).unwrap();
    assert!(snap.largest_free_block_bytes.is_some(), "snapshots have segments");
    // Innermost Python frames (the C++ frames before them skipped): Adam's state and the
    // Linear layers' outputs; the gradient made by the autograd engine has only C++ frames.
    let frame = |part: &str| snap.by_frame.iter().filter(|g| g.name.contains(part)).map(|g| g.bytes).sum::<u64>();
    assert_eq!(frame("optim/adam.py:"), state_bytes());
    assert!(frame("modules/linear.py:") > 0 && frame("??") > 0, "{:?}", snap.by_frame);
}

#[test]
fn traces_without_an_out_of_memory_have_no_explanation() {
    assert!(oom(&load("resnet18_sgd_2steps.pickle"), 10).is_none());
    assert!(oom(&Trace::new(shared::model::TraceMeta::new(shared::model::SourceFormat::MemoryTracer)), 10).is_none());
}

/// A real out-of-memory inside a module's forward (`tests/gpu/oom_in_module.py`: an inference
/// loop keeping every output, under a 1 GiB limit, fails in its 50th call, in `act`'s ReLU as
/// PyTorch's traceback says): traced by `collector trace` (default capture, and with every
/// operator) and as PyTorch's snapshot. The report names the module, phase and operator of
/// the failing request first, and its time shares the trace's origin with everything else.
#[test]
fn an_out_of_memory_in_a_module_names_the_module_phase_and_operator_first() {
    let f: serde_json::Value = serde_json::from_slice(&data("oom_in_module_facts.json")).unwrap();
    assert!(f["message"].as_str().unwrap().contains("Tried to allocate 64.00 MiB"));
    for (name, layer, op) in [
        ("oom_in_module.mtrace.json", Some("act"), None),
        ("oom_in_module.ops.mtrace.json.gz", Some("act"), Some("aten::clamp_min")),
        ("oom_in_module.pickle.gz", None, None),
    ] {
        let t = load(name);
        let r = oom(&t, 5).unwrap_or_else(|| panic!("{name} has an out-of-memory"));
        assert_eq!(r.requested_bytes, 64 << 20, "{name}");
        assert_eq!(r.phase, "forward", "{name}");
        if let Some(layer) = layer {
            assert_eq!(r.layer.as_deref(), Some(layer), "{name}");
            assert!(r.verdict.contains(&format!("s in {layer} (forward")), "{name}: {}", r.verdict);
        }
        assert_eq!(r.operator.as_deref(), op, "{name}");
        if name.ends_with("pickle.gz") {
            // Snapshots name the request's Python line: F.relu, called from the model's forward.
            assert!(r.frame.as_deref().is_some_and(|f| f.starts_with("relu (")), "{name}: {:?}", r.frame);
        }
        // One time origin: the report's time is the OOM event's, from the trace's start, and
        // no note states another.
        let at = (0..t.events.len()).find(|&i| t.events.event_type(i) == shared::EventType::Oom).unwrap();
        let secs = (t.events.ts_ns[at] - t.start_ns()) as f64 / 1e9;
        assert!(r.verdict.starts_with(&format!("out of memory on cuda:0 at {secs:.3} s in ")), "{name}: {}", r.verdict);
        assert!(t.meta.warnings.iter().all(|w| !w.contains("out of memory at")), "{name}: {:?}", t.meta.warnings);
        // 929 MiB allocated and a 64 MiB request in the 978 MiB the run had: no allocator
        // setting makes room that is not there, and the report says it tried.
        assert_eq!(r.settings.len(), 3, "{name}: {:?}", r.settings);
        assert!(r.settings.iter().all(|s| !s.fits), "{name}: {:?}", r.settings);
        assert!(r.verdict.contains("no allocator setting tried makes the request fit"), "{name}: {}", r.verdict);
    }
}

/// A program that catches an out-of-memory and retries hits several: each is listed with its
/// request, and the last, the one the program saw last (the error it died of), is explained.
#[test]
fn several_out_of_memories_are_listed_and_the_last_is_explained() {
    use shared::model::{Device, EventRecord, EventType, Phase, SourceFormat, StrId, TraceMeta};
    let mut t = Trace::new(TraceMeta::new(SourceFormat::PytorchSnapshot));
    let d = t.device_index(Device { kind: "cuda".into(), index: 0, rank: None });
    let ev = |ts_ns, event_type, size_bytes, address| EventRecord {
        ts_ns,
        event_type,
        phase: Phase::Forward,
        size_bytes,
        address,
        layer: StrId::NONE,
        device: d,
        stream: 0,
        totals: None,
    };
    let mib = 1 << 20;
    t.events.push(ev(1_000, EventType::SegmentAlloc, 64 * mib, 0x1000_0000));
    t.events.push(ev(2_000, EventType::Alloc, 40 * mib, 0x1000_0000));
    let first = 29 * mib + mib / 2;
    t.events.push(ev(3_000, EventType::Oom, first, 0));
    t.events.push(ev(4_000, EventType::Free, 40 * mib, 0x1000_0000));
    t.events.push(ev(5_000, EventType::Oom, 784 * mib, 0));
    t.finish();
    let r = oom(&t, 5).unwrap();
    assert_eq!(r.ooms, 2);
    assert_eq!(r.requested_bytes, 784 * mib, "the last one is explained: {}", r.verdict);
    let asked: Vec<u64> = r.all.iter().map(|o| o.requested_bytes).collect();
    assert_eq!(asked, [first, 784 * mib]);
    assert_eq!(r.all[0].allocated_bytes, 40 * mib);
    assert_eq!(r.all[1].allocated_bytes, 0);
    assert!(r.verdict.contains("784.00 MiB") && r.verdict.contains("the last of 2") && r.verdict.contains("29.50 MiB"), "{}", r.verdict);
}
