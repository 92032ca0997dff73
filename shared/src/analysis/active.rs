//! The Active Memory Timeline, memory_viz's main view: every allocation of a device as its own
//! band, stacked in the order the allocations were made, so that a band drops when one below
//! it is freed. The largest allocations (`detail` of them) are drawn one by one; the rest, and
//! what was allocated before the trace began, form one summary band at the bottom, so the top
//! of the stack is always the device's exact allocated total.
//!
//! Built per window and pixel column: each column shows the moment of its highest allocated
//! total (so the peak's column shows the peak exactly). [`Pairs`] (which event frees each
//! allocation) is computed once per device and kept by the caller.

use super::timeline_index::TimelineIndex;
use crate::model::{EventType, Trace};
use serde::{Deserialize, Serialize};

/// The most pixel columns a window is drawn in.
pub const MAX_COLUMNS: usize = 20_000;

/// Each allocation of one device with the event that frees it, in allocation order.
#[derive(Clone, Debug, Default)]
pub struct Pairs {
    pub device: u8,
    /// (allocation event, freeing event or `u32::MAX`: never freed in the trace).
    pub spans: Vec<(u32, u32)>,
    /// When each span's allocation and free happen (`u64::MAX`: never freed), in span order:
    /// a window's live allocations are found by reading these in sequence, not the events.
    alloc_ns: Vec<u64>,
    free_ns: Vec<u64>,
    /// The latest free of each run of [`SPAN_BLOCK`] spans: a run that ended before a window
    /// is skipped whole (most allocations of a training step live for a moment).
    block_last_free: Vec<u64>,
    /// The largest allocation of each run of [`SPAN_BLOCK`] spans: once a window's largest
    /// live allocations are found, a run with none larger holds no more of them.
    block_max_size: Vec<u64>,
    /// Whether allocations are in time order (a trace's events are, unless merged oddly):
    /// then those made after a window are cut off by a binary search.
    time_ordered: bool,
}

const NEVER: u32 = u32::MAX;
const SPAN_BLOCK: usize = 64;

impl Pairs {
    /// Pairs every allocation of `device` with the free of the same address that follows it.
    pub fn of(trace: &Trace, device: u8) -> Self {
        let ev = &trace.events;
        let mut spans: Vec<(u32, u32)> = Vec::new();
        let mut open: crate::hash::FastMap<u64, u32> = Default::default();
        for i in 0..ev.len().min(NEVER as usize - 1) {
            if ev.device[i] != device {
                continue;
            }
            match ev.event_type(i) {
                EventType::Alloc => {
                    open.insert(ev.address[i], spans.len() as u32);
                    spans.push((i as u32, NEVER));
                }
                EventType::Free => {
                    if let Some(k) = open.remove(&ev.address[i]) {
                        spans[k as usize].1 = i as u32;
                    }
                }
                _ => {}
            }
        }
        let alloc_ns: Vec<u64> = spans.iter().map(|&(a, _)| ev.ts_ns[a as usize]).collect();
        let free_ns: Vec<u64> = spans.iter().map(|&(_, f)| if f == NEVER { u64::MAX } else { ev.ts_ns[f as usize] }).collect();
        let block_last_free = free_ns.chunks(SPAN_BLOCK).map(|c| c.iter().copied().max().unwrap_or(0)).collect();
        let block_max_size =
            spans.chunks(SPAN_BLOCK).map(|c| c.iter().map(|&(a, _)| ev.size_bytes[a as usize]).max().unwrap_or(0)).collect();
        let time_ordered = alloc_ns.windows(2).all(|w| w[0] <= w[1]);
        Self { device, spans, alloc_ns, free_ns, block_last_free, block_max_size, time_ordered }
    }

