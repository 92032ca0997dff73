//! The Active Memory Timeline, memory_viz's main view: every allocation of a device as its own
//! band, stacked in the order the allocations were made, so that a band drops when one below
//! it is freed. Every allocation live at a column's moment is its own band; under them, only
//! what was allocated before the trace began (memory with no allocation event of its own) forms
//! a grey band, so the top of the stack is always the device's exact allocated total.
//!
//! Built per window and pixel column: each column shows the moment of its highest allocated
//! total (so the peak's column shows the peak exactly). An allocation made and freed between
//! two columns' moments is counted ([`ActiveTimeline::between`]) and gets its band in a
//! narrower window. The bands travel as packed columns ([`ActiveBands`]): hundreds of
//! thousands of them cross from the worker to the page on a zoom. [`Pairs`] (which event frees
//! each allocation) is computed once per device and kept by the caller.

use super::categories::{Categorized, Category};
use super::timeline_index::TimelineIndex;
use crate::hash::FastMap;
use crate::model::{EventType, StrId, Trace};
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

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
    /// The same as freeing events (`u32::MAX`: one is never freed): the allocations live at a
    /// window's first moment are found in the runs that end after it.
    block_last_free_event: Vec<u32>,
    /// Whether allocations are in time order (a trace's events are, unless merged oddly):
    /// then those made after a window are cut off by a binary search.
    time_ordered: bool,
}

/// A band's or an id's "none" (no layer, no operator, no stack).
pub const NONE: u32 = u32::MAX;
const NEVER: u32 = u32::MAX;
const SPAN_BLOCK: usize = 64;

impl Pairs {
    /// Pairs every allocation of `device` with the free of the same address that follows it.
    pub fn of(trace: &Trace, device: u8) -> Self {
        let ev = &trace.events;
        let mut spans: Vec<(u32, u32)> = Vec::new();
        let mut open: FastMap<u64, u32> = Default::default();
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
        let block_last_free_event = spans.chunks(SPAN_BLOCK).map(|c| c.iter().map(|s| s.1).max().unwrap_or(0)).collect();
        let time_ordered = alloc_ns.windows(2).all(|w| w[0] <= w[1]);
        Self { device, spans, alloc_ns, free_ns, block_last_free, block_last_free_event, time_ordered }
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

    /// The spans live just after event `at`: made at or before it, freed after it (or never),
    /// in span order; and the first span made after it. Runs of spans all freed by then are
    /// skipped whole.
    fn live_after(&self, at: u32) -> (Vec<u32>, usize) {
        // Spans are made in event order: those made by `at` are a prefix.
        let end = self.spans.partition_point(|s| s.0 <= at);
        let mut live = Vec::new();
        for (b, &last) in self.block_last_free_event.iter().enumerate() {
            let start = b * SPAN_BLOCK;
            if start >= end {
                break;
            }
            if last != NEVER && last <= at {
                continue;
            }
            live.extend((start..(start + SPAN_BLOCK).min(end)).filter(|&k| self.spans[k].1 > at).map(|k| k as u32));
        }
        (live, end)
    }
}

/// What to draw.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ActiveOptions {
    pub start_s: f64,
    pub end_s: f64,
    /// Pixel columns (at least 1, at most [`MAX_COLUMNS`]).
    pub columns: usize,
}

/// What the explorer knows of each allocation besides the trace: the innermost operator open
/// at each event, and what each allocation is for (sorted by event). Empty: unknown.
#[derive(Clone, Copy, Debug, Default)]
pub struct Labels<'a> {
    pub ops_at_event: &'a [StrId],
    pub categories: &'a [Categorized],
}

