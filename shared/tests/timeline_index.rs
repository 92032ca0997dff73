//! The multi-resolution timeline answers exactly what the full scan answers, for any window,
//! bucket count and device, on real traces (one device, several ranks merged, overrides).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use shared::analysis::timeline_index::TimelineIndex;
use shared::analysis::{timeline, TimelineOptions};
use shared::{import, ImportOptions};
use std::path::PathBuf;

fn sample(name: &str) -> shared::model::Trace {
    let raw = std::fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data").join(name)).unwrap();
    import(&raw, &ImportOptions::default()).unwrap()
}

/// A small deterministic generator, so that failures reproduce.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn unit(&mut self) -> f64 {
        self.next() as f64 / (1u64 << 31) as f64
    }
}

fn check(name: &str, trace: &shared::model::Trace) {
    let index = TimelineIndex::new(trace);
    let span_s = (trace.events.ts_ns.last().unwrap() - trace.start_ns()) as f64 * 1e-9;
    let mut rng = Lcg(7);
    let devices: Vec<Option<u8>> = std::iter::once(None).chain((0..trace.devices.len() as u8).map(Some)).collect();
    for round in 0..300 {
        let buckets = [1, 2, 7, 100, 640, 2000, 100_000][round % 7];
        let mut options = TimelineOptions::default().with_buckets(buckets);
        if round % 5 != 0 {
            let a = rng.unit() * span_s * 1.1 - span_s * 0.05;
            let b = a + rng.unit().powi(3) * span_s;
            options = options.with_window(a, b);
        }
        options.device = devices[round % devices.len()];
        let scan = timeline(trace, &options);
        let fast = index.timeline(trace, &options);
        assert_eq!(fast, scan, "{name}: round {round}, {options:?}");
    }
}

#[test]
fn the_index_answers_every_window_as_the_full_scan_does() {
    for name in ["resnet18_sgd_2steps.pickle", "mlp_adam_3steps.pickle", "convnet_profiler_trace.json", "oom_program.mtrace.json"] {
        let trace = sample(name);
        check(name, &trace);
    }
    // Two ranks merged: two devices interleaved.
    let a = sample("mlp_adam_3steps.pickle");
    let b = sample("resnet18_sgd_2steps.pickle");
    let inputs = vec![
        shared::ranks::merge::MergeInput { trace: a, rank: 0, label: "a".into() },
        shared::ranks::merge::MergeInput { trace: b, rank: 1, label: "b".into() },
    ];
    let options = shared::ranks::merge::MergeOptions { allow_disjoint: true, ..Default::default() };
    let merged = shared::ranks::merge::merge_with(inputs, &options).unwrap();
    assert!(merged.devices.len() >= 2);
    check("merged", &merged);
}