    /// Of the allocations live at some time of `[lo, hi)` (as [`Pairs::live_in`] finds them),
    /// the `detail` largest, ties going to the earlier made, in span order; and how many are
    /// live. Allocations are counted in sequence, but sizes are read, and candidates kept,
    /// only in runs that hold one larger than the smallest kept: zoomed out over millions of
    /// allocations, a few thousand are looked at, not all of them sorted.
    pub fn largest_live(&self, trace: &Trace, lo: u64, hi: u64, detail: usize) -> (Vec<u32>, usize) {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        let detail = detail.min(self.spans.len());
        let size = |k: usize| trace.events.size_bytes[self.spans[k].0 as usize];
        let end = if self.time_ordered { self.alloc_ns.partition_point(|&t| t < hi) } else { self.alloc_ns.len() };
        // The kept, smallest (and among equals the latest made) on top.
        let mut kept: BinaryHeap<Reverse<(u64, Reverse<u32>)>> = BinaryHeap::with_capacity(detail + 1);
        let mut live = 0usize;
        for (b, &last) in self.block_last_free.iter().enumerate() {
            let start = b * SPAN_BLOCK;
            if start >= end {
                break;
            }
            if last < lo {
                continue;
            }
            let ks = start..(start + SPAN_BLOCK).min(end);
            // Later allocations win no tie, so a run's equal sizes cannot displace one kept.
            let full_above = kept.len() == detail && kept.peek().is_none_or(|Reverse((s, _))| self.block_max_size[b] <= *s);
            if full_above {
                live += ks.filter(|&k| self.free_ns[k] >= lo && self.alloc_ns[k] < hi).count();
                continue;
            }
            for k in ks {
                if self.free_ns[k] < lo || self.alloc_ns[k] >= hi {
                    continue;
                }
                live += 1;
                let candidate = Reverse((size(k), Reverse(k as u32)));
                if kept.len() < detail {
                    kept.push(candidate);
                } else if kept.peek().is_some_and(|smallest| candidate < *smallest) {
                    kept.pop();
                    kept.push(candidate);
                }
            }
        }
        let mut largest: Vec<u32> = kept.into_iter().map(|Reverse((_, Reverse(k)))| k).collect();
        largest.sort_unstable();
        (largest, live)
    }

    /// The spans (indices into [`Pairs::spans`]) of the allocations live at some time of
    /// `[lo, hi)`: made before `hi`, freed at or after `lo` (or never), in span order.
    pub fn live_in(&self, lo: u64, hi: u64) -> Vec<u32> {
        let end = if self.time_ordered { self.alloc_ns.partition_point(|&t| t < hi) } else { self.alloc_ns.len() };
        let mut live = Vec::new();
        for (b, &last) in self.block_last_free.iter().enumerate() {
            let start = b * SPAN_BLOCK;
            if start >= end {
                break;
            }
            if last < lo {
                continue;
            }
            for k in start..(start + SPAN_BLOCK).min(end) {
                if self.free_ns[k] >= lo && self.alloc_ns[k] < hi {
                    live.push(k as u32);
                }
            }
        }
        live
    }
}

/// What to draw.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ActiveOptions {
    pub start_s: f64,
    pub end_s: f64,
    /// Pixel columns (at least 1, at most [`MAX_COLUMNS`]).
    pub columns: usize,
    /// How many of the largest allocations live in the window get a band of their own.
    pub detail: usize,
}

/// One allocation drawn as its own band.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ActiveBand {
    /// The allocation's event (for its stack and details).
    pub event_index: u32,
    pub size_bytes: u64,
    pub alloc_s: f64,
    /// `None`: never freed in the trace.
    pub free_s: Option<f64>,
    pub layer: Option<String>,
    /// The innermost operator open when it was made (filled by the explorer, which knows).
    pub op: Option<String>,
    /// The stack recorded for the allocation (an id into the trace's stacks), if any.
    pub stack: Option<u32>,
    /// What the allocation is for (filled by the explorer, which categorised the trace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<super::categories::Category>,
    /// The first column the band is live in.
    pub first_column: u32,
    /// Its bottom, bytes above zero, in each column from `first_column` on. Written as runs
    /// (`[bottom, columns, bottom, columns, ...]`): a band's bottom only moves when one below
    /// it is freed, and the answer crosses from the worker to the page on every zoom.
    #[serde(with = "runs")]
    pub bottoms: Vec<u64>,
}

