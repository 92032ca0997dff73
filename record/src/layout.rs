//! The shim's records and counters (`record/shim/mt_shim.h`), as Rust reads them: what
//! `collector-capture` drains from the shim linked into it and what traced Python processes
//! stream over their socket. `tests/layout.rs` checks every field's offset and size against
//! the C header (compiled) and the Python package's ctypes.

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
