//! Leak detection on hand-built loops whose growth is known to the byte: iterations found
//! from the repeating allocation sizes when the trace has no marks, from boundaries the user
//! gives, and the leaked allocations named by layer and operator.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use shared::analysis::leaks::{leaks, leaks_with, LeakOptions};
use shared::model::{Device, EventRecord, EventType, OperatorEvent, Phase, SourceFormat, StrId, TraceMeta};
use shared::units::format_bytes;
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

/// An empty trace with one CUDA device and no marks, as a snapshot without annotations is.
fn snapshot_like() -> Trace {
    let mut t = Trace::new(TraceMeta::new(SourceFormat::PytorchSnapshot));
    t.device_index(Device { kind: "cuda".into(), index: 0, rank: None });
    t
}

/// One memory event on device 0, outside every layer and phase.
fn push_event(t: &mut Trace, ts_ns: u64, event_type: EventType, size_bytes: u64, address: u64) {
    t.events.push(EventRecord {
        ts_ns,
        event_type,
        phase: Phase::Other,
        size_bytes,
        address,
        layer: StrId::NONE,
        device: 0,
        stream: 0,
        totals: None,
    });
}

/// A loop of `iterations` iterations of `per_iteration` allocations (sizes repeating within
/// an iteration too), each freed in the iteration except, when `leak`, the iteration's last
/// (kept, as a list of losses keeps their graphs). With `teardown`, the trace ends as a
/// returning function's does: every kept block freed, and a last allocation and free.
fn sized_loop(per_iteration: usize, iterations: usize, leak: bool, teardown: bool) -> (Trace, u64) {
    let mut t = snapshot_like();
    let mut ts = 0u64;
    let mut push = |t: &mut Trace, ty: EventType, size: u64, addr: u64| {
        ts += 1000;
        push_event(t, ts, ty, size, addr);
    };
    // Sizes of one iteration: a few distinct ones, some repeated (as an MLP's are).
    let sizes: Vec<u64> = (0..per_iteration).map(|k| 512 * (1 + (k as u64 * 7) % 5) * (1 + k as u64 % 3)).collect();
    let kept_size = sizes[per_iteration - 1];
    let mut kept = Vec::new();
    let mut addr = 0x10_0000u64;
    for _ in 0..iterations {
        let mut live = Vec::new();
        for &s in &sizes {
            addr += 0x1_0000;
            push(&mut t, EventType::Alloc, s, addr);
            live.push((s, addr));
        }
        if leak {
            kept.push(live.pop().unwrap());
        }
        for (s, a) in live {
            push(&mut t, EventType::Free, s, a);
        }
    }
    if teardown {
        for (s, a) in kept.drain(..) {
            push(&mut t, EventType::Free, s, a);
        }
        push(&mut t, EventType::Alloc, 512, 0x9000);
        push(&mut t, EventType::Free, 512, 0x9000);
    }
    t.finish();
    (t, if leak { kept_size } else { 0 })
}

/// Periods shorter than any fixed window (3 allocations) up to long ones (40), leaking and
/// clean, with and without a teardown after the last iteration: every iteration is found,
/// the teardown is none, and a leak's growth is the kept block's size.
#[test]
fn loops_of_3_to_40_allocations_per_iteration_are_cut_at_their_period() {
    for per_iteration in [3, 4, 5, 7, 8, 11, 12, 13, 20, 31, 40] {
        for iterations in [6, 9] {
            for leak in [true, false] {
                for teardown in [true, false] {
                    let (t, growth) = sized_loop(per_iteration, iterations, leak, teardown);
                    let r = leaks(&t, 5);
                    let case = format!("{per_iteration} per iteration, {iterations} iterations, leak {leak}, teardown {teardown}");
                    assert_eq!(r.iterations_from, "repeating allocation sizes", "{case}");
                    assert_eq!(r.iterations, iterations, "{case}: {:?}", r.allocated_at_end_bytes);
                    assert_eq!(r.leaking, leak, "{case}: {}", r.verdict);
                    assert_eq!(r.growth_per_iteration_bytes, growth as i64, "{case}: {:?}", r.allocated_at_end_bytes);
                }
            }
        }
    }
}

