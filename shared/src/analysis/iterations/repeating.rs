//! Iterations found in a trace's allocations alone: the period of the sequence of allocation
//! sizes any training or inference loop produces, for traces that mark no iteration.

use crate::hash::FastMap;
use crate::model::{EventType, Trace};

/// Periods (in allocations) always tried; longer ones are tried where the sizes say so.
const SHORT_PERIODS: usize = 64;
/// Longer periods tried: the most frequent distances between recurring size triples.
const LONG_CANDIDATES: usize = 32;

/// Iterations of a loop found in its allocations (on the busiest device): the period `p` of
/// the sequence of allocation sizes, the one under which the longest stretch repeats itself
/// (`size[i] == size[i + p]`, three in four at least) for at least three periods; of periods
/// that explain as much, the shortest (twice a period repeats as long). Each iteration starts
/// at one repetition; an earlier iteration that starts with the same sizes is taken in too
/// (the first fills caches and creates state). The trailing allocations after the last full
/// period (a teardown, a final evaluation) are no iteration: the last iteration ends after as
/// many events as the others took. Empty when nothing repeats three times.
pub fn repeating_spans(trace: &Trace) -> Vec<(u64, u64)> {
    let ev = &trace.events;
    let device = crate::analysis::peak_device(trace);
    let on_device: Vec<usize> = (0..ev.len()).filter(|&i| ev.device[i] == device).collect();
    let allocs: Vec<usize> = on_device.iter().copied().filter(|&i| ev.event_type(i) == EventType::Alloc).collect();
    let sizes: Vec<u64> = allocs.iter().map(|&i| ev.size_bytes[i]).collect();
    let Some((run_start, period, region_end)) = find_period(&sizes) else { return Vec::new() };
    // Where in the period iterations start: the run of repetitions begins where the first
    // iteration stops differing (a workspace it alone allocates), which can be mid-iteration.
    // Of the phases, the one giving the most iterations (full periods up to the end of the
    // repetitions, and earlier iterations that begin as they do), the earliest first.
    let phases = if period <= MAX_PHASES { run_start..run_start + period } else { run_start..run_start + 1 };
    let mut best: Vec<usize> = Vec::new();
    for q in phases {
        if q + period > region_end {
            break;
        }
        let mut starts: Vec<usize> = (0..(region_end - q) / period).map(|k| q + k * period).collect();
        extend_back(&sizes, period, &mut starts);
        if starts.len() > best.len() || (starts.len() == best.len() && starts[0] < best[0]) {
            best = starts;
        }
    }
    if best.len() < 3 {
        return Vec::new();
    }
    let starts = best;
    // Iteration k runs from its first allocation to the next iteration's; the last one as
    // many device events as the median iteration.
    let event_pos = |alloc: usize| on_device.partition_point(|&i| i < allocs[alloc]);
    let pos: Vec<usize> = starts.iter().map(|&a| event_pos(a)).collect();
    let mut lengths: Vec<usize> = pos.windows(2).map(|w| w[1] - w[0]).collect();
    lengths.sort_unstable();
    let median = lengths.get(lengths.len() / 2).copied().unwrap_or(period);
    let last_end = on_device.get(pos[pos.len() - 1] + median).map_or_else(|| trace.end_ns(), |&i| ev.ts_ns[i]);
    let ts: Vec<u64> = starts.iter().map(|&a| ev.ts_ns[allocs[a]]).collect();
    ts.iter().enumerate().map(|(k, &s)| (s, ts.get(k + 1).copied().unwrap_or(last_end))).collect()
}

