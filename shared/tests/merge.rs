//! Merging one trace per rank: each rank keeps its own device, its peak to the byte (the real
//! snapshots' `torch.cuda.max_memory_allocated()` from facts.json), its events, layers and
//! stacks; clocks align on the wall clock; bad requests are errors.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use shared::analysis::device_peaks;
use shared::model::RankVar;
use shared::model::{Device, EventRecord, EventType, IterationSpan, Phase, SourceFormat, StrId, TraceMeta};
use shared::ranks::merge::{absent_ranks, merge, merge_with, InputRank, MergeError, MergeInput, MergeOptions};
use shared::ranks::{rank_trace, ranks};
use shared::{import, ImportOptions, Trace};
use std::path::PathBuf;

fn data(name: &str) -> Vec<u8> {
    std::fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data").join(name)).unwrap()
}

fn fact(sample: &str, key: &str) -> u64 {
    let facts: serde_json::Value = serde_json::from_slice(&data("facts.json")).unwrap();
    facts["samples"][sample][key].as_u64().unwrap()
}

fn load(name: &str) -> Trace {
    import(&data(name), &ImportOptions::default()).unwrap()
}

const SAMPLES: [&str; 2] = ["resnet18_sgd_2steps.pickle", "mlp_adam_3steps.pickle"];

/// The two samples were recorded seconds apart by one script: merged here as two ranks.
fn merged() -> Trace {
    merge(inputs()).unwrap()
}

fn inputs() -> Vec<MergeInput> {
    // A rank's snapshot lists every device of its host, used or not (here rank 1 also lists
    // cuda:1, which it never touched): only used devices come along.
    let mut rank1 = load(SAMPLES[1]);
    rank1.device_index(shared::model::Device { kind: "cuda".into(), index: 1, rank: None });
    // Given out of order: the merge sorts by rank.
    vec![
        MergeInput { trace: rank1, rank: 1, label: SAMPLES[1].into() },
        MergeInput { trace: load(SAMPLES[0]), rank: 0, label: SAMPLES[0].into() },
    ]
}

#[test]
fn each_rank_keeps_its_device_peak_events_and_layers() {
    let merged = merged();
    let peaks = device_peaks(&merged);
    assert_eq!(peaks.len(), 2);
    for (rank, sample) in SAMPLES.iter().enumerate() {
        let p = &peaks[rank];
        assert_eq!(p.rank, Some(rank as u32));
        assert_eq!(p.device, format!("cuda:0 (rank {rank})"));
        assert_eq!(p.peak_allocated_bytes, fact(sample, "max_allocated"), "{sample}");
        assert_eq!(p.peak_reserved_bytes, fact(sample, "max_reserved"), "{sample}");
        // The rank's events, in order, are its own trace's events (sizes, layers, stacks).
        let own = load(sample);
        assert_eq!(p.events, own.events.len());
        let d = merged.devices.iter().position(|x| x.rank == Some(rank as u32)).unwrap() as u8;
        let mine: Vec<usize> = (0..merged.events.len()).filter(|&i| merged.events.device[i] == d).collect();
        for (k, &i) in mine.iter().enumerate().step_by(97) {
            let (a, b) = (merged.memory_event(i), own.memory_event(k));
            assert_eq!(
                (a.size_bytes, a.layer_name, a.allocated_bytes, a.reserved_bytes),
                (b.size_bytes, b.layer_name, b.allocated_bytes, b.reserved_bytes),
                "event {k} of {sample}"
            );
            let frames = |t: &Trace, e: usize| {
                t.stacks.stack_of_event(e).map(|s| t.stacks.stack(s).map(|f| t.str(f.name).to_owned()).collect::<Vec<_>>())
            };
            assert_eq!(frames(&merged, i), frames(&own, k));
        }
    }
    // Times are in order and start near zero (wall-clock aligned, earliest rank first).
    assert!(merged.events.ts_ns.windows(2).all(|w| w[0] <= w[1]));
    assert_eq!(merged.events.ts_ns[0], 0);
    assert!(merged.meta.reported.keys().all(|k| k.starts_with("rank")), "{:?}", merged.meta.reported);
}

#[test]
fn a_merged_trace_survives_the_own_format() {
    let merged = merged();
    let mut bytes = Vec::new();
    shared::export::native::write(&merged, &mut bytes).unwrap();
    let back = import(&bytes, &ImportOptions::default()).unwrap();
    assert_eq!(device_peaks(&back), device_peaks(&merged));
    assert_eq!(back.devices, merged.devices);
}

