//! The in-process recording session (the built-in models and the Rust MemoryTracer): the safe
//! face of the C++ shim linked into `collector-capture`.
//!
//! One [`Session`] records at a time per process (the shim's callbacks are global). The memory
//! reporter is installed on the thread that starts the session and reaches the autograd
//! engine's threads through libtorch's thread-local state propagation, so a session must be
//! started, driven and stopped on the thread that runs the model; [`Session`] is `!Send` to
//! enforce that.

use crate::shim;
pub use record as ffi;
pub use record::assemble::{self, Captured};
pub use record::live;
use shared::model::{Device, Phase, Totals};
use std::ffi::CString;
use std::marker::PhantomData;
use std::sync::{Mutex, MutexGuard};

static SESSION: Mutex<()> = Mutex::new(());

/// An interned scope or mark name, cheap to pass on every forward call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Name(u32);

/// Interns `name` in the shim's string table (ids stay valid for the life of the process).
pub fn intern(name: &str) -> Name {
    let c = CString::new(name.replace('\0', " ")).unwrap_or_default();
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call; the shim copies it.
    Name(unsafe { shim::mt_intern(c.as_ptr()) })
}

/// Sets the phase stamped on every record from now on (all threads).
pub fn set_phase(phase: Phase) {
    // SAFETY: plain atomic store in the shim.
    unsafe { shim::mt_set_phase(phase as u8) }
}

/// Attributes ops to TorchScript module hierarchies while on.
pub fn set_torchscript(enabled: bool) {
    // SAFETY: plain atomic store in the shim.
    unsafe { shim::mt_set_torchscript(i32::from(enabled)) }
}

/// Records a mark (e.g. an iteration boundary) with a value.
pub fn mark(name: Name, value: i64) {
    // SAFETY: writes one record into this thread's buffer; no-op when not recording.
    unsafe { shim::mt_mark(name.0, value) }
}

/// Opens a layer scope on this thread until the guard drops. Cheap and harmless when no session
/// is recording, so model code calls it unconditionally.
pub fn scope(name: Name) -> ScopeGuard {
    // SAFETY: pushes onto this thread's scope stack; the guard pops it on this thread.
    unsafe { shim::mt_scope_enter(name.0) };
    ScopeGuard { name, _not_send: PhantomData }
}

/// Closes its scope when dropped.
#[must_use = "the scope closes when the guard drops"]
#[derive(Debug)]
pub struct ScopeGuard {
    name: Name,
    _not_send: PhantomData<*const ()>,
}

impl Drop for ScopeGuard {
    fn drop(&mut self) {
        // SAFETY: pops the scope this guard pushed, on the same thread (the guard is !Send).
        unsafe { shim::mt_scope_exit(self.name.0) }
    }
}

/// The CUDA caching allocator's own counters for `device` (what
/// `torch.cuda.memory_stats()` reports); `None` when CUDA is not initialized.
pub fn cuda_device_stats(device: i8) -> Option<ffi::MtDeviceStats> {
    let mut out = ffi::MtDeviceStats::default();
    // SAFETY: `out` is a valid, writable struct of the layout the shim expects.
    (unsafe { shim::mt_cuda_device_stats(device, &mut out) } == 0).then_some(out)
}

/// Resets the CUDA caching allocator's peak counters (`torch.cuda.reset_peak_memory_stats`).
pub fn cuda_reset_peak(device: i8) -> bool {
    // SAFETY: calls into the allocator with a device index; errors are caught in the shim.
    unsafe { shim::mt_cuda_reset_peak(device) == 0 }
}

/// Returns the CUDA caching allocator's unused blocks to the driver (`torch.cuda.empty_cache`).
pub fn cuda_empty_cache() -> bool {
    // SAFETY: calls into the allocator; errors are caught in the shim.
    unsafe { shim::mt_cuda_empty_cache() == 0 }
}

fn last_error() -> String {
    let mut buf = vec![0u8; 4096];
    // SAFETY: `buf` has `buf.len()` writable bytes.
    let n = unsafe { shim::mt_last_error(buf.as_mut_ptr().cast(), buf.len()) };
    buf.truncate(n);
    String::from_utf8_lossy(&buf).into_owned()
}

/// Why a capture could not start.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("another trace is being recorded in this process; one at a time")]
    Busy,
    #[error("the tracing shim failed: {0}")]
    Shim(String),
}

/// Capture settings.
#[derive(Clone, Debug)]
pub struct CaptureConfig {
    /// Allocations and frees kept; later ones are counted and dropped.
    pub max_events: u64,
    /// Operators kept; later ones are counted and dropped.
    pub max_ops: u64,
    /// Record operator input and output tensors (storage, bytes, shape).
    pub capture_tensors: bool,
    /// Record operators at all (false: allocations and frees only, attributed to scopes).
    pub capture_ops: bool,
    /// The device whose base totals and peak counters to read (`None`: CPU only).
    pub cuda_device: Option<i8>,
}

impl Default for CaptureConfig {
    fn default() -> Self {
        Self { max_events: 5_000_000, max_ops: 5_000_000, capture_tensors: true, capture_ops: true, cuda_device: None }
    }
}

/// A recording in progress. Stop it with [`Session::finish`]; dropping it stops it too.
pub struct Session {
    _lock: MutexGuard<'static, ()>,
    config: CaptureConfig,
    start_ns: u64,
    base_totals: Vec<(Device, Totals)>,
    records: Vec<ffi::MtRecord>,
    stopped: bool,
    _not_send: PhantomData<*const ()>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("config", &self.config).finish_non_exhaustive()
    }
}

