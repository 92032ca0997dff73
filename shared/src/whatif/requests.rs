//! The requests a trace's program made of PyTorch's CUDA caching allocator, per device, in
//! order: what the simulator replays under another configuration.

use super::conf::{AllocConf, TorchRelease, DIVISION_INTERVALS};
use crate::allocator::{AllocatorConfig, MIN_BLOCK_BYTES, SMALL_REQUEST_BYTES, SMALL_SEGMENT_BYTES};
use crate::model::{per_event, BlockState, EventType, PoolId, SegmentInfo, Totals, Trace};

/// What the program asked of the allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `malloc`: a block for `size_bytes` on `stream`, in a private pool (index into
    /// [`DeviceRequests::pools`]) or the default one. `key` names the block until it is freed
    /// (the trace's address) and is where the run's own allocator put it.
    Alloc { key: u64, size_bytes: u64, stream: u16, pool: Option<u16> },
    /// `free` of the block `key` (`size_bytes` as the trace recorded it). `completed`: the block
    /// is reusable at once; otherwise it waits for a [`Op::FreeCompleted`] (a free held back
    /// by `record_stream` uses on other streams).
    Free { key: u64, size_bytes: u64, completed: bool },
    /// A held-back free finished: the block `key` becomes reusable.
    FreeCompleted { key: u64 },
    /// `torch.cuda.empty_cache()`: every cached segment with no block in use goes back.
    /// `inferred` (always, today): the trace has no record of the call, only of its effect.
    /// `released_pools` indexes [`DeviceRequests::pool_sets`]: private pools the trace showed
    /// releasing segments then (their graphs or `MemPool`s were gone), or `u32::MAX`.
    /// `in_malloc`: the release happened inside the next allocation (its segment frees carry
    /// that allocation's stack): garbage collection or the out-of-memory retry, which a
    /// simulation with a capacity makes for itself, so it skips these.
    EmptyCache { inferred: bool, released_pools: u32, in_malloc: bool },
    /// A `malloc` that ran out of memory in the recorded run (`size_bytes` already rounded).
    FailedAlloc { size_bytes: u64, stream: u16, pool: Option<u16> },
}

/// One request and the trace event it stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// The trace event after which the recorded totals show this request's effect (for an
    /// inferred `empty_cache`, the last of its segment frees, or the event it preceded).
    pub event: u32,
    pub ts_ns: u64,
    pub op: Op,
}

/// The requests of one device and the allocator state they start from.
#[derive(Clone, Debug, Default)]
pub struct DeviceRequests {
    /// Index into the trace's devices.
    pub device: u8,
    /// The device as the trace names it (`cuda:0`).
    pub name: String,
    pub requests: Vec<Request>,
    /// Segments that existed before the first request (a snapshot taken mid-run), this
    /// device's only.
    pub initial_segments: Vec<SegmentInfo>,
    /// The initial segments are mapped ranges of expandable segments.
    pub initial_expandable: bool,
    /// Page size of the initial expandable segments of the large pool (the run's own
    /// `large_segment_size`).
    pub initial_large_page_bytes: u64,
    /// Bytes allocated at the start in blocks no initial segment holds (their frees are
    /// recognised by size).
    pub loose_allocated_bytes: u64,
    /// Bytes reserved at the start that no known segment explains: counted in every reserved
    /// total, never released.
    pub opaque_reserved_bytes: u64,
    /// The trace's private pools (`Trace::pools`); requests index it.
    pub pools: Vec<PoolId>,
    /// Sets of private pools, for [`Op::EmptyCache`].
    pub pool_sets: Vec<Vec<u16>>,
    /// `empty_cache` calls inferred from the trace.
    pub inferred_empty_caches: u64,
}

/// A trace's requests, every CUDA device's, and the configuration the run used.
#[derive(Clone, Debug, Default)]
pub struct Requests {
    pub devices: Vec<DeviceRequests>,
    /// The run's own allocator configuration, from the trace's settings (default if it has
    /// none): the base a what-if overrides.
    pub own_conf: AllocConf,
    /// Everything the trace says of its settings (`own_conf` is its configuration): whether
    /// it recorded them, the memory fractions the program set.
    pub own: super::OwnSettings,
    /// The PyTorch release that recorded the trace, when it says.
    pub release: Option<TorchRelease>,
    /// What could not be taken as recorded.
    pub notes: Vec<String>,
}

