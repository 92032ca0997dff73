//! A multi-resolution index of the memory timeline: for every device, the min and max of its
//! allocated and the max of its reserved totals over blocks of [`BLOCK`] events and over every
//! power-of-two run of blocks above them, plus every device's totals at each block start.
//!
//! [`TimelineIndex::timeline`] answers what [`super::timeline`] answers, point for point, in
//! time proportional to the buckets (a bucket costs a gallop to its last event, its partial
//! blocks replayed and O(log n) nodes) instead of to the events in the window, so zooming out over
//! millions of events stays as fast as zooming in. It costs about 1.5 bytes per event for one
//! device.

use super::{peak_device, Buckets, TimelineOptions, TimelinePoint};
use crate::model::{EventStore, Totals, TotalsCursor, Trace};

/// Events per leaf block.
pub const BLOCK: usize = 64;

/// Min and max of one device's totals after its events in a run of blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Node {
    allocated_min: u64,
    allocated_max: u64,
    reserved_max: u64,
}

impl Node {
    /// No event of the device.
    const EMPTY: Node = Node { allocated_min: u64::MAX, allocated_max: 0, reserved_max: 0 };

    fn is_empty(self) -> bool {
        self.allocated_min == u64::MAX
    }

    fn add(&mut self, t: Totals) {
        self.allocated_min = self.allocated_min.min(t.allocated_bytes);
        self.allocated_max = self.allocated_max.max(t.allocated_bytes);
        self.reserved_max = self.reserved_max.max(t.reserved_bytes);
    }

    fn join(self, o: Node) -> Node {
        Node {
            allocated_min: self.allocated_min.min(o.allocated_min),
            allocated_max: self.allocated_max.max(o.allocated_max),
            reserved_max: self.reserved_max.max(o.reserved_max),
        }
    }
}

/// See the module documentation.
#[derive(Clone, Debug)]
pub struct TimelineIndex {
    devices: usize,
    events: usize,
    /// Every device's totals before each block's first event: `block * devices + device`.
    block_totals: Vec<Totals>,
    /// `levels[k][i * devices + d]`: device `d` over blocks `i << k .. (i + 1) << k`.
    levels: Vec<Vec<Node>>,
}

impl TimelineIndex {
    /// Builds the index in one pass over the events.
    pub fn new(trace: &Trace) -> Self {
        let ev = &trace.events;
        let devices = ev.base_totals.len().max(1);
        let blocks = ev.len().div_ceil(BLOCK);
        let mut block_totals = Vec::with_capacity(blocks * devices);
        let mut leaves = vec![Node::EMPTY; blocks * devices];
        let mut cursor = ev.cursor();
        for i in 0..ev.len() {
            if i % BLOCK == 0 {
                block_totals.extend_from_slice(cursor.all_devices());
            }
            let t = cursor.advance();
            leaves[i / BLOCK * devices + ev.device[i] as usize].add(t);
        }
        // And after the last event.
        block_totals.extend_from_slice(cursor.all_devices());
        let mut levels = vec![leaves];
        while levels.last().is_some_and(|l| l.len() > devices) {
            let below = levels.last().map(Vec::as_slice).unwrap_or_default();
            let n = below.len() / devices;
            let mut up = Vec::with_capacity(n.div_ceil(2) * devices);
            for i in (0..n).step_by(2) {
                for d in 0..devices {
                    let a = below[i * devices + d];
                    let b = if i + 1 < n { below[(i + 1) * devices + d] } else { Node::EMPTY };
                    up.push(a.join(b));
                }
            }
            levels.push(up);
        }
        TimelineIndex { devices, events: ev.len(), block_totals, levels }
    }

    /// Heap bytes the index holds.
    pub fn heap_bytes(&self) -> usize {
        self.block_totals.capacity() * std::mem::size_of::<Totals>()
            + self.levels.iter().map(|l| l.capacity() * std::mem::size_of::<Node>()).sum::<usize>()
    }

    /// Device `d` over blocks `from..to`, from the fewest nodes.
    fn blocks(&self, d: usize, mut from: usize, mut to: usize) -> Node {
        let mut acc = Node::EMPTY;
        let mut k = 0;
        while from < to {
            if from & 1 == 1 {
                acc = acc.join(self.levels[k][from * self.devices + d]);
                from += 1;
            }
            if to & 1 == 1 {
                to -= 1;
                acc = acc.join(self.levels[k][to * self.devices + d]);
            }
            from >>= 1;
            to >>= 1;
            k += 1;
        }
        acc
    }