#[test]
fn duplicate_ranks_and_nothing_are_refused() {
    let mut two = inputs();
    two[0].rank = 0;
    let e = merge(two).unwrap_err();
    assert!(matches!(e, MergeError::DuplicateRank(0, _, _)), "{e}");
    assert!(e.to_string().contains("rank 0 is given twice"));
    assert!(matches!(merge(Vec::new()), Err(MergeError::Empty)));
}

#[test]
fn traces_of_different_runs_are_refused_unless_asked() {
    // Rank 1 recorded ten minutes later (snapshot times are wall-clock times).
    let later = || {
        let mut i = inputs();
        let t = &mut i[0].trace;
        t.events.ts_ns.iter_mut().for_each(|t| *t += 600_000_000_000);
        t.scopes.iter_mut().for_each(|s| (s.start_ns, s.end_ns) = (s.start_ns + 600_000_000_000, s.end_ns + 600_000_000_000));
        assert!(t.ops.is_empty());
        i
    };
    let e = merge(later()).unwrap_err();
    assert!(matches!(e, MergeError::Disjoint { .. }), "{e}");
    let text = e.to_string();
    assert!(text.contains(SAMPLES[0]) && text.contains(SAMPLES[1]) && text.contains("--allow-disjoint") && text.contains("UTC"), "{text}");
    let m = merge_with(later(), &MergeOptions { allow_disjoint: true, ..MergeOptions::default() }).unwrap();
    assert!(m.meta.warnings.iter().any(|w| w.contains("were recorded far apart in time")), "{:?}", m.meta.warnings);
}

#[test]
fn each_rank_comes_back_out_whole() {
    let merged = merged();
    assert_eq!(ranks(&merged), [0, 1]);
    for (rank, sample) in SAMPLES.iter().enumerate() {
        let own = load(sample);
        let back = rank_trace(&merged, rank as u32).unwrap();
        assert_eq!(back.events.len(), own.events.len());
        let (a, b) = (shared::analysis::summary(&back), shared::analysis::summary(&own));
        assert_eq!((a.peak_allocated_bytes, a.peak_reserved_bytes), (b.peak_allocated_bytes, b.peak_reserved_bytes), "{sample}");
        assert_eq!(shared::analysis::layer_stats(&back), shared::analysis::layer_stats(&own), "{sample}");
        assert_eq!(back.initial_segments.len(), own.initial_segments.len());
        assert_eq!(back.meta.reported, own.meta.reported);
    }
    assert!(rank_trace(&merged, 7).is_none());
    assert!(ranks(&load(SAMPLES[0])).is_empty());
}

/// What every merge takes its inputs through: a merged trace brings each of its ranks (so
/// merged traces merge again, the result equal to merging the ranks at once), one process's
/// trace the rank it is given, else the one it names, else its position or an error; the ranks
/// none brings are named.
#[test]
fn a_merged_trace_brings_its_ranks_to_a_merge_and_the_absent_are_named() {
    let first = merge(vec![rank(0, "a", 4, 0, Some(5)), rank(1, "a", 4, 0, Some(5))]).unwrap();
    let mut inputs = MergeInput::of(first, "first.mtrace.json", InputRank::Given(9)).unwrap();
    assert_eq!(
        inputs.iter().map(|i| (i.rank, i.label.as_str())).collect::<Vec<_>>(),
        [(0, "first.mtrace.json rank 0"), (1, "first.mtrace.json rank 1")]
    );
    let third = rank(3, "a", 4, 0, Some(5));
    let named = |label: &str, rank| MergeInput::of(third.trace.clone(), label, rank).map(|i| i.iter().map(|i| i.rank).collect::<Vec<_>>());
    assert_eq!(named("rank3.mtrace.json", InputRank::NamedOr(7)).unwrap(), [3]);
    assert_eq!(named("node.mtrace.json", InputRank::NamedOr(7)).unwrap(), [7]);
    let e = named("node.mtrace.json", InputRank::Named).unwrap_err();
    assert!(matches!(&e, MergeError::NoRank { label } if label == "node.mtrace.json"), "{e}");
    inputs.extend(MergeInput::of(third.trace, "rank3.mtrace.json", InputRank::Named).unwrap());
    assert_eq!(inputs.iter().map(|i| i.rank).collect::<Vec<_>>(), [0, 1, 3]);
    let absent = absent_ranks(&inputs, 4, |r| format!("rank {r} never connected"));
    assert_eq!(absent, [(2, "rank 2 never connected".to_owned())].into());
    let again = merge_with(inputs, &MergeOptions { missing_reasons: absent, ..MergeOptions::default() }).unwrap();
    let at_once = merge(vec![rank(0, "a", 4, 0, Some(5)), rank(1, "a", 4, 0, Some(5)), rank(3, "a", 4, 0, Some(5))]).unwrap();
    assert_eq!(ranks(&again), [0, 1, 3]);
    assert_eq!(again.meta.missing_ranks, [2]);
    assert_eq!(again.events.len(), at_once.events.len());
    assert_eq!(shared::analysis::device_peaks(&again), shared::analysis::device_peaks(&at_once));
    assert!(again.meta.warnings.contains(&"rank 2 of 4 is missing: rank 2 never connected".to_owned()), "{:?}", again.meta.warnings);
}