/// Per-device state of the walk over the trace's events.
struct DeviceWalk {
    out: DeviceRequests,
    /// Whether the trace records this device's segments (snapshots) or only its totals.
    has_segment_events: bool,
    /// Whether frees finish in `free_completed` events (snapshots) rather than at once.
    has_completions: bool,
    before: Totals,
    /// The `EmptyCache` a run of segment frees is building, the pools it released, and the
    /// stack all its segment frees share (`None` if any has none or they differ).
    open_release: Option<usize>,
    release_pools: Vec<u16>,
    release_stack: Option<u32>,
    /// The address of a segment the previous event of this device allocated.
    new_segment_at: Option<u64>,
    unexplained_growth: u64,
    /// The run collected garbage (`garbage_collection_threshold` under a memory fraction): a
    /// release seen at an allocation happened inside it, so that a replay with a capacity
    /// collects for itself rather than empty the whole cache there.
    collects_in_malloc: bool,
}

impl DeviceWalk {
    fn push(&mut self, event: usize, ts_ns: u64, op: Op) {
        self.out.requests.push(Request { event: event as u32, ts_ns, op });
    }

    /// Ends the run of segment frees at an event with `next_stack` (the device's next event
    /// that is not one), which is an allocation when `by_alloc`.
    fn close_release(&mut self, by_alloc: bool, next_stack: Option<u32>) {
        let Some(k) = self.open_release.take() else { return };
        let stack = self.release_stack.take();
        if by_alloc && stack.is_some() && stack == next_stack {
            if let Op::EmptyCache { in_malloc, .. } = &mut self.out.requests[k].op {
                *in_malloc = true;
            }
        }
        if self.release_pools.is_empty() {
            return;
        }
        let mut pools = std::mem::take(&mut self.release_pools);
        pools.sort_unstable();
        pools.dedup();
        let set = self.out.pool_sets.len() as u32;
        self.out.pool_sets.push(pools);
        if let Op::EmptyCache { released_pools, .. } = &mut self.out.requests[k].op {
            *released_pools = set;
        }
    }

    fn infer_empty_cache(&mut self, event: usize, ts_ns: u64, in_malloc: bool) {
        self.out.inferred_empty_caches += 1;
        self.push(event, ts_ns, Op::EmptyCache { inferred: true, released_pools: u32::MAX, in_malloc });
    }
}

/// The requests of every CUDA device of `trace`, in order.
///
/// Allocations come from `alloc` events (their recorded block size, see the module docs),
/// frees from `free` and `free_completed`, out-of-memory failures from `oom`. `empty_cache`
/// calls are inferred: in a snapshot, each run of `segment_free`/`segment_unmap` entries; in a
/// trace with totals only, a reserved total that falls, or grows by more than the allocation
/// could have asked of the device.
pub fn requests(trace: &Trace) -> Requests {
    let own = super::own_settings(trace);
    let mut notes = own.notes.clone();
    let own_conf = own.conf.clone();
    let release = trace.meta.pytorch_version.as_deref().and_then(TorchRelease::parse);
    let ev = &trace.events;
    let mut walks: Vec<Option<DeviceWalk>> = (0..trace.devices.len()).map(|d| start_device(trace, d, &own_conf, &mut notes)).collect();
    for (d, w) in walks.iter_mut().enumerate() {
        if let Some(w) = w {
            let index = trace.devices[d].index;
            w.collects_in_malloc = own_conf.gc_threshold() > 0.0
                && (own.fraction_for(index).is_some_and(|f| f < 1.0) || own_conf.per_process_memory_fraction.is_some_and(|f| f < 1.0));
        }
    }
    for i in 0..ev.len() {
        let d = ev.device[i] as usize;
        if let Some(Some(w)) = walks.get_mut(d) {
            match ev.event_type(i) {
                EventType::SegmentAlloc | EventType::SegmentMap | EventType::SegmentFree | EventType::SegmentUnmap => {
                    w.has_segment_events = true
                }
                EventType::FreeCompleted => w.has_completions = true,
                _ => {}
            }
        }
    }
    let round = own_conf.allocator_config();
    let mut cursor = ev.cursor();
    let mut pools = per_event(&trace.event_pools, ev.len());
    let mut asked = per_event(&trace.event_requested, ev.len());
    let mut skip = false;
    for i in 0..ev.len() {
        let after = cursor.advance();
        let (pool, requested) = (pools.next().flatten(), asked.next().flatten());
        let d = ev.device[i] as usize;
        let Some(Some(w)) = walks.get_mut(d) else { continue };
        if std::mem::take(&mut skip) {
            w.before = after;
            continue;
        }
        skip = walk_event(trace, (i, requested), after, pool, w, &own_conf, &round);
    }
    let mut devices = Vec::new();
    for mut w in walks.into_iter().flatten() {
        w.close_release(false, None);
        if w.unexplained_growth > 0 {
            notes.push(format!(
                "{}: {} allocations grew the reserved total by what no cudaMalloc for them could: an empty_cache was inferred before each",
                w.out.name, w.unexplained_growth
            ));
        }
        devices.push(w.out);
    }
    Requests { devices, own_conf, own, release, notes }
}