/// Every band of a window, one entry per band in each column (in allocation order, which is
/// also the order of their first columns); a band's place over the columns is its runs: a
/// band's bottom only moves when one below it is freed, so a run (a first column, a number of
/// columns, a bottom) is one quad to draw. Each column travels packed (little-endian bytes in
/// base64): a million bands cross from the worker to the page as a few strings, not millions
/// of JSON numbers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ActiveBands {
    /// The allocation's event (for its stack and details).
    #[serde(with = "packed")]
    pub event_index: Vec<u32>,
    #[serde(with = "packed")]
    pub size_bytes: Vec<u64>,
    #[serde(with = "packed")]
    pub alloc_s: Vec<f64>,
    /// Infinity: never freed in the trace.
    #[serde(with = "packed")]
    pub free_s: Vec<f64>,
    /// The layer and the innermost operator open when it was made: indices into `names`
    /// ([`NONE`]: none).
    #[serde(with = "packed")]
    pub layer: Vec<u32>,
    #[serde(with = "packed")]
    pub op: Vec<u32>,
    /// The stack recorded for the allocation (an id into the trace's stacks; [`NONE`]: none).
    #[serde(with = "packed")]
    pub stack: Vec<u32>,
    /// What it is for: an index into [`Category::ALL`] (255: unknown).
    #[serde(with = "packed")]
    pub category: Vec<u8>,
    /// The layers' and operators' names.
    pub names: Vec<String>,
    /// Band `b`'s runs are `run_start[b]..run_start[b + 1]` (one more entry than bands).
    #[serde(with = "packed")]
    pub run_start: Vec<u32>,
    /// Each run's first column, its number of columns and its bottom (bytes above zero).
    #[serde(with = "packed")]
    pub run_column: Vec<u32>,
    #[serde(with = "packed")]
    pub run_columns: Vec<u32>,
    #[serde(with = "packed")]
    pub run_bottom: Vec<u64>,
}

/// One band's allocation, as a tooltip shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct ActiveBand<'a> {
    pub event_index: u32,
    pub size_bytes: u64,
    pub alloc_s: f64,
    /// `None`: never freed in the trace.
    pub free_s: Option<f64>,
    pub layer: Option<&'a str>,
    pub op: Option<&'a str>,
    pub stack: Option<u32>,
    pub category: Option<Category>,
}

impl ActiveBands {
    pub fn len(&self) -> usize {
        self.event_index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.event_index.is_empty()
    }

    /// Whether every column has an entry per band and every band's runs are in bounds and in
    /// column order (an answer read from a server is checked before it is drawn).
    pub fn is_consistent(&self, columns: usize) -> bool {
        let n = self.len();
        let per_band = [self.size_bytes.len(), self.alloc_s.len(), self.free_s.len(), self.layer.len(), self.op.len()];
        let runs = self.run_column.len();
        let names_ok = |ids: &[u32]| ids.iter().all(|&i| i == NONE || (i as usize) < self.names.len());
        per_band.iter().chain([self.stack.len(), self.category.len()].iter()).all(|&l| l == n)
            && self.run_start.len() == n + 1
            && self.run_start.first() == Some(&0)
            && self.run_start.last().is_some_and(|&l| l as usize == runs)
            && self.run_start.windows(2).all(|w| w[0] < w[1])
            && self.run_columns.len() == runs
            && self.run_bottom.len() == runs
            && (0..runs).all(|r| self.run_columns[r] > 0 && self.run_column[r] as usize + self.run_columns[r] as usize <= columns)
            && (0..n).all(|b| self.runs(b).collect::<Vec<_>>().windows(2).all(|w| self.run_end(w[0]) == self.run_column[w[1]] as usize))
            && names_ok(&self.layer)
            && names_ok(&self.op)
    }

    /// Band `b`'s runs (indices into the run columns).
    pub fn runs(&self, b: usize) -> std::ops::Range<usize> {
        self.run_start[b] as usize..self.run_start[b + 1] as usize
    }

    /// The column after run `r`.
    pub fn run_end(&self, r: usize) -> usize {
        self.run_column[r] as usize + self.run_columns[r] as usize
    }

    /// The first column band `b` is drawn in, and the one after its last.
    pub fn columns_of(&self, b: usize) -> (usize, usize) {
        let runs = self.runs(b);
        (self.run_column[runs.start] as usize, self.run_end(runs.end - 1))
    }

    /// Band `b`'s bottom in `column`, where it is drawn there.
    pub fn bottom_at(&self, b: usize, column: usize) -> Option<u64> {
        let runs = self.runs(b);
        let cols = &self.run_column[runs.clone()];
        let k = cols.partition_point(|&c| c as usize <= column).checked_sub(1)?;
        let r = runs.start + k;
        (column < self.run_end(r)).then(|| self.run_bottom[r])
    }

    pub fn name(&self, id: u32) -> Option<&str> {
        self.names.get(id as usize).map(String::as_str)
    }

    pub fn category_of(&self, b: usize) -> Option<Category> {
        Category::ALL.get(self.category[b] as usize).copied()
    }