impl Session {
    /// Starts recording on this thread; [`CaptureError::Busy`] while another session records.
    pub fn start(config: CaptureConfig) -> Result<Self, CaptureError> {
        let lock = match SESSION.try_lock() {
            Ok(l) => l,
            // A panic while tracing poisoned the lock; the shim is reset below, so go on.
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return Err(CaptureError::Busy),
        };
        Self::start_locked(lock, config)
    }

    /// Starts recording on this thread, waiting for another session to finish first.
    pub fn start_waiting(config: CaptureConfig) -> Result<Self, CaptureError> {
        let lock = SESSION.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        Self::start_locked(lock, config)
    }

    fn start_locked(lock: MutexGuard<'static, ()>, config: CaptureConfig) -> Result<Self, CaptureError> {
        // SAFETY: no session is active (we hold the lock); reset clears the shim's buffers.
        if unsafe { shim::mt_reset(config.max_events, config.max_ops, i32::from(config.capture_tensors), i32::from(config.capture_ops)) }
            != 0
        {
            return Err(CaptureError::Shim(last_error()));
        }
        let mut base_totals = vec![(Device { kind: "cpu".into(), index: 0, rank: None }, Totals::default())];
        if let Some(dev) = config.cuda_device {
            if let Some(stats) = cuda_device_stats(dev) {
                base_totals.push((
                    Device { kind: "cuda".into(), index: i32::from(dev), rank: None },
                    Totals { allocated_bytes: stats.allocated_current, reserved_bytes: stats.reserved_current },
                ));
            }
            cuda_reset_peak(dev);
        }
        set_phase(Phase::Other);
        // SAFETY: reads the steady clock.
        let start_ns = unsafe { shim::mt_now_ns() };
        // SAFETY: installs the callbacks; paired with mt_stop in finish/drop on this thread.
        if unsafe { shim::mt_start() } != 0 {
            return Err(CaptureError::Shim(last_error()));
        }
        Ok(Self { _lock: lock, config, start_ns, base_totals, records: Vec::new(), stopped: false, _not_send: PhantomData })
    }

    /// The steady-clock time recording started at (the trace's time zero).
    pub fn start_ns(&self) -> u64 {
        self.start_ns
    }

    /// Pauses recording (callbacks removed: the model runs at full speed).
    pub fn pause(&mut self) {
        // SAFETY: removes the callbacks on the thread that installed them.
        unsafe { shim::mt_stop() };
    }

    /// Resumes after [`Session::pause`].
    pub fn resume(&mut self) -> Result<(), CaptureError> {
        // SAFETY: reinstalls the callbacks on this thread.
        if unsafe { shim::mt_start() } != 0 {
            return Err(CaptureError::Shim(last_error()));
        }
        Ok(())
    }

    /// Moves the records published so far out of the shim; returns how many were new.
    /// Keeps per-thread buffers small during long runs.
    pub fn drain(&mut self) -> usize {
        let before = self.records.len();
        loop {
            self.records.reserve(16384);
            let spare = self.records.spare_capacity_mut();
            // SAFETY: `spare` has `spare.len()` writable MtRecord slots; the shim writes `n`
            // fully initialized records at the front.
            let n = unsafe { shim::mt_drain(spare.as_mut_ptr().cast(), spare.len()) };
            if n == 0 {
                break;
            }
            // SAFETY: the shim initialized the first `n` spare slots.
            unsafe { self.records.set_len(self.records.len() + n) };
        }
        self.records.len() - before
    }

    /// Records drained so far.
    pub fn records(&self) -> &[ffi::MtRecord] {
        &self.records
    }

    /// Forgets the records drained so far (benchmarks that only count them).
    pub fn clear_records(&mut self) {
        self.records.clear();
    }

    /// Stops recording and returns everything captured. A CUDA session keeps device memory
    /// only: host allocations (scalars, index tensors made on the CPU) would interleave
    /// another device's totals with the GPU's. It also reads the CUDA allocator's counters
    /// now, while the run's tensors are still alive.
    pub fn finish(mut self) -> Captured {
        self.stop();
        self.drain();
        let mut counters = ffi::MtCounters::default();
        // SAFETY: `counters` is a valid, writable struct.
        unsafe { shim::mt_counters(&mut counters) };
        let mut records = std::mem::take(&mut self.records);
        let mut base_totals = std::mem::take(&mut self.base_totals);
        if self.config.cuda_device.is_some() {
            records.retain(|r| !(r.kind == ffi::MT_MEM && r.device_type == 0));
            base_totals.retain(|(d, _)| d.kind == "cuda");
        }
        Captured {
            records,
            strings: shim_strings(),
            counters,
            start_ns: self.start_ns,
            base_totals,
            cuda_stats: self.config.cuda_device.and_then(cuda_device_stats),
            holders: Vec::new(),
        }
    }

    fn stop(&mut self) {
        if !self.stopped {
            // SAFETY: removes the callbacks and pops the reporter this session pushed.
            unsafe { shim::mt_stop() };
            set_phase(Phase::Other);
            self.stopped = true;
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A copy of the shim's string table (index = id - 1).
pub fn shim_strings() -> Vec<String> {
    // SAFETY: plain read of a counter.
    let n = unsafe { shim::mt_string_count() };
    (1..=n)
        .map(|id| {
            let mut len = 0usize;
            // SAFETY: the shim returns a pointer to `len` bytes that stay valid (strings are
            // never removed) or null.
            let p = unsafe { shim::mt_string(id, &mut len) };
            if p.is_null() {
                return String::new();
            }
            // SAFETY: `p` points at `len` initialized bytes.
            let bytes = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) };
            String::from_utf8_lossy(bytes).into_owned()
        })
        .collect()
}
