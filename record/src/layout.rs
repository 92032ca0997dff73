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
/// Follows the `MT_MEM` allocation it names (same thread): `name` is the innermost Python frame of
/// the program's own code, for an allocation made outside every scope.
pub const MT_USER_FRAME: u8 = 11;
/// A line of the program's own code the thread left, outside every scope: `name` its label; the
/// autograd nodes numbered `[value, a)` were made while it was current.
pub const MT_USER_LINE: u8 = 12;
/// Device memory the driver handed out (`value` > 0) or took back, through CUPTI: `id` the address
/// (a `cuMemCreate` handle with bit 63 set), `name` the library that asked, `device_index` the device.
pub const MT_DEVICE_MEM: u8 = 13;

/// Frame kinds of the stream a shim inside a Python process writes (`MT_FRAME_*`): each
/// frame is `u32 kind, u32 length` (little endian) and a payload.
pub const FRAME_HELLO: u32 = 1;
pub const FRAME_RECORDS: u32 = 2;
pub const FRAME_STRINGS: u32 = 3;
pub const FRAME_END: u32 = 4;
/// A JSON note: why a process is not traced, or (the recorder fallback) a complete snapshot
/// file it left in the collector's folder.
pub const FRAME_NOTE: u32 = 5;
/// Holders taking or letting go of storages ([`MtHolder`]s), written by the Python package
/// (and the cuBLAS workspaces the shim names).
pub const FRAME_HOLDERS: u32 = 6;

/// Holder kinds (`MtHolder::kind`), as `shared::model::HolderKind::from_code` reads them.
pub const MT_HOLDER_PARAMETER: u8 = 1;
pub const MT_HOLDER_BUFFER: u8 = 2;
pub const MT_HOLDER_GRADIENT: u8 = 3;
pub const MT_HOLDER_OPTIMIZER_STATE: u8 = 4;
pub const MT_HOLDER_SAVED: u8 = 5;
pub const MT_HOLDER_PENDING_FREE: u8 = 6;
pub const MT_HOLDER_PYTHON: u8 = 7;
/// Kept by a library for its next call: a cuBLAS or cuBLASLt workspace (named by the shim).
pub const MT_HOLDER_CACHE: u8 = 8;

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
    /// `MT_MEM` of a CUDA allocation: the bytes ever requested of its device's caching
    /// allocator after it (0: not known); see `assemble`'s requested sizes.
    pub c: u64,
}

const _: () = assert!(std::mem::size_of::<MtRecord>() == 64);

impl MtRecord {
    /// A record as the shim wrote it (little endian, `size_of::<MtRecord>()` bytes; a shorter
    /// slice reads its missing fields as 0). Offsets are the struct's own.
    pub fn from_le_bytes(b: &[u8]) -> Self {
        use std::mem::offset_of;
        let at = |o: usize, n: usize| b.get(o..o + n).unwrap_or_default();
        let u64_at = |o: usize| u64::from_le_bytes(at(o, 8).try_into().unwrap_or_default());
        let u32_at = |o: usize| u32::from_le_bytes(at(o, 4).try_into().unwrap_or_default());
        let u8_at = |o: usize| b.get(o).copied().unwrap_or_default();
        MtRecord {
            ts_ns: u64_at(offset_of!(MtRecord, ts_ns)),
            id: u64_at(offset_of!(MtRecord, id)),
            value: u64_at(offset_of!(MtRecord, value)) as i64,
            a: u64_at(offset_of!(MtRecord, a)),
            b: u64_at(offset_of!(MtRecord, b)),
            op: u32_at(offset_of!(MtRecord, op)),
            name: u32_at(offset_of!(MtRecord, name)),
            thread: u32_at(offset_of!(MtRecord, thread)),
            kind: u8_at(offset_of!(MtRecord, kind)),
            device_type: u8_at(offset_of!(MtRecord, device_type)) as i8,
            device_index: u8_at(offset_of!(MtRecord, device_index)) as i8,
            phase: u8_at(offset_of!(MtRecord, phase)),
            c: u64_at(offset_of!(MtRecord, c)),
        }
    }
}

/// A holder taking (`take == 1`) or letting go of a tensor's storage, on the shim's clock.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MtHolder {
    pub ts_ns: u64,
    pub ptr: u64,
    pub bytes: u64,
    /// A saved tensor: the sequence number of the autograd node that saved it; a gradient or
    /// optimizer state: when the backward or step that made it began (`mt_now_ns`); -1 otherwise.
    pub seq: i64,
    /// Interned string id (the shim's): parameter, buffer, state key, variable or autograd
    /// node class; 0: none.
    pub name: u32,
    /// Interned string id: the module path; 0: none.
    pub module: u32,
    pub kind: u8,
    pub take: u8,
    pub device_type: i8,
    pub device_index: i8,
    pub unused: u32,
}

const _: () = assert!(std::mem::size_of::<MtHolder>() == 48);

impl MtHolder {
    /// A holder as written (little endian, `size_of::<MtHolder>()` bytes).
    pub fn from_le_bytes(b: &[u8]) -> Self {
        use std::mem::offset_of;
        let at = |o: usize, n: usize| b.get(o..o + n).unwrap_or_default();
        let u64_at = |o: usize| u64::from_le_bytes(at(o, 8).try_into().unwrap_or_default());
        let u32_at = |o: usize| u32::from_le_bytes(at(o, 4).try_into().unwrap_or_default());
        let u8_at = |o: usize| b.get(o).copied().unwrap_or_default();
        MtHolder {
            ts_ns: u64_at(offset_of!(MtHolder, ts_ns)),
            ptr: u64_at(offset_of!(MtHolder, ptr)),
            bytes: u64_at(offset_of!(MtHolder, bytes)),
            seq: u64_at(offset_of!(MtHolder, seq)) as i64,
            name: u32_at(offset_of!(MtHolder, name)),
            module: u32_at(offset_of!(MtHolder, module)),
            kind: u8_at(offset_of!(MtHolder, kind)),
            take: u8_at(offset_of!(MtHolder, take)),
            device_type: u8_at(offset_of!(MtHolder, device_type)) as i8,
            device_index: u8_at(offset_of!(MtHolder, device_index)) as i8,
            unused: u32_at(offset_of!(MtHolder, unused)),
        }
    }
}

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
