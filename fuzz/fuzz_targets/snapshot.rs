//! Fuzzes the PyTorch memory-snapshot importer (pickle VM, field decoding, allocator replay).
#![no_main]

#[path = "budget.rs"]
mod budget;

#[global_allocator]
static ALLOC: budget::Counting = budget::Counting;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    budget::within_budget(data, shared::import::snapshot::import);
});
