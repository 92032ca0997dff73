//! Fuzzes the safe pickle VM: any bytes give a parse or an error, never a panic, and cost
//! memory bounded by their length.
#![no_main]

#[path = "budget.rs"]
mod budget;

#[global_allocator]
static ALLOC: budget::Counting = budget::Counting;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    budget::within_budget(data, shared::import::pickle::parse);
});
