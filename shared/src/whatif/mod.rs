//! What if: a trace's memory requests replayed through a model of PyTorch's CUDA caching
//! allocator (`DeviceCachingAllocator` in `c10/cuda/CUDACachingAllocator.cpp`) under any
//! `PYTORCH_CUDA_ALLOC_CONF`, for the peaks, the segments and the first out-of-memory another
//! configuration or a smaller device would give.
//!
//! ```no_run
//! # fn demo(trace: &shared::model::Trace) -> Result<(), shared::whatif::ConfError> {
//! use shared::whatif::{requests, simulate, AllocConf, SimOptions};
//! let reqs = requests(trace);
//! // The run's own settings, with the user's string on top.
//! let conf = reqs.own_conf.overridden_by(&AllocConf::parse("expandable_segments:True")?);
//! for dev in &reqs.devices {
//!     let out = simulate(dev, &conf, &SimOptions::with_capacity(Some(80 << 30)))?;
//!     println!("{}: reserved peak {} bytes, first OOM {:?}", dev.name, out.reserved_peak_bytes, out.oom);
//! }
//! # Ok(()) }
//! ```
//!
//! [`what_if`] does the same for one device of a trace and several settings at once, and
//! reports the replay under the run's own settings against the recorded curve;
//! [`segments_after`] gives the simulated segment map at a moment (the viewer's Segments view).
//!
//! # The model
//! Per device (PyTorch keeps one allocator per device), as PyTorch 2.6 to 2.15 do it:
//! - `round_size`: at least 512 bytes, in 512-byte steps, or `roundup_power2_divisions`
//!   steps (the [`crate::allocator::AllocatorConfig::round_size`] the snapshot importer uses).
//! - Pools: requests up to 1 MiB from the small pool (2 MiB segments), the rest from the large
//!   one; new segments of `get_allocation_size` (2 MiB; `large_segment_size`, 20 MiB by
//!   default, below 10 MiB; else rounded up to 2 MiB). Private pools (CUDA graphs, `MemPool`)
//!   have pools of their own.
//! - Best fit by (stream, size, address) per pool, so each stream has its own cache; oversize
//!   blocks (`max_split_size_mb`) serve only oversize requests, and only within
//!   `max_non_split_rounding_mb`; splitting leaves ≥ 512 bytes in the small pool (and in
//!   expandable segments), > 1 MiB in the large one, and never splits oversize requests.
//! - Frees merge with free neighbours; held-back frees (`record_stream` uses on other
//!   streams) wait for their `free_completed` when the trace records one (snapshots do); native
//!   traces have none, so their frees are immediate.
//! - No cached block fitting: `garbage_collection_threshold` (only under a memory fraction),
//!   then cudaMalloc, then `release_available_cached_blocks` (oversize blocks) and retry, then
//!   `release_cached_blocks` (= `empty_cache`, skipped during a graph capture) and retry, then
//!   out of memory. A memory fraction caps reserved memory at fraction × capacity; the capacity
//!   caps what cudaMalloc and expandable mappings get.
//! - Expandable segments: one reserve of 9/8 of the device's memory per stream and pool
//!   (`expandable_segments_reserve` sets another), mapped at the lowest address with room,
//!   in pages of 2 MiB (small pool) or `large_segment_size` (large); `empty_cache` and the
//!   retries unmap whole free pages, and drop a segment left with nothing mapped.
//! - New segments are placed at the address the recorded run's block had (so ties between
//!   equal-sized cached blocks break as they did), or, where that is taken, above it all.
//!   Across the expandable divide (a run with expandable segments predicting one without, or
//!   the reverse) the recorded addresses are not what the driver would give: an expandable
//!   run's are offsets in its own reserve. There the reserved peak is also replayed with new
//!   segments at the lowest and at the highest free addresses, and the report gives the
//!   range ([`SettingOutcome::reserved_peak_range_bytes`]).
//!
//! # Keys
//! Modelled: `backend` (`native`; `cudaMallocAsync` is refused by [`simulate`]),
//! `expandable_segments`, `max_split_size_mb`, `max_non_split_rounding_mb`,
//! `large_segment_size_mb`, `roundup_power2_divisions`, `garbage_collection_threshold`,
//! `per_process_memory_fraction`, `throw_on_cudamalloc_oom` (refuses without retrying),
//! `expandable_segments_reserve` (its size only). Accepted, with no effect on placement (see
//! [`AllocConf::unmodelled_keys`]): `release_lock_on_cudamalloc` / `_hipmalloc`,
//! `pinned_use_cuda_host_register` / `_hip_`, `pinned_num_register_threads`,
//! `pinned_use_background_threads`, `pinned_reserve_segment_size_mb`, `pinned_free_catch_all`,
//! `pinned_max_round_threshold_mb`, `pinned_max_cached_size_mb` (the pinned host allocator),
//! `graph_capture_record_stream_reuse` (frees during capture: the trace has their timing),
//! `expandable_segments_reserve_by_class` (stream classes are not in traces).
//!
//! # Releases
//! [`AllocConf::parse_for`] reads as a given release; [`AllocConf::parse`] as 2.15.
//! - 2.6-2.8: parsed by `CUDAAllocatorConfig`; unknown keys are "Unrecognized
//!   CachingAllocator option"; `max_split_size_mb` and `max_non_split_rounding_mb` must be
//!   above 20 (20 is refused); in a `roundup_power2_divisions` list `>` fills from the last
//!   interval named, overwriting it (`[256:1,512:2,>:4]` gives 512 MiB-1 GiB 4 divisions).
//! - 2.9: parsing moves to `AcceleratorAllocatorConfig`; 20 is accepted; `>` fills from the
//!   interval after the last named; adds `graph_capture_record_stream_reuse`.
//! - 2.10: adds `per_process_memory_fraction` (a fraction under 1 caps memory from the
//!   start; a fraction of 1 sets no cap, where 2.6-2.9's `set_per_process_memory_fraction(1)`
//!   did, enabling garbage collection) and `pinned_reserve_segment_size_mb`.
//! - 2.11: adds `large_segment_size_mb` (> 10; read first, it is the lower bound of
//!   `max_split_size_mb` and the default of `max_non_split_rounding_mb`).
//! - 2.12: adds `pinned_free_catch_all`, `throw_on_cudamalloc_oom`. 2.13: adds
//!   `pinned_max_round_threshold_mb`, `pinned_max_cached_size_mb`. 2.15: adds
//!   `expandable_segments_reserve`, `expandable_segments_reserve_by_class`, and fails an
//!   expandable request larger than a segment's reserve as out of memory.
//! - After 2.15 (main): cached blocks of equal size are ordered by segment creation before
//!   address (`registration_counter`); not modelled.
//!
//! Differences from PyTorch's parser: values must be whole numbers where PyTorch's `stoi`
//! would read a prefix (`128.5`) or wrap a negative (`-5`, "no limit"); malformed
//! `expandable_segments_reserve` values, which PyTorch ignores with a log line, are refused.
//!
//! # The requests
//! See [`requests`]. An allocation asks for what the program asked for where the trace knows
//! it ([`Trace::event_requested`]: every snapshot entry, and native traces of torch 2.9 and
//! newer, whose shim reads the allocator's count of requested bytes), rounded by each
//! configuration as PyTorch rounds it. Where it does not, it asks for the block size the trace
//! recorded, already rounded under the run's own configuration; two cases where a block is
//! larger than its request are undone (a block that took a whole free region, and an unsplit
//! new segment just above `max_split_size`), so a replay under the run's own configuration
//! decides as the run did; a what-if that rounds less than the run did cannot undo the rest of
//! that rounding, so its peaks are upper bounds there.
//!
//! `empty_cache` calls are inferred from their effect: in a snapshot, each run of
//! `segment_free`/`segment_unmap` entries; in a trace with totals only, a reserved total that
//! falls, or grows by what no allocation could. A call that gave nothing back leaves no trace
//! and is missed, though under another configuration it might have given something back. A
//! snapshot's release whose entries carry the stack of the allocation right after it happened
//! inside that allocation (garbage collection, or the out-of-memory retry): a simulation with
//! a capacity skips it and decides for itself, one without replays it as `empty_cache`.
//!
//! Native traces (`*.mtrace.json`) put every event on one stream, so programs that allocate on
//! several (CUDA graph captures warm up on a side stream) replay exactly only until blocks of
//! two streams meet; snapshots name their streams. A trace that begins mid-run starts from its
//! initial segments ([`crate::model::Trace::initial_segments`]), expandable ones staying
//! expandable only under an expandable configuration; reserved memory no segment explains is
//! counted throughout and never released.
//!
//! # Checked against
//! `shared/tests/whatif.rs`: every recorded reserved total (and PyTorch's peaks) of the native
//! H100 traces and the snapshots in `tests/data/` under their own settings, and eleven runs of
//! one program under eleven settings on an H200 (`tests/data/whatif_runs.gen.py`), allocation
//! by allocation, out-of-memory failures, retries and garbage collection included.
//!
//! # Out of memory
//! The first failure is reported ([`Outcome::oom`]) and its request skipped (the block never
//! exists; its free is ignored), and the replay goes on: later peaks are those of a program
//! that survived the failure. The trace's own failures are tried too: where they fit, the
//! block is let go at once.

