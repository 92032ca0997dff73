//! Traces that know their allocator settings (issue 66): a ResNet-50 on varying batches traced
//! by `collector trace` on an H200 under six settings (`tests/gpu/settings_check.sh`, into
//! `tests/data/settings/`; PyTorch's counters of an untraced twin of each run in `facts.json`).
//! Each trace names the settings it ran under, its own replay gives PyTorch's
//! `max_memory_reserved()` and `max_memory_allocated()` to the byte, and from each trace the
//! other five settings are predicted within 0.5 % allocated and 2 % reserved, or, across the
//! expandable divide, a range of reserved peaks that holds the measured one.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use shared::whatif::{own_settings, requests, simulate, what_if, AllocConf, SegmentAddresses, SimOptions, WhatIfOptions};
use shared::{import, ImportOptions, Trace};
use std::path::PathBuf;

const NAMES: [&str; 6] = ["default", "expandable", "split128", "divisions4", "expandable_divisions", "gc_fraction"];

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/settings")
}

fn load(name: &str) -> Trace {
    let p = dir().join(format!("{name}.mtrace.json.gz"));
    import(&std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())), &ImportOptions::default()).unwrap()
}

/// The configuration a run had, as given (the environment's, or the program's own call), and
/// its memory fraction.
fn setting(facts: &serde_json::Value) -> (AllocConf, Option<f64>) {
    let c = &facts["counters"];
    let text = [c["alloc_conf"].as_str().unwrap(), c["set_alloc_conf"].as_str().unwrap()]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(",");
    let total = c["device_total_memory"].as_f64().unwrap();
    let fraction = c["memory_limit_gib"].as_f64().map(|g| g * (1u64 << 30) as f64 / total);
    (AllocConf::parse(&text).unwrap(), fraction)
}

/// |predicted − measured| / measured.
fn close(predicted: u64, measured: u64) -> f64 {
    (predicted as f64 - measured as f64).abs() / measured as f64
}