/// The walk of device `d`, or `None` for memory the caching allocator does not hold.
fn start_device(trace: &Trace, d: usize, own: &AllocConf, notes: &mut Vec<String>) -> Option<DeviceWalk> {
    let device = &trace.devices[d];
    if device.is_pinned_host() || device.kind == "cpu" {
        notes.push(format!("{device}: not a CUDA device's caching allocator: left out"));
        return None;
    }
    let base = trace.events.base_totals.get(d).copied().unwrap_or_default();
    let initial: Vec<SegmentInfo> = trace.initial_segments.iter().filter(|s| s.device as usize == d).cloned().collect();
    let seg_reserved: u64 = initial.iter().map(|s| s.size_bytes).fold(0, u64::saturating_add);
    let seg_allocated: u64 = initial
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state == BlockState::Allocated)
        .map(|b| b.size_bytes)
        .fold(0, u64::saturating_add);
    let opaque = base.reserved_bytes.saturating_sub(seg_reserved);
    if opaque > 0 {
        notes.push(format!(
            "{device}: {opaque} bytes were reserved before the trace began in segments it does not show: counted as reserved throughout"
        ));
    }
    let initial_expandable = own.expandable() && !initial.is_empty();
    let out = DeviceRequests {
        device: d as u8,
        name: device.to_string(),
        initial_segments: initial,
        initial_expandable,
        initial_large_page_bytes: own.large_segment_bytes(),
        loose_allocated_bytes: base.allocated_bytes.saturating_sub(seg_allocated),
        opaque_reserved_bytes: opaque,
        pools: trace.pools.clone(),
        ..DeviceRequests::default()
    };
    Some(DeviceWalk {
        out,
        has_segment_events: false,
        has_completions: false,
        before: base,
        open_release: None,
        release_pools: Vec::new(),
        release_stack: None,
        new_segment_at: None,
        unexplained_growth: 0,
        collects_in_malloc: false,
    })
}

/// Turns event `i` into requests; `true` when the next event is folded into this one (a free
/// and its completion).
fn walk_event(
    trace: &Trace,
    (i, requested): (usize, Option<u64>),
    after: Totals,
    pool: Option<u16>,
    w: &mut DeviceWalk,
    own: &AllocConf,
    round: &AllocatorConfig,
) -> bool {
    let ev = &trace.events;
    let et = ev.event_type(i);
    let (ts, size, addr, stream) = (ev.ts_ns[i], ev.size_bytes[i], ev.address[i], ev.stream[i]);
    let before = std::mem::replace(&mut w.before, after);
    let stack = trace.stacks.stack_of_event(i);
    if matches!(et, EventType::SegmentFree | EventType::SegmentUnmap) {
        match w.open_release {
            Some(k) => {
                w.out.requests[k].event = i as u32;
                w.out.requests[k].ts_ns = ts;
                if w.release_stack != stack {
                    w.release_stack = None;
                }
            }
            None => {
                w.open_release = Some(w.out.requests.len());
                w.release_stack = stack;
                w.push(i, ts, Op::EmptyCache { inferred: true, released_pools: u32::MAX, in_malloc: false });
                w.out.inferred_empty_caches += 1;
            }
        }
        w.release_pools.extend(pool);
        return false;
    }
    if matches!(et, EventType::Snapshot | EventType::LayerEnter | EventType::LayerExit) {
        return false;
    }
    let by_alloc = matches!(et, EventType::SegmentAlloc | EventType::SegmentMap | EventType::Alloc | EventType::Oom);
    w.close_release(by_alloc, stack);
    let new_segment =
        std::mem::take(&mut w.new_segment_at) == Some(addr) || (!w.has_segment_events && after.reserved_bytes > before.reserved_bytes);
    if matches!(et, EventType::SegmentAlloc) {
        w.new_segment_at = Some(addr);
    }
    let request = match (et, requested) {
        (EventType::Alloc, Some(bytes)) => bytes,
        _ => request_size(own, round, size, new_segment),
    };
    if !w.has_segment_events {
        infer_from_totals(w, (et, i, ts), before, after, request, own, round);
    }
    match et {
        EventType::Alloc => {
            w.push(i, ts, Op::Alloc { key: addr, size_bytes: request, stream, pool });
            false
        }
        EventType::Free => {
            let folds = i + 1 < ev.len()
                && ev.event_type(i + 1) == EventType::FreeCompleted
                && ev.device[i + 1] == ev.device[i]
                && ev.address[i + 1] == addr;
            let completed = folds || !w.has_completions;
            w.push(i, ts, Op::Free { key: addr, size_bytes: size, completed });
            folds
        }
        EventType::FreeCompleted => {
            w.push(i, ts, Op::FreeCompleted { key: addr });
            false
        }
        EventType::Oom => {
            w.push(i, ts, Op::FailedAlloc { size_bytes: size, stream, pool });
            false
        }
        _ => false,
    }
}

