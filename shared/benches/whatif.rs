//! The allocator what-if at a million events: a Llama's training trace (tests/data/whatif,
//! an H200) copied back to back, each copy's blocks at addresses of their own, replayed under
//! the run's own settings and six others (`collector whatif` with six `--alloc-conf`), five
//! times; prints the request extraction and the seven replays' time (median, min, max).
//! Issue 48's target: under 5 s on the 2-core development machine.
//!
//!     cargo bench -p shared --bench whatif

#![allow(clippy::unwrap_used, clippy::expect_used)] // benches fail loudly by design

use shared::whatif::{what_if, WhatIfOptions};
use shared::{import, ImportOptions};
use std::path::Path;
use std::time::Instant;

mod support;
use support::replicate_apart;

const SETTINGS: [&str; 6] = [
    "expandable_segments:True",
    "max_split_size_mb:128",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:[256:1,512:2,>:4]",
    "expandable_segments:True,roundup_power2_divisions:4",
    "max_split_size_mb:256,max_non_split_rounding_mb:512",
];

fn main() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/whatif/llama.default.mtrace.json.gz");
    let base = import(&std::fs::read(path).unwrap(), &ImportOptions::default()).unwrap();
    let big = replicate_apart(&base, 1_000_000usize.div_ceil(base.events.len()));
    let opts = WhatIfOptions { settings: SETTINGS.iter().map(|s| (*s).to_owned()).collect(), ..Default::default() };
    let mut times = Vec::new();
    let mut extraction = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        let reqs = shared::whatif::requests(&big);
        extraction.push(started.elapsed().as_secs_f64());
        assert!(reqs.devices.iter().map(|d| d.requests.len()).sum::<usize>() >= 1_000_000 / 2);
        let started = Instant::now();
        let report = what_if(&big, &opts).unwrap();
        times.push(started.elapsed().as_secs_f64());
        assert_eq!(report.settings.len(), 7);
    }
    let fmt = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        format!("median {:.2} s (min {:.2}, max {:.2})", v[v.len() / 2], v[0], v[v.len() - 1])
    };
    println!("{} events: the requests {}", big.events.len(), fmt(extraction));
    println!(
        "{} events: whatif under its own settings and {} others (with the requests), {}",
        big.events.len(),
        SETTINGS.len(),
        fmt(times)
    );
}