mod conf;
mod expandable;
mod initial;
mod outcome;
mod own;
mod release;
mod report;
mod requests;
mod segments;
mod sim;

pub use conf::{
    allocation_size, AllocConf, Backend, ConfError, ReserveSpec, TorchRelease, DEFAULT_LARGE_SEGMENT_BYTES, DIVISION_INTERVALS, MIB,
};
pub use outcome::{Anomalies, At, OomAt, Outcome, Placement, SegmentAddresses, SimOptions};
pub use own::{lenient, own_settings, OwnSettings, SettingsInfo, UNKNOWN as SETTINGS_UNKNOWN};
pub use report::{limits, parse_settings, what_if, Limits, OomReport, Recorded, SettingOutcome, WhatIfError, WhatIfOptions, WhatIfReport};
pub use requests::{requests, DeviceRequests, Op, Request, Requests};
pub use segments::segments_after;
pub use sim::simulate;

use crate::model::{Totals, Trace};

/// Simulated totals against the recorded ones, request by request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Comparison {
    /// The trace does not know this device's reserved memory (`TraceMeta::reserved_unknown`):
    /// only allocated totals were compared.
    pub reserved_unknown: bool,
    /// Requests whose event's recorded totals were compared.
    pub compared: usize,
    /// Requests whose reserved total matched to the byte.
    pub reserved_matched: usize,
    /// Requests whose allocated total matched to the byte.
    pub allocated_matched: usize,
    /// The first request whose reserved total differs, with the recorded and simulated totals.
    pub first_divergence: Option<Divergence>,
}