/// A trace with totals only: a reserved total that falls, or grows by other than what the
/// allocation could have mapped or cudaMalloc'd, shows an `empty_cache` before the event.
fn infer_from_totals(
    w: &mut DeviceWalk,
    (et, i, ts): (EventType, usize, u64),
    before: Totals,
    after: Totals,
    request: u64,
    own: &AllocConf,
    round: &AllocatorConfig,
) {
    let (was, now) = (before.reserved_bytes, after.reserved_bytes);
    let released = match et {
        EventType::Alloc => {
            let grown = now.saturating_sub(was);
            let plausible = grown == 0 || plausible_growth(own, round, request, grown);
            if now >= was && !plausible {
                w.unexplained_growth += 1;
            }
            now < was || !plausible
        }
        EventType::Free | EventType::FreeCompleted | EventType::Oom => now < was,
        _ => false,
    };
    if released {
        let in_malloc = w.collects_in_malloc && et == EventType::Alloc;
        w.infer_empty_cache(i, ts, in_malloc);
    }
}

/// Whether one allocation of `request` bytes could grow the reserved total by `grown` under
/// the run's own configuration: one cudaMalloc of its allocation size, or pages of an
/// expandable segment.
fn plausible_growth(own: &AllocConf, round: &AllocatorConfig, request: u64, grown: u64) -> bool {
    let size = round.round_size(request);
    if own.expandable() {
        let page = if size <= SMALL_REQUEST_BYTES { SMALL_SEGMENT_BYTES } else { own.large_segment_bytes() };
        return grown.is_multiple_of(page);
    }
    grown == super::conf::allocation_size(size, own.large_segment_bytes())
}

/// The request behind a recorded block of `block` bytes under the run's own configuration.
///
/// The block itself, with two exceptions where the allocator handed out more than it was
/// asked: a block that took a whole free region whose size the run's own rounding would
/// round up (the largest size that rounding keeps within it, placed the same), and, with a
/// `max_split_size`, a block of a new segment just above it (`new_segment`): unsplit because
/// less than 1 MiB was left, it served a request under `max_split_size` (an oversize request
/// would have been served by a cached oversize block where one was), so the largest such
/// request.
pub(crate) fn request_size(own: &AllocConf, round: &AllocatorConfig, block: u64, new_segment: bool) -> u64 {
    if block == 0 || block >= 1 << 60 {
        return block;
    }
    let max_split = own.max_split_bytes();
    if new_segment && block >= max_split && block - max_split < SMALL_REQUEST_BYTES {
        let below = max_split - MIN_BLOCK_BYTES;
        if round.round_size(below) == below && block - below <= SMALL_REQUEST_BYTES {
            return below;
        }
    }
    if round.round_size(block) <= block {
        return block;
    }
    let floor = 1u64 << (63 - block.leading_zeros());
    let index = ((63 - block.leading_zeros()) as usize).saturating_sub(20).min(DIVISION_INTERVALS - 1);
    let divisions = own.divisions()[index].max(1);
    let step = floor >> divisions.trailing_zeros();
    for candidate in [block & !(step.max(1) - 1), block / MIN_BLOCK_BYTES * MIN_BLOCK_BYTES] {
        if candidate > 0 && round.round_size(candidate) <= block {
            return candidate;
        }
    }
    block
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::whatif::conf::MIB;

    fn size(conf: &str, block: u64, new_segment: bool) -> u64 {
        let own = AllocConf::parse(conf).unwrap();
        request_size(&own, &own.allocator_config(), block, new_segment)
    }

    #[test]
    fn blocks_are_their_own_requests_unless_the_run_handed_out_more() {
        assert_eq!(size("", 1024, false), 1024);
        assert_eq!(size("", 21 * MIB, true), 21 * MIB);
        // 4 divisions of [16, 32) MiB: a 21 MiB block took a whole free region for a request
        // that rounded to 20 MiB (21 would round to 24).
        assert_eq!(size("roundup_power2_divisions:4", 21 * MIB, false), 20 * MIB);
        assert_eq!(size("roundup_power2_divisions:4", 24 * MIB, false), 24 * MIB);
        // A new 64 MiB segment, unsplit, under max_split_size_mb:64: the request was below it.
        assert_eq!(size("max_split_size_mb:64", 64 * MIB, true), 64 * MIB - 512);
        assert_eq!(size("max_split_size_mb:64", 64 * MIB, false), 64 * MIB, "a cached oversize block served an oversize request");
        assert_eq!(size("max_split_size_mb:64", 66 * MIB, true), 66 * MIB, "more than 1 MiB over: an oversize request");
        assert_eq!(size("", u64::MAX, true), u64::MAX);
    }
}
