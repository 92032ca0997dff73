//! The C++ shim's functions (`shim/mt_shim.h`), bound by hand: the one FFI surface of the
//! collector. Keep this file and the header in step.

#![allow(non_camel_case_types)]
#![cfg_attr(not(feature = "tracing"), allow(dead_code))]

pub const MT_MEM: u8 = 1;
pub const MT_OOM: u8 = 2;
pub const MT_OP_ENTER: u8 = 3;
pub const MT_OP_EXIT: u8 = 4;
pub const MT_TENSOR_IN: u8 = 5;
pub const MT_TENSOR_OUT: u8 = 6;
pub const MT_DIMS: u8 = 7;
pub const MT_SCOPE_ENTER: u8 = 8;
pub const MT_SCOPE_EXIT: u8 = 9;
pub const MT_MARK: u8 = 10;

/// `at::RecordScope::BACKWARD_FUNCTION` (carried in `device_type` of `MT_OP_ENTER`).
pub const RECORD_SCOPE_BACKWARD_FUNCTION: i8 = 1;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MtRecord {
    pub ts_ns: u64,
    pub id: u64,
    pub value: i64,
    pub a: u64,
    pub b: u64,
    pub op: u32,
    pub name: u32,
    pub thread: u32,
    pub kind: u8,
    pub device_type: i8,
    pub device_index: i8,
    pub phase: u8,
}

const _: () = assert!(std::mem::size_of::<MtRecord>() == 56);

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MtCounters {
    pub mem_kept: u64,
    pub mem_dropped: u64,
    pub op_kept: u64,
    pub op_dropped: u64,
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    pub buffer_dropped: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MtDeviceStats {
    pub allocated_current: u64,
    pub allocated_peak: u64,
    pub reserved_current: u64,
    pub reserved_peak: u64,
    pub num_alloc_retries: u64,
    pub num_ooms: u64,
}

#[cfg(feature = "tracing")]
use std::os::raw::{c_char, c_int};

#[cfg(feature = "tracing")]
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