/// A column list as `[value, count, ...]` runs.
mod runs {
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(values: &[u64], s: S) -> Result<S::Ok, S::Error> {
        let mut flat = Vec::new();
        let mut rest = values;
        while let Some(&v) = rest.first() {
            let n = rest.iter().take_while(|&&x| x == v).count();
            flat.extend([v, n as u64]);
            rest = &rest[n..];
        }
        flat.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u64>, D::Error> {
        let flat = Vec::<u64>::deserialize(d)?;
        if flat.len() % 2 != 0 {
            return Err(D::Error::custom(format!("{} numbers: expected [bottom, columns] pairs", flat.len())));
        }
        let total = flat.chunks(2).try_fold(0u64, |t, p| t.checked_add(p[1])).unwrap_or(u64::MAX);
        if total > super::MAX_COLUMNS as u64 {
            return Err(D::Error::custom(format!("runs of {total} columns: expected at most {}", super::MAX_COLUMNS)));
        }
        let mut values = Vec::with_capacity(total as usize);
        for p in flat.chunks(2) {
            values.extend(std::iter::repeat_n(p[0], p[1] as usize));
        }
        Ok(values)
    }
}

/// The Active Memory Timeline of one window.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ActiveTimeline {
    pub start_s: f64,
    pub end_s: f64,
    /// Each column's moment (seconds since trace start; `None`: no event yet).
    pub moments_s: Vec<Option<f64>>,
    /// Each column's moment as the event index it shows the state after.
    pub moment_events: Vec<Option<u32>>,
    /// Each column's allocated total: the top of its stack.
    pub totals: Vec<u64>,
    /// Each column's summary band: allocations not drawn one by one, and memory allocated
    /// before the trace began.
    pub summary: Vec<u64>,
    pub bands: Vec<ActiveBand>,
    /// Allocations (made in the trace) live at some time of the window.
    pub live: usize,
    /// Those not drawn one by one: in the summary band.
    pub summarized: usize,
}

/// The Active Memory Timeline of `pairs.device` over a window; with `index` (this trace's),
/// the columns' moments come from it instead of a walk over every event in the window.
pub fn active_timeline(trace: &Trace, pairs: &Pairs, index: Option<&TimelineIndex>, options: &ActiveOptions) -> ActiveTimeline {
    let columns = options.columns.clamp(1, MAX_COLUMNS);
    let start_ns = trace.start_ns();
    let to_ns = |s: f64| start_ns.saturating_add((s.max(0.0) * 1e9) as u64);
    // Any window a request can name (NaN, negative, past the end, 1e300 s) is a valid range.
    let lo = to_ns(options.start_s);
    let hi = to_ns(options.end_s.max(options.start_s)).max(lo.saturating_add(1));
    let moments = index
        .and_then(|x| x.column_moments(trace, pairs.device, (lo, hi), columns))
        .unwrap_or_else(|| column_moments(trace, pairs.device, (lo, hi), columns));
    let secs = |i: u32| trace.events.ts_ns[i as usize].saturating_sub(start_ns) as f64 * 1e-9;
    // The allocations live in the window: made before its end, freed after its start.
    let ev = &trace.events;
    let (live, in_window) = pairs.largest_live(trace, lo, hi, options.detail);
    let summarized = in_window - live.len();
    let mut bands: Vec<ActiveBand> = live
        .iter()
        .map(|&k| {
            let (a, f) = pairs.spans[k as usize];
            ActiveBand {
                event_index: a,
                size_bytes: ev.size_bytes[a as usize],
                alloc_s: secs(a),
                free_s: (f != NEVER).then(|| secs(f)),
                layer: trace.opt_str(ev.layer[a as usize]).map(str::to_owned),
                op: None,
                stack: trace.stacks.stack_of_event(a as usize),
                category: None,
                first_column: 0,
                bottoms: Vec::new(),
            }
        })
        .collect();
    let (summary, totals) = stack_columns(pairs, &live, &moments, &mut bands);
    bands.retain(|b| !b.bottoms.is_empty());
    let moments_s = moments.iter().map(|m| m.map(|(i, _)| secs(i))).collect();
    let moment_events = moments.iter().map(|m| m.map(|(i, _)| i)).collect();
    ActiveTimeline {
        start_s: options.start_s,
        end_s: options.end_s,
        moments_s,
        moment_events,
        totals,
        summary,
        bands,
        live: in_window,
        summarized,
    }
}

