//! Merging one trace per rank: each rank keeps its own device, its peak to the byte (the real
//! snapshots' `torch.cuda.max_memory_allocated()` from facts.json), its events, layers and
//! stacks; clocks align on the wall clock; bad requests are errors.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use shared::analysis::device_peaks;
use shared::merge::{merge, MergeError, MergeInput};
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
    let merged = merge(inputs()).unwrap();
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
            assert_eq!((a.size_bytes, a.layer_name, a.allocated_bytes, a.reserved_bytes), (b.size_bytes, b.layer_name, b.allocated_bytes, b.reserved_bytes), "event {k} of {sample}");
            let frames = |t: &Trace, e: usize| t.stacks.stack_of_event(e).map(|s| t.stacks.stack(s).map(|f| t.str(f.name).to_owned()).collect::<Vec<_>>());
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
    let merged = merge(inputs()).unwrap();
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
