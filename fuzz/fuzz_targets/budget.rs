//! A counting allocator for the fuzz targets: each input's peak heap use must stay within
//! [`MAX_BYTES_PER_INPUT_BYTE`] times its length (plus a fixed allowance for the empty trace
//! and reader buffers), or the target panics and libFuzzer reports the input.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// The bound the importers promise: memory proportional to the input.
pub const MAX_BYTES_PER_INPUT_BYTE: usize = 64;
/// What an import costs whatever its input (an empty trace, a reader's buffer).
pub const FIXED_ALLOWANCE_BYTES: usize = 1 << 20;

pub struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to `System` with the same arguments; the counters only
// observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Relaxed) + layout.size();
            PEAK.fetch_max(live, Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded unchanged.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                let live = LIVE.fetch_add(new_size - layout.size(), Relaxed) + new_size - layout.size();
                PEAK.fetch_max(live, Relaxed);
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Relaxed);
            }
        }
        p
    }
}

/// Runs `f` on `data` and panics if its peak heap use exceeds the bound for `data`'s length.
#[allow(dead_code)] // not every target uses both
pub fn within_budget<T>(data: &[u8], f: impl FnOnce(&[u8]) -> T) {
    within_budget_of(data.len(), data, f)
}

/// Like [`within_budget`], with the bound computed for `counted_bytes` (the decompressed
/// length of gzip input that an importer holds whole).
#[allow(dead_code)] // not every target uses both
pub fn within_budget_of<T>(counted_bytes: usize, data: &[u8], f: impl FnOnce(&[u8]) -> T) {
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    drop(f(data));
    let used = PEAK.load(Relaxed).saturating_sub(base);
    let allowed = counted_bytes.saturating_mul(MAX_BYTES_PER_INPUT_BYTE) + FIXED_ALLOWANCE_BYTES;
    assert!(used <= allowed, "peak heap {used} bytes for a {}-byte input counted as {counted_bytes} (allowed {allowed})", data.len());
}