/// Earlier iterations put in front of `starts`: each begins with the first iteration's two
/// first sizes, up to two periods back (a first iteration may allocate more or less: caches,
/// workspaces, state it creates), and holds at least half of a period's sizes; of such
/// beginnings, the one holding the most, then the one a period back; at most [`MAX_EARLIER`].
fn extend_back(sizes: &[u64], period: usize, starts: &mut Vec<usize>) {
    let anchor = period.min(2);
    let mut taken = 0;
    while let Some(&first) = starts.first().filter(|_| taken < MAX_EARLIER) {
        taken += 1;
        let from = first.saturating_sub(2 * period);
        let mut wanted: FastMap<u64, usize> = FastMap::default();
        for &x in &sizes[first..first + period] {
            *wanted.entry(x).or_default() += 1;
        }
        let held = |a: usize| {
            let mut left = wanted.clone();
            sizes[a..first]
                .iter()
                .filter(|x| {
                    left.get_mut(x).is_some_and(|c| {
                        *c > 0 && {
                            *c -= 1;
                            true
                        }
                    })
                })
                .count()
        };
        let mut candidates: Vec<usize> =
            (from..first).filter(|&a| a + anchor <= first && sizes[a..a + anchor] == sizes[first..first + anchor]).collect();
        // The nearest to a period back, a bounded number (each costs a period's comparison).
        candidates.sort_by_key(|&a| (first - a).abs_diff(period));
        candidates.truncate(MAX_BEGINNINGS);
        let best = candidates
            .into_iter()
            .map(|a| (held(a), std::cmp::Reverse((first - a).abs_diff(period)), a))
            .filter(|&(h, _, _)| 2 * h >= period)
            .max();
        match best {
            Some((_, _, a)) => starts.insert(0, a),
            None => break,
        }
    }
}

/// Earlier iterations taken in front of the repeating ones, at most: each phase tried weighs
/// them, so a trace made to repeat only late cannot cost a pass per allocation.
const MAX_EARLIER: usize = 16;

/// Periods up to which every phase is tried.
const MAX_PHASES: usize = 256;
/// Beginnings of an earlier iteration weighed, at most.
const MAX_BEGINNINGS: usize = 64;

/// The repeating part of `sizes`: (first index, period, end of the repetitions), at least
/// three periods long.
fn find_period(sizes: &[u64]) -> Option<(usize, usize, usize)> {
    let n = sizes.len();
    if n < 3 {
        return None;
    }
    let max_p = n / 3;
    let mut candidates: Vec<usize> = (1..=max_p.min(SHORT_PERIODS)).collect();
    // Distances between recurrences of each triple of sizes, most frequent first.
    let mut last: FastMap<(u64, u64, u64), usize> = FastMap::default();
    let mut distances: FastMap<usize, usize> = FastMap::default();
    for i in 0..n.saturating_sub(2) {
        if let Some(prev) = last.insert((sizes[i], sizes[i + 1], sizes[i + 2]), i) {
            let d = i - prev;
            if d > SHORT_PERIODS && d <= max_p {
                *distances.entry(d).or_default() += 1;
            }
        }
    }
    let mut by_count: Vec<(usize, usize)> = distances.into_iter().collect();
    by_count.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    candidates.extend(by_count.into_iter().take(LONG_CANDIDATES).map(|(d, _)| d));
    // (covered allocations, period, run start, run length) of the best period.
    let mut best: Option<(usize, usize, usize, usize)> = None;
    for p in candidates {
        let (run_start, run_len) = longest_repeat(sizes, p);
        if run_len < 2 * p {
            continue;
        }
        let covered = run_len + p;
        // A longer period must explain more than a shorter one to win (its multiples tie).
        if best.is_none_or(|b| covered > b.0 || (covered == b.0 && p < b.1)) {
            best = Some((covered, p, run_start, run_len));
        }
    }
    let (covered, p, run_start, _) = best?;
    Some((run_start, p, run_start + covered))
}

/// The longest stretch `i..i + len` where `sizes[i] == sizes[i + p]` holds for three in four
/// positions at least (data-dependent shapes change a few sizes), starting and ending with a
/// match: (start, len).
fn longest_repeat(sizes: &[u64], p: usize) -> (usize, usize) {
    let n = sizes.len();
    let (mut best_start, mut best_len) = (0, 0);
    let mut start = 0;
    let (mut matches, mut misses) = (0usize, 0usize);
    let mut last_match = None;
    for i in 0..n.saturating_sub(p) {
        if sizes[i] == sizes[i + p] {
            if last_match.is_none() {
                start = i;
                (matches, misses) = (0, 0);
            }
            matches += 1;
            last_match = Some(i);
            let len = i + 1 - start;
            if len > best_len {
                (best_start, best_len) = (start, len);
            }
        } else if last_match.is_some() {
            misses += 1;
            if misses * 3 > matches {
                last_match = None;
            }
        }
    }
    (best_start, best_len)
}
