//! Leak detection across iterations: does memory held from one iteration to the next grow once
//! the first iteration has warmed the caches up, and which allocations, born after warm-up and
//! never freed, make the growth (grouped by layer and innermost frame)?
//!
//! The verdict does not depend on where an iteration is cut. Two kinds of evidence count, either
//! enough: the lowest allocated level in each iteration (a point every iteration passes, where
//! its temporaries are gone) rising steadily, and a same-sized set of allocations that each
//! iteration leaves behind, never freed, while the totals at iteration ends wobble with the data
//! (a mixture of experts routing batches of varying size, sequences of varying length). A loop
//! that leaves allocations of differing sizes behind is called uncertain, never a leak.
//!
//! Iterations come from boundaries the user gives, else [`super::iterations::spans`] (marks,
//! profiler steps, optimizer steps, else the repeating allocation sizes of the loop).

use crate::hash::FastMap;
use crate::model::{EventType, Trace};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What `leaks` found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LeakReport {
    /// Where the iterations came from (`iteration marks`, `optimizer steps`) or why there are
    /// none.
    pub iterations_from: String,
    pub iterations: usize,
    /// Leading iterations left out (the first one fills the allocator's cache and creates
    /// gradients and optimizer state).
    pub warmup: usize,
    /// The device analysed (the peak's).
    pub device: String,
    /// Allocated bytes at the end of each iteration.
    pub allocated_at_end_bytes: Vec<u64>,
    /// The lowest allocated bytes in each iteration: the level every iteration comes back to.
    #[serde(default)]
    pub allocated_low_bytes: Vec<u64>,
    /// Bytes born in each iteration and still alive when the last iteration ends, whatever
    /// the program's teardown frees later (the last iteration's are its results, which may
    /// still be in use, and are not counted as evidence).
    #[serde(default)]
    pub kept_per_iteration_bytes: Vec<u64>,
    /// Growth per iteration: the median rise of the lowest level after warm-up, or, when only
    /// the kept allocations show a leak, the median bytes each iteration keeps.
    pub growth_per_iteration_bytes: i64,
    /// Iterations after warm-up that agree with that growth (within 5 % or 4 KiB).
    pub agreeing: usize,
    /// Iterations after warm-up compared.
    pub compared: usize,
    pub leaking: bool,
    /// Allocations born after warm-up and alive when the last iteration ends, those that grew
    /// in most iterations first.
    pub survivors: Vec<LeakGroup>,
    pub verdict: String,
}

/// Never-freed allocations of one layer, operator and frame.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LeakGroup {
    pub layer: String,
    /// The innermost operator running when it was allocated, when the trace has operators.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
    /// The innermost stack frame, when the trace has stacks.
    pub frame: Option<String>,
    /// What holds it when the last iteration ends (`python train:history`, `optimizer_state
    /// weight.exp_avg in fc`), where the capture recorded holders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    pub bytes: u64,
    pub allocations: usize,
    /// Iterations (after warm-up) it grew in, and bytes per such iteration.
    pub iterations: usize,
    pub bytes_per_iteration: f64,
}

/// How to look for leaks.
#[derive(Clone, Debug, Default)]
pub struct LeakOptions {
    /// Groups of never-freed allocations to list.
    pub top: usize,
    /// Iteration boundaries the user gives, in seconds since the trace's start (each
    /// iteration ends at one; the first starts at the trace's start); they replace any the
    /// trace has.
    pub boundaries_s: Option<Vec<f64>>,
}

/// Spans ending at the user's boundaries (seconds since the trace's start), in order.
fn user_spans(trace: &Trace, boundaries_s: &[f64]) -> Vec<(u64, u64)> {
    let start = trace.start_ns();
    let mut ends: Vec<u64> =
        boundaries_s.iter().filter(|b| b.is_finite() && **b >= 0.0).map(|b| start.saturating_add((b * 1e9) as u64)).collect();
    ends.sort_unstable();
    ends.dedup();
    let mut from = start;
    ends.into_iter()
        .map(|e| {
            let s = (from, e);
            from = e;
            s
        })
        .collect()
}

/// Iterations a leak verdict needs: growth after a warm-up, seen more than once.
pub const MIN_ITERATIONS: usize = 3;

/// Finds steady growth across iterations and what causes it.
pub fn leaks(trace: &Trace, top: usize) -> LeakReport {
    leaks_with(trace, &LeakOptions { top, boundaries_s: None })
}