/// Iterations whose sizes change with the data (a batch of 64, then 96, 128 in turn): the
/// loop is still found, and its cycle is no leak.
#[test]
fn a_loop_with_data_dependent_sizes_is_found_and_not_called_a_leak() {
    let mut t = snapshot_like();
    let mut ts = 0u64;
    for it in 0..9u64 {
        let batch = [64, 96, 128][it as usize % 3];
        // Weights-sized temporaries that stay, and batch-sized activations that change.
        let sizes = [4096, batch * 512, 8192, batch * 2048, 4096, batch * 512, 512, 8192];
        for (k, &s) in sizes.iter().enumerate() {
            for ty in [EventType::Alloc, EventType::Free] {
                ts += 1000;
                push_event(&mut t, ts, ty, s, 0x1000 * (k as u64 + 1));
            }
        }
    }
    t.finish();
    let r = leaks(&t, 5);
    assert_eq!(r.iterations_from, "repeating allocation sizes");
    assert!(r.iterations >= 3, "{r:?}");
    assert!(!r.leaking, "{}", r.verdict);
}

/// Real snapshots of a 6-iteration forward-only loop on an H100 (`tests/gpu/leak_loop.py`):
/// one keeps each iteration's loss and graph (PyTorch's counter grew by 6,291,968 B per
/// iteration), one keeps nothing; each ends with the frees of the function returning.
#[test]
fn real_short_loops_leaking_and_clean_are_told_apart() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data");
    let facts: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("rank_facts.json")).unwrap()).unwrap();
    for (name, leaking) in [("leak_loop_leaky.pickle.gz", true), ("leak_loop_clean.pickle.gz", false)] {
        let t = shared::import(&std::fs::read(dir.join(name)).unwrap(), &shared::ImportOptions::default()).unwrap();
        let r = leaks(&t, 5);
        let f = &facts["samples"][name];
        assert_eq!(r.iterations, f["iterations"].as_u64().unwrap() as usize, "{name}: {r:?}");
        assert_eq!(r.leaking, leaking, "{name}: {}", r.verdict);
        assert_eq!(r.growth_per_iteration_bytes, f["growth_per_iteration"].as_i64().unwrap(), "{name}: {:?}", r.allocated_at_end_bytes);
    }
}

/// A marked loop whose sizes follow the data, as a mixture of experts' do: each iteration's
/// output (of the batch's size) is held across the iteration's end until the next one
/// replaces it, so totals at iteration ends wobble by far more than a leak; each iteration
/// also keeps `kept(k)` bytes, freed only by the teardown after the loop (a `main()`
/// returning) when `teardown`.
fn wobbling_loop_with(kept: impl Fn(usize) -> u64, teardown: bool) -> Trace {
    let mut t = snapshot_like();
    let batch = |k: usize| 4096 * (1 + ((k * 7919) % 13) as u64) * 64;
    let ts = std::cell::Cell::new(0u64);
    let mut addr = 0x100_0000u64;
    let mut held: Option<(u64, u64)> = None;
    let next = |t: &mut Trace, ty: EventType, size: u64, a: u64| {
        ts.set(ts.get() + 1000);
        push_event(t, ts.get(), ty, size, a);
        ts.get()
    };
    let mut kept_blocks = Vec::new();
    // Parameters and optimizer state, allocated once before the loop.
    next(&mut t, EventType::Alloc, 1 << 20, 0x10);
    for k in 0..12 {
        let start = ts.get() + 1;
        let size = batch(k);
        let acts: Vec<(u64, u64)> = (0..4u64).map(|j| (size / (j + 1), addr + 0x1000 * j)).collect();
        addr += 0x10_0000;
        for &(s, a) in &acts {
            next(&mut t, EventType::Alloc, s, a);
        }
        let out = (size / 2, addr);
        addr += 0x10_0000;
        next(&mut t, EventType::Alloc, out.0, out.1);
        if let Some((s, a)) = held.replace(out) {
            next(&mut t, EventType::Free, s, a);
        }
        if kept(k) > 0 {
            next(&mut t, EventType::Alloc, kept(k), addr);
            kept_blocks.push((kept(k), addr));
            addr += 0x10_0000;
        }
        for &(s, a) in &acts {
            next(&mut t, EventType::Free, s, a);
        }
        let end = next(&mut t, EventType::Alloc, 256, addr);
        next(&mut t, EventType::Free, 256, addr);
        addr += 0x1000;
        t.iterations.push(shared::model::IterationSpan { index: k as u32, start_ns: start, end_ns: end });
    }
    if teardown {
        for (s, a) in kept_blocks.into_iter().chain(held) {
            next(&mut t, EventType::Free, s, a);
        }
    }
    t.finish();
    t
}

fn wobbling_loop(kept: impl Fn(usize) -> u64) -> Trace {
    wobbling_loop_with(kept, false)
}

#[test]
fn what_the_loop_keeps_counts_even_when_the_teardown_frees_it() {
    let r = leaks(&wobbling_loop_with(|_| 65_536, true), 5);
    assert!(r.leaking && r.growth_per_iteration_bytes == 65_536, "{}", r.verdict);
    let r = leaks(&wobbling_loop_with(|_| 0, true), 5);
    assert!(!r.leaking, "{}", r.verdict);
}

