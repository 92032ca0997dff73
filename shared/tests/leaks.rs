//! Leak detection on hand-built loops whose growth is known to the byte: iterations found
//! from the repeating allocation sizes when the trace has no marks, from boundaries the user
//! gives, and the leaked allocations named by layer and operator.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use shared::analysis::leaks::{leaks, leaks_with, LeakOptions};
use shared::model::{Device, EventRecord, EventType, OperatorEvent, Phase, SourceFormat, StrId, TraceMeta};
use shared::Trace;

const LEAK: u64 = 12_288;
const ITERATIONS: u64 = 6;
const STEP_NS: u64 = 1_000_000;

/// A loop of `ITERATIONS` iterations, each allocating and freeing the same 16 activations
/// (in `model.block`); after the first, each also keeps `LEAK` bytes (in `model.cache`, made
/// by `aten::clone`) that are never freed, unless `drop_cache`. No iteration marks, no scopes.
fn leaky_loop(drop_cache: bool) -> Trace {
    let mut t = Trace::new(TraceMeta::new(SourceFormat::MemoryTracer));
    let d = t.device_index(Device { kind: "cuda".into(), index: 0, rank: None });
    let (block, cache, clone) = (t.strings.intern("model.block"), t.strings.intern("model.cache"), t.strings.intern("aten::clone"));
    let mut address = 0x1000u64;
    let push = |t: &mut Trace, ts: u64, ty: EventType, size: u64, addr: u64, layer: StrId| {
        t.events.push(EventRecord {
            ts_ns: ts,
            event_type: ty,
            phase: Phase::Forward,
            size_bytes: size,
            address: addr,
            layer,
            device: d,
            stream: 0,
            totals: None,
        });
    };
    for it in 0..ITERATIONS {
        let t0 = it * STEP_NS;
        let acts: Vec<(u64, u64)> = (0..16u64)
            .map(|k| {
                (512 * (k + 1) * (k % 3 + 1), {
                    address += 0x10000;
                    address
                })
            })
            .collect();
        for (k, &(size, addr)) in acts.iter().enumerate() {
            push(&mut t, t0 + 1000 * k as u64, EventType::Alloc, size, addr, block);
        }
        if it > 0 {
            address += 0x10000;
            push(&mut t, t0 + 50_000, EventType::Alloc, LEAK, address, cache);
            t.ops.push(OperatorEvent {
                name: clone,
                phase: Phase::Forward,
                seq_nr: -1,
                start_ns: t0 + 49_000,
                end_ns: t0 + 51_000,
                thread: 1,
                fwd_thread: 0,
                layer: cache,
                inputs: (0, 0),
                outputs: (0, 0),
            });
        }
        for (k, &(size, addr)) in acts.iter().enumerate() {
            push(&mut t, t0 + 100_000 + 1000 * k as u64, EventType::Free, size, addr, block);
        }
        if it > 0 && drop_cache {
            push(&mut t, t0 + 200_000, EventType::Free, LEAK, address, cache);
        }
    }
    t.finish();
    t
}

#[test]
fn a_loop_without_marks_is_cut_into_iterations_by_its_repeating_allocations() {
    let r = leaks(&leaky_loop(false), 5);
    assert_eq!(r.iterations_from, "repeating allocation sizes");
    assert_eq!(r.iterations, ITERATIONS as usize);
    assert_eq!(r.growth_per_iteration_bytes, LEAK as i64, "{:?}", r.allocated_at_end_bytes);
    assert!(r.leaking, "{}", r.verdict);
    assert_eq!(r.agreeing, r.compared);
    let g = &r.survivors[0];
    assert_eq!(
        (g.layer.as_str(), g.op.as_deref(), g.bytes, g.iterations),
        ("model.cache", Some("aten::clone"), LEAK * (ITERATIONS - 1), ITERATIONS as usize - 1)
    );
    assert_eq!(r.survivors.len(), 1, "the freed activations are no leak: {:?}", r.survivors);
}

#[test]
fn boundaries_the_user_gives_replace_the_found_ones() {
    let t = leaky_loop(false);
    // Two iterations per boundary: the growth per (user) iteration doubles.
    let b: Vec<f64> = (1..=ITERATIONS / 2).map(|k| (2 * k * STEP_NS) as f64 / 1e9 - 1e-6).collect();
    let r = leaks_with(&t, &LeakOptions { top: 5, boundaries_s: Some(b) });
    assert_eq!((r.iterations_from.as_str(), r.iterations), ("the boundaries given", 3));
    assert_eq!(r.growth_per_iteration_bytes, 2 * LEAK as i64, "{:?}", r.allocated_at_end_bytes);
}

#[test]
fn a_clean_loop_has_no_growth_and_says_so() {
    let r = leaks(&leaky_loop(true), 5);
    assert_eq!((r.iterations_from.as_str(), r.iterations), ("repeating allocation sizes", ITERATIONS as usize));
    assert!(!r.leaking && r.verdict.starts_with("no steady growth"), "{}", r.verdict);
    assert!(r.survivors.is_empty(), "{:?}", r.survivors);
}