/// For each column, the event of `device` with the highest allocated total after it (the
/// first such), and that total; a column without events shows the state after the last
/// event before it.
pub fn column_moments(trace: &Trace, device: u8, (lo, hi): (u64, u64), columns: usize) -> Vec<Option<(u32, u64)>> {
    let ev = &trace.events;
    let first = ev.ts_ns.partition_point(|&t| t < lo);
    // The state just before the window: after the device's last event before it (however far
    // back: another device's events may follow it).
    let mut last: Option<(u32, u64)> = None;
    if let Some(j) = (0..first).rev().find(|&j| ev.device[j] == device) {
        let mut cursor = ev.cursor_near(j);
        while cursor.position() < j {
            cursor.advance();
        }
        last = Some((j as u32, cursor.advance().allocated_bytes));
    }
    let mut cursor = ev.cursor_near(first);
    while cursor.position() < first {
        cursor.advance();
    }
    let width = (hi.saturating_sub(lo)).max(1) as f64 / columns as f64;
    let mut out: Vec<Option<(u32, u64)>> = Vec::with_capacity(columns);
    let mut best: Option<(u32, u64)> = None;
    let mut column = 0usize;
    while cursor.position() < ev.len() {
        let i = cursor.position();
        let ts = ev.ts_ns[i];
        if ts >= hi {
            break;
        }
        let c = (((ts - lo) as f64 / width) as usize).min(columns - 1);
        while column < c {
            out.push(best.or(last));
            last = best.or(last);
            best = None;
            column += 1;
        }
        let t = cursor.advance();
        if ev.device[i] == device && best.is_none_or(|(_, b)| t.allocated_bytes > b) {
            best = Some((i as u32, t.allocated_bytes));
        }
    }
    while out.len() < columns {
        out.push(best.or(last));
        last = best.or(last);
        best = None;
    }
    out
}

/// Walks the columns' moments in order with the live drawn bands in allocation order: each
/// band's bottom is the summary plus the bands below it. Returns (summary, total) per column.
fn stack_columns(pairs: &Pairs, drawn: &[u32], moments: &[Option<(u32, u64)>], bands: &mut [ActiveBand]) -> (Vec<u64>, Vec<u64>) {
    let mut summary = Vec::with_capacity(moments.len());
    let mut totals = Vec::with_capacity(moments.len());
    // Band indices live at the current moment, in allocation order (= index order).
    let mut live: Vec<usize> = Vec::new();
    let mut next = 0;
    for (c, m) in moments.iter().enumerate() {
        let Some((at, total)) = *m else {
            summary.push(0);
            totals.push(0);
            continue;
        };
        while next < drawn.len() && pairs.spans[drawn[next] as usize].0 <= at {
            live.push(next);
            next += 1;
        }
        live.retain(|&b| {
            let f = pairs.spans[drawn[b] as usize].1;
            f == NEVER || f > at
        });
        let drawn_bytes: u64 = live.iter().map(|&b| bands[b].size_bytes).sum();
        let base = total.saturating_sub(drawn_bytes);
        let mut bottom = base;
        for &b in &live {
            let band = &mut bands[b];
            if band.bottoms.is_empty() {
                band.first_column = c as u32;
            }
            band.bottoms.push(bottom);
            bottom += band.size_bytes;
        }
        summary.push(base);
        totals.push(total);
    }
    (summary, totals)
}
