//! Fuzzes the importer of Memory Tracer's own format (validation of every cross-reference).
#![no_main]

#[path = "budget.rs"]
mod budget;

#[global_allocator]
static ALLOC: budget::Counting = budget::Counting;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    budget::within_budget(data, shared::import::native::import);
});
