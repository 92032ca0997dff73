//! Imports trace files the way `collector summary` does (streamed from disk) and prints the
//! throughput and the process's peak memory: the scale benchmark of the importers, without
//! libtorch in the process (`collector` links it; this does not).
//!
//!     cargo run --release -p shared --example import_file -- big.pickle [...]

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = status.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok()).unwrap_or(0);
    kb * 1024
}

fn main() {
    let before = peak_rss_bytes();
    for path in std::env::args().skip(1) {
        let size = std::fs::metadata(&path).expect("the file exists").len();
        let file = std::fs::File::open(&path).expect("the file opens");
        let start = Instant::now();
        let trace = shared::import::import_reader(std::io::BufReader::with_capacity(4 << 20, file), &shared::ImportOptions::default())
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        let secs = start.elapsed().as_secs_f64();
        let import_peak = peak_rss_bytes();
        let summary = shared::analysis::summary(&trace);
        println!(
            "{path}: {:.1} MB, {} events in {secs:.2} s ({:.0} MB/s), peak allocated {} B, trace {:.1} MiB, peak RSS {:.1} MiB after import, {:.1} MiB after summary (at start {:.1} MiB)",
            size as f64 / 1e6,
            trace.events.len(),
            size as f64 / 1e6 / secs,
            summary.peak_allocated_bytes,
            trace.memory_footprint().total() as f64 / (1 << 20) as f64,
            import_peak as f64 / (1 << 20) as f64,
            peak_rss_bytes() as f64 / (1 << 20) as f64,
            before as f64 / (1 << 20) as f64,
        );
    }
}