#[test]
fn each_trace_knows_its_settings_and_predicts_the_other_five() {
    let facts: serde_json::Value = serde_json::from_slice(&std::fs::read(dir().join("facts.json")).unwrap()).unwrap();
    let traces: Vec<Trace> = NAMES.iter().map(|n| load(n)).collect();
    let mut worst = (0.0f64, 0.0f64);
    let mut misses: Vec<String> = Vec::new();
    for (i, t) in traces.iter().enumerate() {
        let f = &facts[NAMES[i]];
        let (conf, fraction) = setting(f);
        let own = own_settings(t);
        assert!(own.known, "{}", NAMES[i]);
        assert_eq!(own.conf, conf, "{}: the trace's settings against the run's", NAMES[i]);
        let own_expandable = own.conf.expandable_segments.unwrap_or(false);
        match (own.fraction_for(0), fraction) {
            (Some(a), Some(b)) => assert!((a - b).abs() < 1e-9, "{}: fraction {a} against {b}", NAMES[i]),
            (None, None) => {}
            other => panic!("{}: fractions {other:?}", NAMES[i]),
        }
        let counters = &f["counters"];
        let (allocated, reserved) = (counters["max_memory_allocated"].as_u64().unwrap(), counters["max_memory_reserved"].as_u64().unwrap());
        let r = what_if(t, &WhatIfOptions::default()).unwrap();
        let own = &r.settings[0];
        assert_eq!((own.allocated_peak_bytes, own.reserved_peak_bytes), (allocated, reserved), "{}: own replay", NAMES[i]);
        assert_eq!(r.recorded.replay_exact, Some(true), "{}", NAMES[i]);

        let reqs = requests(t);
        let dev = reqs.devices.iter().find(|d| !d.requests.is_empty()).unwrap();
        let total = t.meta.device_total_memory_bytes.unwrap();
        for other in NAMES.iter().filter(|&&n| n != NAMES[i]) {
            let (conf, fraction) = setting(&facts[other]);
            let opts = SimOptions::with_capacity(Some(total)).with_fraction(fraction);
            let out = simulate(dev, &conf, &opts).unwrap();
            let c = &facts[other]["counters"];
            let (measured_allocated, measured_reserved) =
                (c["max_memory_allocated"].as_u64().unwrap(), c["max_memory_reserved"].as_u64().unwrap());
            let (ea, er) = (close(out.allocated_peak_bytes, measured_allocated), close(out.reserved_peak_bytes, measured_reserved));
            // Across the expandable divide the recorded addresses say nothing of where the
            // driver puts the other regime's segments: the prediction is a range.
            let cross = conf.expandable_segments.unwrap_or(false) != own_expandable;
            let range = cross.then(|| {
                [SegmentAddresses::Lowest, SegmentAddresses::Highest]
                    .map(|a| simulate(dev, &conf, &opts.clone().placing(a)).unwrap().reserved_peak_bytes)
                    .into_iter()
                    .fold([out.reserved_peak_bytes; 2], |[lo, hi], p| [lo.min(p), hi.max(p)])
            });
            let in_range = range.is_some_and(|[lo, hi]| (lo..=hi).contains(&measured_reserved));
            eprintln!(
                "{:>22} predicting {other:>22}: allocated {:6.3} %, reserved {:6.3} %{}",
                NAMES[i],
                100.0 * ea,
                100.0 * er,
                range.map_or(String::new(), |[lo, hi]| format!(
                    " (range {:+.3} % to {:+.3} %{})",
                    100.0 * (lo as f64 / measured_reserved as f64 - 1.0),
                    100.0 * (hi as f64 / measured_reserved as f64 - 1.0),
                    if in_range { ", measured in it" } else { "" }
                ))
            );
            if ea > 0.005 || (er > 0.02 && !in_range) {
                misses.push(format!(
                    "{} predicting {other}: allocated {:.3} %, reserved {:.3} %, range {range:?}",
                    NAMES[i],
                    100.0 * ea,
                    100.0 * er
                ));
            }
            worst = (worst.0.max(ea), worst.1.max(er));
        }
    }
    eprintln!("worst: allocated {:.3} %, reserved {:.3} %", 100.0 * worst.0, 100.0 * worst.1);
    // Every pair within 0.5 % allocated and 2 % reserved, or, across the expandable divide,
    // the measured reserved peak inside the predicted range (expandable segments with
    // divisions predicting divisions alone: 3.26 % from the point, inside its range).
    assert!(worst.0 <= 0.005 && misses.is_empty(), "{misses:#?}");
}

#[test]
fn a_setting_across_the_expandable_divide_is_predicted_as_a_range() {
    let r = what_if(
        &load("default"),
        &WhatIfOptions { settings: vec!["expandable_segments:True".into(), "max_split_size_mb:128".into()], ..WhatIfOptions::default() },
    )
    .unwrap();
    let [lo, hi] = r.settings[1].reserved_peak_range_bytes.expect("expandable from an ordinary run: a range");
    assert!(lo <= r.settings[1].reserved_peak_bytes && r.settings[1].reserved_peak_bytes <= hi);
    assert_eq!(r.settings[2].reserved_peak_range_bytes, None, "one regime: the recorded addresses hold");
    assert_eq!(r.settings[0].reserved_peak_range_bytes, None);
    // From the expandable run, divisions alone: the point is 3.26 % off, the range holds it.
    let facts: serde_json::Value = serde_json::from_slice(&std::fs::read(dir().join("facts.json")).unwrap()).unwrap();
    let measured = facts["divisions4"]["counters"]["max_memory_reserved"].as_u64().unwrap();
    let r = what_if(
        &load("expandable_divisions"),
        &WhatIfOptions { settings: vec!["expandable_segments:False".into()], ..WhatIfOptions::default() },
    )
    .unwrap();
    let [lo, hi] = r.settings[1].reserved_peak_range_bytes.unwrap();
    assert!((lo..=hi).contains(&measured), "{lo}..={hi} against {measured}");
}
