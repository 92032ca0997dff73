//! Opens a trace file as the viewer's worker does (streamed import, overview, the first
//! answers the page asks for) and prints how long each stage took, natively: where the time
//! of opening a file goes, without a browser.
//!
//!     cargo run --release -p shared --example open_stages -- trace.pickle [...]
//!
//! `--repeat N` opens each file N times and prints every run (the first is cold; the later
//! ones are what a warm process does, and a loop to record with `perf`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use shared::explore::{Opened, Request, Session};
use std::time::Instant;

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let repeat = match args.iter().position(|a| a == "--repeat") {
        Some(at) => {
            let n = args.get(at + 1).and_then(|n| n.parse().ok()).expect("--repeat N: a count");
            args.drain(at..at + 2);
            n
        }
        None => 1,
    };
    for path in args.iter().flat_map(|p| std::iter::repeat_n(p.as_str(), repeat)) {
        let size = std::fs::metadata(path).expect("the file exists").len();
        let file = std::io::BufReader::new(std::fs::File::open(path).expect("the file opens"));
        let start = Instant::now();
        let mut last = (String::from("start"), start);
        let mut lines = Vec::new();
        let opened = Session::open_reader(path, size, file, |stage| {
            let now = Instant::now();
            lines.push(format!("  {:>9.2} ms  {} (peak RSS then {} MiB)", (now - last.1).as_secs_f64() * 1e3, last.0, peak_rss_mib()));
            last = (stage.to_owned(), now);
        })
        .unwrap_or_else(|e| panic!("{path}: {e}"));
        let now = Instant::now();
        lines.push(format!("  {:>9.2} ms  {} (peak RSS then {} MiB)", (now - last.1).as_secs_f64() * 1e3, last.0, peak_rss_mib()));
        let Opened::Trace(mut session, overview) = opened else { panic!("{path}: a sweep") };
        let t = Instant::now();
        let overview_json = serde_json::to_string(&overview).unwrap().len();
        lines.push(format!("  {:>9.2} ms  overview as JSON ({overview_json} B)", t.elapsed().as_secs_f64() * 1e3));
        let full = (0.0, overview.duration_s.max(1e-9));
        let requests = [
            ("timeline", Request::Timeline { start_s: full.0, end_s: full.1, buckets: 1300 }),
            ("active", Request::Active { start_s: full.0, end_s: full.1, columns: 1210 }),
            ("fragmentation", Request::Timeline { start_s: full.0, end_s: full.1, buckets: 1300 }),
            ("segments", Request::Segments { t_s: overview.summary.peak_time_s }),
        ];
        for (name, r) in requests {
            let t = Instant::now();
            let answer = session.answer(&r);
            let ms = t.elapsed().as_secs_f64() * 1e3;
            let t = Instant::now();
            let bytes = serde_json::to_string(&answer).unwrap().len();
            lines.push(format!(
                "  {ms:>9.2} ms  {name} ({bytes} B of JSON in {:.2} ms; peak RSS {} MiB)",
                t.elapsed().as_secs_f64() * 1e3,
                peak_rss_mib()
            ));
        }
        println!(
            "{path}: {:.1} MB, {} events, peak allocated {} B, total {:.1} ms",
            size as f64 / 1e6,
            session.trace().events.len(),
            overview.summary.peak_allocated_bytes,
            start.elapsed().as_secs_f64() * 1e3
        );
        for l in lines {
            println!("{l}");
        }
    }
}

/// This process's peak resident memory (VmHWM), in MiB; 0 where /proc is not there.
fn peak_rss_mib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("VmHWM:")?.split_whitespace().next()?.parse::<u64>().ok()).unwrap_or(0) / 1024
}