/// [`leaks`] with options.
pub fn leaks_with(trace: &Trace, opts: &LeakOptions) -> LeakReport {
    let (spans, from) = match &opts.boundaries_s {
        Some(b) => (user_spans(trace, b), "the boundaries given"),
        None => {
            let found = super::iterations::spans(trace);
            (found.bounds(), found.from.describe())
        }
    };
    let device = super::peak_device(trace);
    let device_name = trace.devices.get(device as usize).map(|d| d.to_string()).unwrap_or_default();
    let n = spans.len();
    let warmup = usize::from(n >= 3);
    let levels = levels(trace, device, &spans);
    let survivors = survivor_groups(trace, &spans, warmup, &levels.live, opts.top);

    // Evidence 1: the lowest level rises by about the same amount in most iterations, and the
    // whole span rises with it (a cycle of batch sizes has a positive median step but no net
    // growth).
    let low = steady_growth(&levels.low, warmup);
    // Evidence 2: the iterations after warm-up but the last leave the same bytes behind.
    let kept_window = &levels.kept[warmup..n.saturating_sub(1).max(warmup)];
    let kept = same_kept(kept_window);
    // Evidence 3: (nearly) every iteration keeps bytes, their amount following the data, and
    // the lowest level rises by what they keep.
    let varying = if kept.is_none() && low.is_none() { varying_kept(kept_window, &levels.low, warmup) } else { None };
    let (leaking, growth, agreeing, compared) = match (low, kept.or(varying)) {
        (Some(g), _) => (true, g.median, g.agreeing, g.compared),
        (None, Some(k)) => (true, k.median, k.agreeing, k.compared),
        (None, None) => {
            let compared = n.saturating_sub(warmup + 1);
            (false, median(&diffs(&levels.low, warmup)), 0, compared)
        }
    };
    let fmt = |b: i64| format!("{}{}", if b < 0 { "-" } else { "" }, crate::units::format_bytes(b.unsigned_abs()));
    let spread = |v: &[u64]| diffs(v, warmup).iter().map(|g| g.unsigned_abs()).max().unwrap_or(0);
    let leaving: Vec<u64> = kept_window.iter().copied().filter(|&b| b > 0).collect();
    let verdict = if n < MIN_ITERATIONS {
        format!("not enough iterations to tell ({n} found from {from}; leaks need {MIN_ITERATIONS} or more)")
    } else if low.is_some() {
        format!(
            "leak: allocated memory grows by {} per iteration ({agreeing} of {compared} iterations after warm-up agree, at the lowest level of each)",
            fmt(growth)
        )
    } else if varying.is_some() {
        let kept_by = survivors.first().map(|g| format!(", most kept by {}", g.layer)).unwrap_or_default();
        format!(
            "leak: {}–{} per iteration, differing with the data, born in each iteration and never freed ({agreeing} of {compared} \
             iterations after warm-up keep some; the lowest allocated level rises by {} over them){kept_by}",
            crate::units::format_bytes(leaving.iter().copied().min().unwrap_or(0)),
            crate::units::format_bytes(leaving.iter().copied().max().unwrap_or(0)),
            crate::units::format_bytes(
                levels.low.last().copied().unwrap_or(0).saturating_sub(levels.low.get(warmup).copied().unwrap_or(0))
            )
        )
    } else if leaking {
        format!(
            "leak: {} born in each iteration is never freed ({agreeing} of {compared} iterations after warm-up leave the same bytes behind), \
             while allocated memory at iteration ends moves by up to {}",
            fmt(growth),
            crate::units::format_bytes(spread(&levels.at_end))
        )
    } else if leaving.len() * 2 >= kept_window.len() && kept_window.len() >= 3 {
        format!(
            "uncertain: {} of {} iterations after warm-up leave allocations behind, never freed, of differing sizes ({} to {}), \
             and the lowest allocated level moves by up to {} without a steady rise",
            leaving.len(),
            kept_window.len(),
            crate::units::format_bytes(leaving.iter().copied().min().unwrap_or(0)),
            crate::units::format_bytes(leaving.iter().copied().max().unwrap_or(0)),
            crate::units::format_bytes(spread(&levels.low))
        )
    } else {
        format!(
            "no steady growth: the lowest allocated level of each iteration moves by at most {} after warm-up (at iteration ends: {})",
            crate::units::format_bytes(spread(&levels.low)),
            crate::units::format_bytes(spread(&levels.at_end))
        )
    };
    LeakReport {
        iterations_from: from.to_owned(),
        iterations: n,
        warmup,
        device: device_name,
        allocated_at_end_bytes: levels.at_end,
        allocated_low_bytes: levels.low,
        kept_per_iteration_bytes: levels.kept,
        growth_per_iteration_bytes: growth,
        agreeing,
        compared,
        leaking,
        survivors,
        verdict,
    }
}