/// A rank of a torchrun job: `job` and `WORLD_SIZE` as the capture records them, two
/// allocations and an iteration `[it, it + 10 ms)` on its own clock.
fn rank(rank: u32, job: &str, world: u64, it_ns: u64, wall: Option<u64>) -> MergeInput {
    let mut meta = TraceMeta::new(SourceFormat::MemoryTracer);
    meta.job = Some(job.into());
    meta.start_unix_ns = wall;
    meta.report_rank_var(RankVar::WorldSize, world);
    let mut t = Trace::new(meta);
    let d = t.device_index(Device { kind: "cpu".into(), index: 0, rank: None });
    for (k, ts) in [it_ns + 1_000, it_ns + 2_000].into_iter().enumerate() {
        t.events.push(EventRecord {
            ts_ns: ts,
            event_type: EventType::Alloc,
            phase: Phase::Forward,
            size_bytes: 1024 << (k + rank as usize),
            address: 4096 * (k as u64 + 1),
            layer: StrId::NONE,
            device: d,
            stream: 0,
            totals: None,
        });
    }
    t.iterations.push(IterationSpan { index: 0, start_ns: it_ns, end_ns: it_ns + 10_000_000 });
    t.finish();
    MergeInput { trace: t, rank, label: format!("rank{rank}.mtrace.json") }
}

#[test]
fn ranks_of_other_jobs_or_past_the_world_size_are_refused() {
    let e = merge(vec![rank(0, "a@host:29500", 2, 0, Some(1)), rank(1, "b@host:29500", 2, 0, Some(1))]).unwrap_err();
    assert!(e.to_string().contains("come from different jobs (job a@host:29500 and job b@host:29500)"), "{e}");
    let e = merge(vec![rank(0, "a", 2, 0, Some(1)), rank(1, "a", 4, 0, Some(1))]).unwrap_err();
    assert!(e.to_string().contains("world sizes 2 and 4"), "{e}");
    let e = merge(vec![rank(0, "a", 2, 0, Some(1)), rank(2, "a", 2, 0, Some(1))]).unwrap_err();
    assert!(e.to_string().contains("rank2.mtrace.json is rank 2 but its job has 2 ranks"), "{e}");
}

#[test]
fn missing_ranks_are_named_with_their_reason() {
    let opts = MergeOptions { missing_reasons: [(2, "it never connected".to_owned())].into(), ..MergeOptions::default() };
    let m = merge_with(vec![rank(0, "a", 4, 0, Some(5)), rank(3, "a", 4, 0, Some(5))], &opts).unwrap();
    assert_eq!(m.meta.missing_ranks, [1, 2]);
    assert!(m.meta.warnings.contains(&"rank 1 of 4 is missing: no trace of it was given".to_owned()), "{:?}", m.meta.warnings);
    assert!(m.meta.warnings.contains(&"rank 2 of 4 is missing: it never connected".to_owned()), "{:?}", m.meta.warnings);
}

#[test]
fn clocks_align_on_the_wall_clock_else_on_the_first_iteration() {
    // Wall clocks: rank 1 started 3 ms after rank 0 (same 1 ms offset to their iteration).
    let m = merge(vec![rank(0, "a", 2, 1_000_000, Some(10_000_000)), rank(1, "a", 2, 1_000_000, Some(13_000_000))]).unwrap();
    let first = |m: &Trace, d: usize| m.events.ts_ns[(0..m.events.len()).find(|&i| m.events.device[i] as usize == d).unwrap()];
    assert_eq!(first(&m, 1) - first(&m, 0), 3_000_000);
    assert!(m.meta.warnings.is_empty(), "{:?}", m.meta.warnings);
    // No wall clocks: each rank's first iteration starts at rank 0's.
    let m = merge(vec![rank(0, "a", 2, 1_000_000, None), rank(1, "a", 2, 7_000_000, None)]).unwrap();
    assert_eq!(first(&m, 1), first(&m, 0));
    assert!(m.meta.warnings[0].contains("aligned on their first iteration"), "{:?}", m.meta.warnings);
}