/// Where a replay first left the recorded reserved curve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Divergence {
    pub request: usize,
    pub event: u32,
    pub recorded: Totals,
    pub simulated: Totals,
}

/// Compares the totals after each request ([`Outcome::totals`]) with the totals `trace`
/// recorded after the request's event: a replay under the run's own configuration should
/// match every one. Requests of one event are compared once, after the last of them; a
/// release inside an allocation ([`Op::EmptyCache`] `in_malloc`) is compared at that
/// allocation (a simulation with a capacity makes the release there itself).
pub fn compare_with_recorded(trace: &Trace, dev: &DeviceRequests, totals: &[Totals]) -> Comparison {
    let reserved_unknown = trace.meta.reserved_unknown.contains(&dev.device);
    let mut recorded = vec![Totals::default(); trace.events.len()];
    let mut cursor = trace.events.cursor();
    for r in recorded.iter_mut() {
        *r = cursor.advance();
    }
    let mut c = Comparison { reserved_unknown, ..Comparison::default() };
    for (k, (req, sim)) in dev.requests.iter().zip(totals).enumerate() {
        let last_of_event = dev.requests.get(k + 1).is_none_or(|n| n.event != req.event);
        let Some(&rec) = recorded.get(req.event as usize) else { continue };
        if !last_of_event || matches!(req.op, Op::EmptyCache { in_malloc: true, .. }) {
            continue;
        }
        c.compared += 1;
        if reserved_unknown {
            // Nothing recorded to compare with.
        } else if rec.reserved_bytes == sim.reserved_bytes {
            c.reserved_matched += 1;
        } else if c.first_divergence.is_none() {
            c.first_divergence = Some(Divergence { request: k, event: req.event, recorded: rec, simulated: *sim });
        }
        if rec.allocated_bytes == sim.allocated_bytes {
            c.allocated_matched += 1;
        }
    }
    c
}