/// A growth that most compared iterations agree with.
#[derive(Clone, Copy, Debug)]
struct Agreement {
    median: i64,
    agreeing: usize,
    compared: usize,
}

fn median(v: &[i64]) -> i64 {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// Whether `g` is within 5 % (or 4 KiB) of `m`.
fn close_to(g: i64, m: i64) -> bool {
    (g - m).unsigned_abs() <= (m.unsigned_abs() / 20).max(4096)
}

/// Steps from one iteration's value to the next, after warm-up.
fn diffs(v: &[u64], warmup: usize) -> Vec<i64> {
    (warmup + 1..v.len()).map(|k| v[k] as i64 - v[k - 1] as i64).collect()
}

/// A steady rise of `v` after warm-up: a positive median step that more than half of the steps
/// agree with, at least two steps, and a net rise of at least half the median per step.
fn steady_growth(v: &[u64], warmup: usize) -> Option<Agreement> {
    let steps = diffs(v, warmup);
    let m = median(&steps);
    let agreeing = steps.iter().filter(|&&g| close_to(g, m)).count();
    let net = match (v.get(warmup), v.last()) {
        (Some(&first), Some(&last)) => last as i64 - first as i64,
        _ => 0,
    };
    let compared = steps.len();
    (m > 0 && compared >= 2 && agreeing * 2 > compared && net.saturating_mul(2) >= m.saturating_mul(compared as i64)).then_some(Agreement {
        median: m,
        agreeing,
        compared,
    })
}

/// The same bytes kept by (nearly) every iteration: at least two iterations, all but one of
/// them (and at least four in five) keeping the median's bytes, which is positive.
fn same_kept(kept: &[u64]) -> Option<Agreement> {
    let v: Vec<i64> = kept.iter().map(|&b| b as i64).collect();
    let m = median(&v);
    let agreeing = v.iter().filter(|&&b| b > 0 && close_to(b, m)).count();
    let compared = v.len();
    (m > 0 && compared >= 2 && agreeing + 1 >= compared && agreeing * 5 >= compared * 4).then_some(Agreement {
        median: m,
        agreeing,
        compared,
    })
}

/// Bytes kept by (nearly) every iteration in amounts that differ (a leak whose size follows the
/// data: each step keeps its variable-length logits): all but one of the iterations, and at
/// least four in five, keep some, and the lowest allocated level rises from the first compared
/// iteration to the last by at least half of what the iterations in between kept (a clean
/// loop's levels come back down; what a leak keeps stays).
fn varying_kept(kept: &[u64], low: &[u64], warmup: usize) -> Option<Agreement> {
    let compared = kept.len();
    let agreeing = kept.iter().filter(|&&b| b > 0).count();
    if compared < 2 || agreeing + 1 < compared || agreeing * 5 < compared * 4 {
        return None;
    }
    let held: u64 = kept.iter().skip(1).sum();
    let rise = low.last()?.saturating_sub(*low.get(warmup)?);
    let v: Vec<i64> = kept.iter().map(|&b| b as i64).collect();
    (held > 0 && rise.saturating_mul(2) >= held).then_some(Agreement { median: median(&v), agreeing, compared })
}

/// What one pass over a device's events tells of each iteration.
struct Levels {
    /// Allocated bytes at each span's end.
    at_end: Vec<u64>,
    /// The lowest allocated bytes within each span (its start included).
    low: Vec<u64>,
    /// Bytes born in each span and alive when the last span ends.
    kept: Vec<u64>,
    /// The allocations alive when the last span ends (the trace's end if it comes first):
    /// address → event index of their birth.
    live: FastMap<u64, usize>,
}

/// Allocated bytes on `device` at each span's end and lowest within it, and what each span
/// left alive when the last span ends.
fn levels(trace: &Trace, device: u8, spans: &[(u64, u64)]) -> Levels {
    let ev = &trace.events;
    let n = spans.len();
    let mut at_end = vec![0u64; n];
    let mut low = vec![u64::MAX; n];
    let mut allocated = ev.base_totals.get(device as usize).map_or(0, |t| t.allocated_bytes);
    let mut live: FastMap<u64, usize> = FastMap::default();
    // What is alive once the last iteration ends: what a program's teardown (a `main()`
    // returning, the interpreter exiting) frees after that is still kept by the loop.
    let mut kept_live: Option<FastMap<u64, usize>> = None;
    let mut cur = ev.cursor();
    let mut next_end = 0;
    for i in 0..ev.len() {
        let t = cur.advance();
        if ev.device[i] != device {
            continue;
        }
        let ts = ev.ts_ns[i];
        while next_end < n && spans[next_end].1 < ts {
            at_end[next_end] = allocated;
            next_end += 1;
            if next_end == n {
                kept_live = Some(live.clone());
            }
        }
        let inside = next_end < n && spans[next_end].0 <= ts;
        if inside {
            low[next_end] = low[next_end].min(allocated);
        }
        allocated = t.allocated_bytes;
        if inside {
            low[next_end] = low[next_end].min(allocated);
        }
        match ev.event_type(i) {
            EventType::Alloc => {
                live.insert(ev.address[i], i);
            }
            EventType::Free => {
                live.remove(&ev.address[i]);
            }
            _ => {}
        }
    }
    while next_end < n {
        at_end[next_end] = allocated;
        next_end += 1;
    }
    for (l, e) in low.iter_mut().zip(&at_end) {
        if *l == u64::MAX {
            *l = *e;
        }
    }
    let live = kept_live.unwrap_or(live);
    let mut kept = vec![0u64; n];
    for &i in live.values() {
        let k = spans.partition_point(|s| s.1 < ev.ts_ns[i]);
        if k < n && spans[k].0 <= ev.ts_ns[i] {
            kept[k] += ev.size_bytes[i];
        }
    }
    Levels { at_end, low, kept, live }
}

/// Who holds allocation `i` at `end` ([`super::holders::holder_at`]: a Python variable named at
/// a later mark counts); else the last to let go of it.
fn holder_at_end(trace: &Trace, i: usize, end: u64) -> Option<String> {
    let hs = trace.holders_of(i);
    let h = super::holders::holder_at(hs, end).or_else(|| hs.iter().max_by_key(|h| h.released_ns))?;
    Some(trace.describe_holder(h))
}

/// The survivors born after warm-up, grouped by (layer, innermost operator, innermost frame),
/// those that grew in most iterations first, at most `top`.
fn survivor_groups(trace: &Trace, spans: &[(u64, u64)], warmup: usize, live: &FastMap<u64, usize>, top: usize) -> Vec<LeakGroup> {
    let ev = &trace.events;
    let n = spans.len();
    // Survivors born after warm-up, by (layer, innermost operator, innermost frame).
    let iteration_of = |ts: u64| spans.partition_point(|s| s.1 < ts);
    let ops = super::flame::innermost_ops(trace);
    type Key = (String, Option<String>, Option<String>, Option<String>);
    let end = spans.last().map_or(0, |s| s.1);
    let mut groups: BTreeMap<Key, (u64, usize, std::collections::BTreeSet<usize>)> = BTreeMap::new();
    for &i in live.values() {
        let k = iteration_of(ev.ts_ns[i]);
        if k < warmup || k >= n {
            continue;
        }
        let layer = trace.str(ev.layer[i]).to_owned();
        let layer = if layer.is_empty() { "unattributed".to_owned() } else { layer };
        let frame = trace
            .stacks
            .stack_of_event(i)
            .and_then(|s| trace.stacks.stack(s).next())
            .map(|f| format!("{}:{} {}", trace.str(f.filename), f.line, trace.str(f.name)));
        let op = ops.get(i).and_then(|&o| trace.opt_str(o)).map(str::to_owned);
        let holder = holder_at_end(trace, i, end);
        let g = groups.entry((layer, op, frame, holder)).or_default();
        g.0 += ev.size_bytes[i];
        g.1 += 1;
        g.2.insert(k);
    }
    let mut survivors: Vec<LeakGroup> = groups
        .into_iter()
        .map(|((layer, op, frame, holder), (bytes, allocations, its))| LeakGroup {
            layer,
            op,
            frame,
            holder,
            bytes,
            allocations,
            iterations: its.len(),
            bytes_per_iteration: bytes as f64 / its.len().max(1) as f64,
        })
        .collect();
    // Groups that grew in most iterations first: a steady leak shows in every one.
    survivors.sort_by(|a, b| b.iterations.cmp(&a.iterations).then(b.bytes.cmp(&a.bytes)));
    survivors.truncate(top);
    survivors
}
