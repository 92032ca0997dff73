//! Fuzzes `shared::import`: format detection, bounded gzip decompression and every importer
//! behind it. The decompression bound is small so that a bomb is refused within the run's
//! memory limit.
#![no_main]

#[path = "budget.rs"]
mod budget;

#[global_allocator]
static ALLOC: budget::Counting = budget::Counting;

use shared::ImportOptions;

/// Decompressed bytes accepted from gzip input here.
const MAX_DECOMPRESSED_BYTES: u64 = 8 << 20;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let mut options = ImportOptions::default();
    options.max_decompressed_bytes = MAX_DECOMPRESSED_BYTES;
    // Snapshots and Memory Tracer files are decompressed whole: their budget is counted
    // against the decompressed length (Chrome and DFTracer input streams, and costs less).
    let counted_bytes = match shared::import::gunzip_bounded(data, MAX_DECOMPRESSED_BYTES) {
        Ok(raw) if shared::import::is_gzip(data) => raw.len().max(data.len()),
        _ => data.len(),
    };
    budget::within_budget_of(counted_bytes, data, |d| shared::import(d, &options));
});