    /// Band `b`'s allocation.
    pub fn band(&self, b: usize) -> ActiveBand<'_> {
        ActiveBand {
            event_index: self.event_index[b],
            size_bytes: self.size_bytes[b],
            alloc_s: self.alloc_s[b],
            free_s: Some(self.free_s[b]).filter(|f| f.is_finite()),
            layer: self.name(self.layer[b]),
            op: self.name(self.op[b]),
            stack: Some(self.stack[b]).filter(|&s| s != NONE),
            category: self.category_of(b),
        }
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
    /// Each column's memory allocated before the trace began (no allocation event of its own
    /// in it): the grey band under every allocation's.
    pub before_trace: Vec<u64>,
    pub bands: ActiveBands,
    /// Allocations (made in the trace) live at some time of the window.
    pub live: usize,
    /// Of those, the ones live at no column's moment (made and freed between two): drawn once
    /// the window is narrower.
    pub between: usize,
}

/// The Active Memory Timeline of `pairs.device` over a window; with `index` (this trace's),
/// the columns' moments come from it instead of a walk over every event in the window.
pub fn active_timeline(
    trace: &Trace,
    pairs: &Pairs,
    index: Option<&TimelineIndex>,
    labels: &Labels<'_>,
    options: &ActiveOptions,
) -> ActiveTimeline {
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
    let stacked = stack_columns(trace, pairs, &moments);
    let bands = describe(trace, pairs, labels, &stacked, secs);
    // The allocations live in the window that no column shows (both lists in span order).
    let in_window = pairs.live_in(lo, hi);
    let mut drawn = stacked.spans.iter().peekable();
    let mut between = 0;
    for k in &in_window {
        while drawn.next_if(|&d| d < k).is_some() {}
        if drawn.next_if_eq(&k).is_none() {
            between += 1;
        }
    }
    ActiveTimeline {
        start_s: options.start_s,
        end_s: options.end_s,
        moments_s: moments.iter().map(|m| m.map(|(i, _)| secs(i))).collect(),
        moment_events: moments.iter().map(|m| m.map(|(i, _)| i)).collect(),
        totals: moments.iter().map(|m| m.map_or(0, |(_, t)| t)).collect(),
        before_trace: stacked.before_trace,
        bands,
        live: in_window.len(),
        between,
    }
}