#[test]
fn a_leak_under_totals_that_wobble_with_the_data_is_found_by_what_each_iteration_keeps() {
    let t = wobbling_loop(|_| 65_536);
    let r = leaks(&t, 5);
    assert!(r.leaking, "{}: ends {:?}", r.verdict, r.allocated_at_end_bytes);
    assert_eq!(r.growth_per_iteration_bytes, 65_536, "{}", r.verdict);
    let ends = &r.allocated_at_end_bytes;
    let wobble = ends.windows(2).map(|w| (w[1] as i64 - w[0] as i64).unsigned_abs()).max().unwrap();
    assert!(wobble > 10 * 65_536, "the ends must drown the leak for this test to mean anything: {ends:?}");
    assert_eq!(r.kept_per_iteration_bytes[1..11], [65_536; 10]);
}

#[test]
fn a_clean_loop_whose_totals_wobble_is_never_a_leak() {
    let r = leaks(&wobbling_loop(|_| 0), 5);
    assert!(!r.leaking && r.verdict.starts_with("no steady growth"), "{}", r.verdict);
}

#[test]
fn a_loop_leaving_differing_sizes_behind_is_uncertain_not_a_leak() {
    let r = leaks(&wobbling_loop(|k| if k % 2 == 0 { 4096 * (k as u64 + 1) * 40 } else { 0 }), 5);
    assert!(!r.leaking && r.verdict.starts_with("uncertain"), "{}", r.verdict);
}

/// Every iteration keeps bytes whose amount follows the data (its variable-length logits): a
/// leak, named with its range, where a loop leaving something behind only every other
/// iteration stays uncertain and a clean loop of the same wobbling batches is never one.
#[test]
fn a_loop_keeping_amounts_that_follow_the_data_is_a_leak_with_its_range() {
    let kept = |k: usize| 4096 * (3 + (k as u64 * 7) % 11) * 10;
    let r = leaks(&wobbling_loop(kept), 5);
    assert!(r.leaking, "{}: {:?}", r.verdict, r.kept_per_iteration_bytes);
    let window = &r.kept_per_iteration_bytes[r.warmup..r.kept_per_iteration_bytes.len() - 1];
    let (lo, hi) = (*window.iter().min().unwrap(), *window.iter().max().unwrap());
    assert!(lo < hi, "{window:?}");
    let want = format!("leak: {}–{} per iteration, differing with the data", format_bytes(lo), format_bytes(hi));
    assert!(r.verdict.starts_with(&want), "{} (want {want})", r.verdict);
    assert!(r.survivors.first().is_some_and(|g| g.iterations >= 9), "{:?}", r.survivors);
    // One iteration in three keeping nothing: not (nearly) every one keeps, so no verdict of leak.
    let r = leaks(&wobbling_loop(|k| if k % 3 == 0 { 0 } else { kept(k) }), 5);
    assert!(!r.leaking, "{}", r.verdict);
}

/// Real traces of data-dependent loops on an H200 (`tests/gpu/compile_leaks_times.sh`): a
/// mixture of experts with dropped batches and a transformer on sequences of varying length,
/// each leaking 65,536 B per step and clean. PyTorch's own `memory_allocated()` after each
/// step moves by far more than that either way (`data_dependent_facts.json`); the verdict
/// finds exactly the leak and calls neither clean loop one.
#[test]
fn real_data_dependent_loops_leaking_and_clean_are_told_apart() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data");
    let facts: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("data_dependent_facts.json")).unwrap()).unwrap();
    let samples = facts["samples"].as_object().unwrap();
    assert_eq!(samples.len(), 4);
    for (name, f) in samples {
        let t = shared::import(&std::fs::read(dir.join(name)).unwrap(), &shared::ImportOptions::default()).unwrap();
        let r = leaks(&t, 5);
        let steps: Vec<i64> = f["allocated_after_step"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
        let wobble = steps.windows(2).map(|w| (w[1] - w[0]).abs()).max().unwrap();
        assert!(wobble > 100_000, "{name}: PyTorch's counter at step ends must wobble past the leak: {steps:?}");
        assert_eq!(r.leaking, f["leaking"].as_bool().unwrap(), "{name}: {}", r.verdict);
        if r.leaking {
            assert_eq!(r.growth_per_iteration_bytes, f["kept_per_step"].as_i64().unwrap(), "{name}: {}", r.verdict);
        } else {
            assert!(r.verdict.starts_with("no steady growth"), "{name}: {}", r.verdict);
        }
    }
}
