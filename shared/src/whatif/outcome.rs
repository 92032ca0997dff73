//! What a simulation is asked ([`SimOptions`]) and what it gives ([`Outcome`]): the peaks and
//! when, the first out-of-memory, where each request was placed, and what the run did that the
//! model could not follow.

use crate::model::Totals;

/// How the simulation runs besides the allocator's configuration.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct SimOptions {
    /// Bytes of device memory the allocator can obtain (cudaMalloc, cuMemCreate fail beyond
    /// it): the device's total memory less what the CUDA context and other processes hold.
    /// Also sizes expandable segments' address reserves (9/8 of it). Default `None`: no limit.
    pub capacity_bytes: Option<u64>,
    /// The per-process memory fraction (`torch.cuda.set_per_process_memory_fraction`), which
    /// overrides the configuration's `per_process_memory_fraction`. Under 1 it caps reserved
    /// memory at fraction × capacity and lets `garbage_collection_threshold` act. Needs a
    /// capacity. Default `None`: the configuration's, if any.
    pub memory_fraction: Option<f64>,
    /// Keep the totals after every request in [`Outcome::totals`]. Default false.
    pub record_totals: bool,
    /// Where new segments go in the address space. Default: where the recorded run had them.
    pub addresses: SegmentAddresses,
}

/// Where the simulated allocator places a new segment (a `cudaMalloc`, or an expandable
/// segment's reserve). Addresses decide only ties: best fit takes the lower of two free
/// blocks of one size, and an expandable mapping the lowest segment with room.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SegmentAddresses {
    /// At the address the recorded run's segment had where that is free, else above every
    /// address: right where the run and the replay share a regime (both expandable or
    /// neither), since the driver then placed the same segments.
    #[default]
    AsRecorded,
    /// The lowest free range, ignoring the recorded addresses.
    Lowest,
    /// The highest free range below a ceiling, ignoring the recorded addresses.
    Highest,
}

impl SimOptions {
    /// Options with a capacity, the rest default.
    pub fn with_capacity(capacity_bytes: Option<u64>) -> SimOptions {
        SimOptions { capacity_bytes, ..SimOptions::default() }
    }

    /// These options, keeping every request's totals.
    pub fn recording_totals(mut self) -> SimOptions {
        self.record_totals = true;
        self
    }

    /// These options with new segments placed by `addresses`.
    pub fn placing(mut self, addresses: SegmentAddresses) -> SimOptions {
        self.addresses = addresses;
        self
    }

    /// These options with a memory fraction.
    pub fn with_fraction(mut self, fraction: Option<f64>) -> SimOptions {
        self.memory_fraction = fraction;
        self
    }
}

/// A request of a device's stream and the trace event it came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct At {
    /// Index into [`DeviceRequests::requests`].
    pub request: usize,
    /// The trace event.
    pub event: u32,
    pub ts_ns: u64,
}

/// The first request the allocator could not serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OomAt {
    pub at: At,
    /// The request rounded as the allocator rounds it (what PyTorch reports).
    pub requested_bytes: u64,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    pub stream: u16,
    /// The recorded run ran out of memory here too.
    pub recorded_in_trace: bool,
}

/// Requests that did not fit the model, counted and skipped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Anomalies {
    /// Frees (and completions) of keys no live block has.
    pub unknown_frees: u64,
    /// Frees of blocks whose allocation the simulation refused (out of memory).
    pub frees_of_refused: u64,
    /// Allocations of a key already live; the earlier block stays allocated, unreachable.
    pub repeated_keys: u64,
    /// Allocations of 0 bytes (PyTorch hands out no block for them).
    pub zero_sizes: u64,
    /// Initial segments that overlapped another and were left out.
    pub overlapping_segments: u64,
}

/// How often the simulated allocator put a block where the recorded run's did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    pub matched: u64,
    pub differed: u64,
    /// The first allocation placed elsewhere (index into the requests).
    pub first_difference: Option<usize>,
}

/// What the replay gave.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    pub requests: usize,
    /// `torch.cuda.max_memory_allocated()`: bytes in allocated blocks, at most.
    pub allocated_peak_bytes: u64,
    pub allocated_peak_at: Option<At>,
    /// `torch.cuda.max_memory_reserved()`: bytes in segments, at most (also within a request,
    /// between a mapping and a release).
    pub reserved_peak_bytes: u64,
    pub reserved_peak_at: Option<At>,
    /// Reserved peak less the bytes allocated once the request that first reached it was served.
    pub reserved_unallocated_at_peak_bytes: u64,
    /// Segments (cudaMalloc'd ones, and expandable segments with memory mapped) then.
    pub segments_at_peak: u64,
    pub max_segments: u64,
    pub final_totals: Totals,
    /// The first out-of-memory; the request was skipped and the replay went on.
    pub oom: Option<OomAt>,
    pub ooms: u64,
    /// The trace's own out-of-memory failures that fit here (tried, then let go at once).
    pub recorded_ooms_that_fit: u64,
    /// `num_alloc_retries`: allocations that freed all cached blocks and tried again.
    pub alloc_retries: u64,
    /// cudaMalloc calls and expandable mappings (`num_device_alloc`).
    pub device_allocs: u64,
    /// cudaFree calls and expandable unmappings (`num_device_free`).
    pub device_frees: u64,
    pub placement: Placement,
    pub anomalies: Anomalies,
    /// Totals after each request, when [`SimOptions::record_totals`] asked for them.
    pub totals: Option<Vec<Totals>>,
}