/// Each band's allocation, its labels (names interned once) and its runs grouped by band.
fn describe(trace: &Trace, pairs: &Pairs, labels: &Labels<'_>, stacked: &Stacked, secs: impl Fn(u32) -> f64) -> ActiveBands {
    let ev = &trace.events;
    let n = stacked.spans.len();
    let mut out = ActiveBands { run_start: vec![0; n + 1], ..ActiveBands::default() };
    let mut ids: FastMap<StrId, u32> = Default::default();
    let mut name = |names: &mut Vec<String>, id: StrId| -> u32 {
        let Some(text) = trace.opt_str(id) else { return NONE };
        *ids.entry(id).or_insert_with(|| {
            names.push(text.to_owned());
            names.len() as u32 - 1
        })
    };
    for &k in &stacked.spans {
        let (a, f) = pairs.spans[k as usize];
        let i = a as usize;
        out.event_index.push(a);
        out.size_bytes.push(ev.size_bytes[i]);
        out.alloc_s.push(secs(a));
        out.free_s.push(if f == NEVER { f64::INFINITY } else { secs(f) });
        out.layer.push(name(&mut out.names, ev.layer[i]));
        let op = labels.ops_at_event.get(i).map_or(NONE, |&o| name(&mut out.names, o));
        out.op.push(op);
        out.stack.push(trace.stacks.stack_of_event(i).unwrap_or(NONE));
        let c = labels.categories.partition_point(|c| c.event < a);
        let category = labels.categories.get(c).filter(|c| c.event == a).map(|c| c.category);
        out.category.push(category.and_then(|c| Category::ALL.iter().position(|&x| x == c)).map_or(u8::MAX, |p| p as u8));
    }
    // Runs grouped by band, in the order each band's were closed (column order): a counting sort.
    for r in &stacked.runs {
        out.run_start[r.band as usize + 1] += 1;
    }
    for b in 0..n {
        out.run_start[b + 1] += out.run_start[b];
    }
    let total = stacked.runs.len();
    let (mut column, mut columns, mut bottom) = (vec![0u32; total], vec![0u32; total], vec![0u64; total]);
    let mut next: Vec<u32> = out.run_start[..n].to_vec();
    for r in &stacked.runs {
        let at = next[r.band as usize] as usize;
        next[r.band as usize] += 1;
        (column[at], columns[at], bottom[at]) = (r.column, r.columns, r.bottom);
    }
    (out.run_column, out.run_columns, out.run_bottom) = (column, columns, bottom);
    out
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

/// A band's columns `column..column + columns` at `bottom`.
#[derive(Clone, Copy, Debug)]
struct Run {
    band: u32,
    column: u32,
    columns: u32,
    bottom: u64,
}

/// The bands of a window: each band's span, the runs (in the order they ended), and each
/// column's memory from before the trace.
struct Stacked {
    spans: Vec<u32>,
    runs: Vec<Run>,
    before_trace: Vec<u64>,
}

/// The bands live in a column, bottom first, with each one's current run.
#[derive(Default)]
struct Stack {
    /// Band, its current run's bottom (`u64::MAX`: none yet) and first column.
    live: Vec<(u32, u64, u32)>,
    bytes: u64,
}

impl Stack {
    /// Ends band at position `p`'s current run before column `c`.
    fn close(&self, p: usize, c: usize, runs: &mut Vec<Run>) {
        let (band, bottom, since) = self.live[p];
        if bottom != u64::MAX && c > since as usize {
            runs.push(Run { band, column: since, columns: c as u32 - since, bottom });
        }
    }
}

/// Walks the columns' moments in order with the allocations live at each (every one made in
/// the trace: a band each, in allocation order): each band's bottom is the memory from before
/// the trace plus the bands below it. Only the bands above the lowest one freed (or all, when
/// the memory from before the trace changed) are looked at again in a column, and a band's
/// run ends only when its bottom moves: the work follows what is drawn, not columns × bands.
fn stack_columns(trace: &Trace, pairs: &Pairs, moments: &[Option<(u32, u64)>]) -> Stacked {
    let size = |k: u32| trace.events.size_bytes[pairs.spans[k as usize].0 as usize];
    let mut out = Stacked { spans: Vec::new(), runs: Vec::new(), before_trace: Vec::with_capacity(moments.len()) };
    let mut stack = Stack::default();
    // Frees to come, soonest on top: (freeing event, band).
    let mut frees: BinaryHeap<Reverse<(u32, u32)>> = BinaryHeap::new();
    let mut next_span = None;
    let mut last_base = None;
    let mut gone: Vec<u32> = Vec::new();
    for (c, m) in moments.iter().enumerate() {
        let Some((at, total)) = *m else {
            out.before_trace.push(0);
            continue;
        };
        gone.clear();
        while let Some(&Reverse((_, band))) = frees.peek().filter(|Reverse((f, _))| *f <= at) {
            frees.pop();
            gone.push(band);
        }
        let mut lowest = stack.live.len();
        if !gone.is_empty() {
            gone.sort_unstable();
            let p0 = stack.live.partition_point(|l| l.0 < gone[0]);
            lowest = p0;
            let mut g = 0;
            let mut kept = p0;
            for p in p0..stack.live.len() {
                if gone.get(g) == Some(&stack.live[p].0) {
                    g += 1;
                    stack.close(p, c, &mut out.runs);
                    stack.bytes -= size(out.spans[stack.live[p].0 as usize]);
                } else {
                    stack.live[kept] = stack.live[p];
                    kept += 1;
                }
            }
            stack.live.truncate(kept);
        }
        // The allocations made since the last moment and still live: new bands on top (at the
        // first moment, every one live then).
        let fresh = match next_span {
            None => pairs.live_after(at),
            Some(k) => {
                let end = k + pairs.spans[k..].partition_point(|s| s.0 <= at);
                ((k..end).filter(|&j| pairs.spans[j].1 > at).map(|j| j as u32).collect(), end)
            }
        };
        next_span = Some(fresh.1);
        lowest = lowest.min(stack.live.len());
        for k in fresh.0 {
            let band = out.spans.len() as u32;
            out.spans.push(k);
            stack.live.push((band, u64::MAX, c as u32));
            stack.bytes += size(k);
            let f = pairs.spans[k as usize].1;
            if f != NEVER {
                frees.push(Reverse((f, band)));
            }
        }
        let base = total.saturating_sub(stack.bytes);
        if last_base != Some(base) {
            lowest = 0;
        }
        last_base = Some(base);
        let mut bottom = match lowest.checked_sub(1) {
            Some(p) => stack.live[p].1 + size(out.spans[stack.live[p].0 as usize]),
            None => base,
        };
        for p in lowest..stack.live.len() {
            if stack.live[p].1 != bottom {
                stack.close(p, c, &mut out.runs);
                stack.live[p].1 = bottom;
                stack.live[p].2 = c as u32;
            }
            bottom += size(out.spans[stack.live[p].0 as usize]);
        }
        out.before_trace.push(base);
    }
    for p in 0..stack.live.len() {
        stack.close(p, moments.len(), &mut out.runs);
    }
    out
}

/// Finds the band under a point fast among hundreds of thousands: bands are in the order of
/// their first columns, so those that can hold a column are a prefix, and of that prefix only
/// runs of [`HOVER_BLOCK`] bands with one drawn as far as the column are looked into.
#[derive(Clone, Debug, Default)]
pub struct HoverIndex {
    first_columns: Vec<u32>,
    /// The column after the last drawn by any band of each block.
    block_end: Vec<u32>,
}

const HOVER_BLOCK: usize = 64;

impl HoverIndex {
    pub fn new(bands: &ActiveBands) -> Self {
        let spans: Vec<(usize, usize)> = (0..bands.len()).map(|b| bands.columns_of(b)).collect();
        let first_columns = spans.iter().map(|s| s.0 as u32).collect();
        let block_end = spans.chunks(HOVER_BLOCK).map(|c| c.iter().map(|s| s.1 as u32).max().unwrap_or(0)).collect();
        Self { first_columns, block_end }
    }

    /// The band drawn in `column` over `bytes` (bytes above zero), if any.
    pub fn band_at(&self, bands: &ActiveBands, column: usize, bytes: f64) -> Option<usize> {
        let end = self.first_columns.partition_point(|&c| c as usize <= column);
        for (k, &last) in self.block_end.iter().enumerate() {
            let start = k * HOVER_BLOCK;
            if start >= end {
                break;
            }
            if (last as usize) <= column {
                continue;
            }
            for b in start..(start + HOVER_BLOCK).min(end) {
                let Some(bottom) = bands.bottom_at(b, column) else { continue };
                if bytes >= bottom as f64 && bytes < (bottom + bands.size_bytes[b]) as f64 {
                    return Some(b);
                }
            }
        }
        None
    }
}

/// A column of numbers as the base64 of their little-endian bytes: a million of them parse
/// as one JSON string in milliseconds, where a million JSON numbers take a hundred or more.
mod packed {
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine as _;
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serializer};

    /// A number of fixed width, little-endian.
    pub trait Packed: Sized + Copy {
        const BYTES: usize;
        fn put(self, out: &mut Vec<u8>);
        fn get(bytes: &[u8]) -> Self;
    }

    macro_rules! packed {
        ($($t:ty),*) => {$(
            impl Packed for $t {
                const BYTES: usize = std::mem::size_of::<$t>();
                fn put(self, out: &mut Vec<u8>) {
                    out.extend_from_slice(&self.to_le_bytes());
                }
                fn get(bytes: &[u8]) -> Self {
                    let mut b = [0u8; std::mem::size_of::<$t>()];
                    b.copy_from_slice(bytes);
                    <$t>::from_le_bytes(b)
                }
            }
        )*};
    }
    packed!(u8, u32, u64, f64);

    pub fn serialize<T: Packed, S: Serializer>(values: &[T], s: S) -> Result<S::Ok, S::Error> {
        let mut bytes = Vec::with_capacity(values.len() * T::BYTES);
        for &v in values {
            v.put(&mut bytes);
        }
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, T: Packed, D: Deserializer<'de>>(d: D) -> Result<Vec<T>, D::Error> {
        let text = std::borrow::Cow::<str>::deserialize(d)?;
        let bytes = STANDARD.decode(text.as_bytes()).map_err(|e| D::Error::custom(format!("a packed column: {e}")))?;
        if bytes.len() % T::BYTES != 0 {
            return Err(D::Error::custom(format!("a packed column of {} bytes: expected {}-byte numbers", bytes.len(), T::BYTES)));
        }
        Ok(bytes.chunks_exact(T::BYTES).map(T::get).collect())
    }
}