    /// Replays events `from..to` (`from < len`) for device `d` on `walk`: its totals before
    /// `from`, the summary of its events, the first of them, and its totals after `to`. The
    /// walk goes on from where the last replay stopped when that is in `from`'s block at or
    /// before `from` (a bucket's right edge and the next one's left edge share a block), else
    /// starts at `from`'s block from its stored totals.
    fn replay<'a>(
        &self,
        walk: &mut Option<TotalsCursor<'a>>,
        ev: &'a EventStore,
        d: usize,
        from: usize,
        to: usize,
    ) -> (Totals, Node, Option<usize>, Totals) {
        let block = from / BLOCK;
        let start = block * BLOCK;
        let cursor = match walk {
            Some(c) if (start..=from).contains(&c.position()) => c,
            _ => walk.insert(ev.cursor_with(start, self.block_totals[block * self.devices..(block + 1) * self.devices].to_vec())),
        };
        while cursor.position() < from {
            cursor.advance();
        }
        let before = cursor.all_devices()[d];
        let mut node = Node::EMPTY;
        let mut first = None;
        for i in from..to {
            let t = cursor.advance();
            if ev.device[i] as usize == d {
                node.add(t);
                first.get_or_insert(i);
            }
        }
        (before, node, first, cursor.all_devices()[d])
    }

    /// The first event of device `d` at or after `from` and before `to`.
    fn first_event(&self, ev: &EventStore, d: usize, from: usize, to: usize) -> Option<usize> {
        let mut i = from;
        while i < to {
            let block = i / BLOCK;
            let block_end = ((block + 1) * BLOCK).min(to);
            if i.is_multiple_of(BLOCK) && block_end == (block + 1) * BLOCK && self.levels[0][block * self.devices + d].is_empty() {
                i = block_end;
                continue;
            }
            if let Some(j) = (i..block_end).find(|&j| ev.device[j] as usize == d) {
                return Some(j);
            }
            i = block_end;
        }
        None
    }

    /// Device `d`'s totals before event `i` (after every event for `i` = the event count).
    fn totals_before<'a>(&self, walk: &mut Option<TotalsCursor<'a>>, ev: &'a EventStore, d: usize, i: usize) -> Totals {
        if i >= self.events {
            return self.block_totals[self.block_totals.len() - self.devices + d];
        }
        if i.is_multiple_of(BLOCK) {
            return self.block_totals[i / BLOCK * self.devices + d];
        }
        self.replay(walk, ev, d, i, i).0
    }

    /// The first of device `d`'s events in `from..to` with the highest allocated total after
    /// it, and that total, replayed event by event.
    fn first_max_replayed<'a>(
        &self,
        walk: &mut Option<TotalsCursor<'a>>,
        ev: &'a EventStore,
        d: usize,
        from: usize,
        to: usize,
    ) -> Option<(u32, u64)> {
        if from >= to {
            return None;
        }
        self.replay(walk, ev, d, from, from);
        let cursor = walk.as_mut()?;
        let mut best: Option<(u32, u64)> = None;
        for i in from..to {
            let t = cursor.advance();
            if ev.device[i] as usize == d && best.is_none_or(|(_, b)| t.allocated_bytes > b) {
                best = Some((i as u32, t.allocated_bytes));
            }
        }
        best
    }

    /// The first of device `d`'s events in `from..to` with the highest allocated total after
    /// it, and that total: whole blocks from their leaves, the one holding the maximum and the
    /// partial blocks at the ends replayed.
    fn first_max<'a>(
        &self,
        walk: &mut Option<TotalsCursor<'a>>,
        ev: &'a EventStore,
        d: usize,
        from: usize,
        to: usize,
    ) -> Option<(u32, u64)> {
        let (from_block, to_block) = (from.div_ceil(BLOCK), to / BLOCK);
        if from_block >= to_block {
            return self.first_max_replayed(walk, ev, d, from, to);
        }
        let left = self.first_max_replayed(walk, ev, d, from, from_block * BLOCK);
        // The first whole block holding the highest total, and that total.
        let mut middle: Option<(usize, u64)> = None;
        for b in from_block..to_block {
            let node = self.levels[0][b * self.devices + d];
            if !node.is_empty() && middle.is_none_or(|(_, m)| node.allocated_max > m) {
                middle = Some((b, node.allocated_max));
            }
        }
        let mut best = left;
        if let Some((b, m)) = middle.filter(|&(_, m)| best.is_none_or(|(_, l)| m > l)) {
            let found = self.first_max_replayed(walk, ev, d, b * BLOCK, (b + 1) * BLOCK);
            debug_assert_eq!(found.map(|f| f.1), Some(m));
            best = found;
        }
        let right = self.first_max_replayed(walk, ev, d, to_block * BLOCK, to);
        if let Some(r) = right.filter(|&(_, r)| best.is_none_or(|(_, b)| r > b)) {
            best = Some(r);
        }
        best
    }

    /// The last of device `d`'s events before event `to`, and the allocated total after it.
    fn last_before<'a>(&self, walk: &mut Option<TotalsCursor<'a>>, ev: &'a EventStore, d: usize, to: usize) -> Option<(u32, u64)> {
        let mut i = to;
        while i > 0 {
            let block = (i - 1) / BLOCK;
            let start = block * BLOCK;
            if i == (block + 1) * BLOCK && self.levels[0][block * self.devices + d].is_empty() {
                i = start;
                continue;
            }
            if let Some(j) = (start..i).rev().find(|&j| ev.device[j] as usize == d) {
                let (_, _, _, after) = self.replay(walk, ev, d, j, j + 1);
                return Some((j as u32, after.allocated_bytes));
            }
            i = start;
        }
        None
    }

    /// For each of `columns` equal columns of `[lo, hi)` (nanoseconds), the first event of
    /// `device` with the highest allocated total after it, and that total; a column without
    /// its events shows the state after the last one before it. What a walk over every event
    /// in the window gives (`active::column_moments`), in time proportional to the columns
    /// and the window's blocks. `None` if the index is not this trace's or has no `device`.
    pub fn column_moments(&self, trace: &Trace, device: u8, (lo, hi): (u64, u64), columns: usize) -> Option<Vec<Option<(u32, u64)>>> {
        let ev = &trace.events;
        let d = device as usize;
        if ev.len() != self.events || d >= self.devices || columns == 0 {
            return None;
        }
        let width = (hi.saturating_sub(lo)).max(1) as f64 / columns as f64;
        let column = |ts: u64| (((ts - lo) as f64 / width) as usize).min(columns - 1);
        let first = ev.ts_ns.partition_point(|&t| t < lo);
        let end = ev.ts_ns.partition_point(|&t| t < hi);
        let mut walk = None;
        let mut last = self.last_before(&mut walk, ev, d, first);
        let mut out = Vec::with_capacity(columns);
        let mut a = first;
        while a < end {
            let c = column(ev.ts_ns[a]);
            while out.len() < c {
                out.push(last);
            }
            // The column's events: a gallop from `a`, then a binary search in the last step.
            let rest = &ev.ts_ns[a..end];
            let within = |t: &u64| column(*t) <= c;
            let (mut known, mut step) = (0, 1);
            while known + step < rest.len() && within(&rest[known + step]) {
                known += step;
                step *= 2;
            }
            let b = a + known + rest[known..(known + step).min(rest.len())].partition_point(within);
            last = self.first_max(&mut walk, ev, d, a, b).or(last);
            out.push(last);
            a = b;
        }
        while out.len() < columns {
            out.push(last);
        }
        Some(out)
    }

    /// What [`super::timeline`] gives for `options`, computed from the index (built from this
    /// `trace`).
    pub fn timeline(&self, trace: &Trace, options: &TimelineOptions) -> Vec<TimelinePoint> {
        let ev = &trace.events;
        let Some(buckets) = Buckets::new(trace, options).filter(|_| ev.len() == self.events) else {
            return Vec::new();
        };
        let device = options.device.unwrap_or_else(|| peak_device(trace)) as usize;
        if device >= self.devices {
            return Vec::new();
        }
        let lo_all = ev.ts_ns.partition_point(|&t| t < buckets.w0);
        let hi_all = ev.ts_ns.partition_point(|&t| t <= buckets.w1);
        let mut out = Vec::new();
        let mut walk = None;
        let mut lo = lo_all;
        while lo < hi_all {
            let b = buckets.of(ev.ts_ns[lo]);
            // The bucket's events: a gallop from `lo`, then a binary search in the last step
            // (a search over the whole rest of the window missed the cache at every probe).
            let rest = &ev.ts_ns[lo..hi_all];
            let within = |t: &u64| buckets.of(*t) <= b;
            let (mut known, mut step) = (0, 1);
            while known + step < rest.len() && within(&rest[known + step]) {
                known += step;
                step *= 2;
            }
            let end = (known + step).min(rest.len());
            let hi = lo + known + rest[known..end].partition_point(within);
            if let Some(first) = self.first_event(ev, device, lo, hi) {
                let (from_block, to_block) = (first.div_ceil(BLOCK), hi / BLOCK);
                let (before, node, last) = if from_block >= to_block {
                    // Within a block or two: replayed.
                    let (before, node, _, last) = self.replay(&mut walk, ev, device, first, hi);
                    (before, node, last)
                } else {
                    // Partial blocks at the ends replayed, whole blocks from the index.
                    let (before, mut node, _, _) = self.replay(&mut walk, ev, device, first, from_block * BLOCK);
                    node = node.join(self.blocks(device, from_block, to_block));
                    let last = if to_block * BLOCK < hi {
                        let (_, right, _, last) = self.replay(&mut walk, ev, device, to_block * BLOCK, hi);
                        node = node.join(right);
                        last
                    } else {
                        self.totals_before(&mut walk, ev, device, hi)
                    };
                    (before, node, last)
                };
                out.push(TimelinePoint {
                    t_s: buckets.start_s(b),
                    allocated_min_bytes: node.allocated_min.min(before.allocated_bytes),
                    allocated_max_bytes: node.allocated_max.max(before.allocated_bytes),
                    reserved_max_bytes: node.reserved_max.max(before.reserved_bytes),
                    allocated_last_bytes: last.allocated_bytes,
                    reserved_last_bytes: last.reserved_bytes,
                    first_event: first,
                });
            }
            lo = hi;
        }
        out
    }
}
