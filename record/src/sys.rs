//! The shim's functions (`record/shim/mt_shim.h`), for `collector-capture`, which links the
//! shim's archive (Python processes bind them with ctypes in `memory_tracer/_shim.py`).
//! `tests/layout.rs` checks these signatures against the header's and the ctypes ones.

use crate::layout::{MtCounters, MtDeviceStats, MtRecord};
use std::os::raw::{c_char, c_int};

extern "C" {
    pub fn mt_reset(max_mem_records: u64, max_op_records: u64, capture_tensors: c_int, capture_ops: c_int) -> c_int;
    pub fn mt_start() -> c_int;
    pub fn mt_stop() -> c_int;
    pub fn mt_is_active() -> c_int;
    pub fn mt_set_phase(phase: u8);
    pub fn mt_set_torchscript(enabled: c_int);
    pub fn mt_intern(s: *const c_char) -> u32;
    pub fn mt_string(id: u32, len: *mut usize) -> *const c_char;
    pub fn mt_string_count() -> u32;
    pub fn mt_scope_enter(name: u32);
    pub fn mt_scope_exit(name: u32);
    pub fn mt_mark(name: u32, value: i64);
    pub fn mt_now_ns() -> u64;
    pub fn mt_drain(out: *mut MtRecord, cap: usize) -> usize;
    pub fn mt_counters(out: *mut MtCounters);
    pub fn mt_cuda_device_stats(device: i8, out: *mut MtDeviceStats) -> c_int;
    pub fn mt_cuda_reset_peak(device: i8) -> c_int;
    pub fn mt_cuda_empty_cache() -> c_int;
    pub fn mt_last_error(buf: *mut c_char, cap: usize) -> usize;
}
