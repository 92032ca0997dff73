// Memory Tracer's C++ shim: the one place that talks to libtorch's C++ internals.
// Rust reads its records in record/src/layout.rs and binds its functions in record/src/sys.rs;
// the Python package binds them with ctypes (collector/python/memory_tracer/_shim.py).
// record/tests/layout.rs checks all three against this header. Every function catches C++
// exceptions and reports failure through its return value; none throws. It compiles against
// every supported torch release (record/torch-versions.txt; differences behind
// TORCH_VERSION_* guards in mt_shim.cpp).
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Record kinds (MtRecord.kind).
enum {
  MT_MEM = 1,         // id=ptr, value=signed size (negative: free), a=total allocated, b=total reserved,
                      // c=for a CUDA allocation, the bytes ever requested of its device's caching
                      // allocator (requested_bytes' cumulative count) after it; 0: not known
  MT_OOM = 2,         // value=requested size, a=total allocated, b=total reserved
  MT_OP_ENTER = 3,    // id=op id, value=seq nr, a=forward thread id, b=parent op id, name=op name,
                      // op=the innermost layer scope, device_type=the RecordFunction scope
  MT_OP_EXIT = 4,     // id=op id
  MT_TENSOR_IN = 5,   // follows its op: id=storage ptr, value=storage bytes, a=ndim (b unused);
                      // the dims follow in MT_DIMS records
  MT_TENSOR_OUT = 6,  // follows MT_OP_EXIT: same fields as MT_TENSOR_IN
  MT_DIMS = 7,        // up to 4 dims of the preceding tensor in id, value, a, b
  MT_SCOPE_ENTER = 8, // name=scope name, value=at::sequence_number::peek() (autograd nodes made inside get numbers from here...)
  MT_SCOPE_EXIT = 9,  // name=scope name, value=at::sequence_number::peek() (...to here, exclusive)
  MT_MARK = 10,       // name=mark name, value=user value (iteration index)
  MT_USER_FRAME = 11, // follows the MT_MEM allocation it names on the same thread (mt_py_user_frames):
                      // name = the innermost Python frame of the program's own code when the
                      // allocation was made outside every scope, "file.py:line in function"
  MT_USER_LINE = 12,  // a line of the program's own code the thread left, outside every scope:
                      // name = its label (as MT_USER_FRAME's); the autograd nodes numbered
                      // [value, a) were made while it was current
  MT_DEVICE_MEM = 13, // device memory the driver handed out or took back (mt_ledger_start):
                      // id=address (a cuMemCreate handle with bit 63 set), value=signed bytes,
                      // name=the library that asked ("nccl", "pytorch", "raw_cuda libfoo.so", ...)
                      // or the driver's growth around a call ("kernels pytorch", "streams",
                      // "cuda_graphs"; id has bit 62 set), a=the thread's user line (0: none)
};

typedef struct MtRecord {
  uint64_t ts_ns;   // steady clock, nanoseconds (a TSC stamp until mt_drain converts it)
  uint64_t id;
  int64_t value;
  uint64_t a;
  uint64_t b;
  uint32_t op;      // innermost open op of this thread when recorded (0: none); MT_OP_ENTER:
                    // the innermost layer scope; MT_MEM with capture_ops=2: the autograd node
                    // the engine evaluates on this thread
  uint32_t name;    // interned string id: the op, scope or mark; for every other record, the
                    // innermost scope
  uint32_t thread;  // RecordFunction thread id
  uint8_t kind;
  int8_t device_type;   // c10::DeviceType for MT_MEM / MT_OOM / tensors; MT_OP_ENTER: the
                        // at::RecordScope
  int8_t device_index;
  uint8_t phase;        // the phase set by mt_set_phase when recorded
  uint64_t c;           // MT_MEM: see above; 0 for every other kind
} MtRecord;

typedef struct MtCounters {
  uint64_t mem_kept, mem_dropped, op_kept, op_dropped;
  // Peaks seen by the callback itself, kept even when records are dropped.
  uint64_t peak_allocated, peak_reserved;
  // Records dropped because the undrained buffers were full (streaming, see mt_stream_open).
  uint64_t buffer_dropped;
} MtCounters;

typedef struct MtDeviceStats {
  uint64_t allocated_current, allocated_peak, reserved_current, reserved_peak;
  uint64_t num_alloc_retries, num_ooms;
} MtDeviceStats;

// Clears all buffers and strings; mem and op records beyond the limits are dropped and counted.
// capture_ops = 0 records memory only (no operator callback at all), 1 every operator, 2 only
// the autograd nodes that allocate or free (found at the memory record, no operator callback;
// no tensors; a node's op spans its first to its last memory record), attributed through the
// sequence numbers that scope records carry.
int mt_reset(uint64_t max_mem_records, uint64_t max_op_records, int capture_tensors, int capture_ops);
// Installs the callbacks on the calling thread (memory) and globally (operators).
int mt_start(void);
int mt_stop(void);
int mt_is_active(void);
// Makes the calling thread report its allocations (mt_start does it for its own thread);
// 1: attached, 0: it already had a profiler state, -1: error.
int mt_thread_attach(void);
void mt_set_phase(uint8_t phase);
// 1: attribute operators to TorchScript module hierarchies (costs an allocation per op).
void mt_set_torchscript(int enabled);
// 1: name the allocations that are cuBLAS and cuBLASLt workspaces (holder records of kind
// MT_HOLDER_CACHE, sent by the stream; a backtrace for each allocation of a workspace's size).
void mt_name_workspaces(int enabled);
// Names the custom autograd Function (PyNode) this thread runs the backward of (0: none), for
// capture_ops=2: a PyNode's own name() takes the GIL.
void mt_python_node(uint32_t name);
uint32_t mt_intern(const char* s);
const char* mt_string(uint32_t id, size_t* len);
uint32_t mt_string_count(void);
void mt_scope_enter(uint32_t name);
// Two PyMethodDef entries (METH_O): scope_enter(id) and scope_exit(id), for a Python process
// to make builtin functions of (PyCFunction_NewEx); null, with the error set, outside one.
const void* mt_py_methods(void);
// Two PyMethodDef entries: module_call_setup(module_type, orig, before, after, flags) (METH_FASTCALL),
// which returns a method descriptor to set as nn.Module.__call__, and module_call_live(flag)
// (METH_O); null, with the error set, outside a Python process.
const void* mt_py_module_call(void);
// Four PyMethodDef entries for Inductor's generated code: switch_open(), switch_to(scope),
// switch_close() (one frame per running generated function, entering its statements' module
// scopes) and switch_live(flag); null, with the error set, outside a Python process.
const void* mt_py_switch(void);
void mt_scope_exit(uint32_t name);
// Names each allocation made outside every scope with the line of the program's own code its
// thread is at (an MT_USER_FRAME record after its MT_MEM): a PyMethodDef table of
// user_setup(prefixes, enable, disable), user_off() and the sys.monitoring callbacks
// user_start, user_line, user_return (see mt_shim.cpp). Null outside Python.
const void* mt_py_user_frames(void);
// The device ledger: subscribes to the driver's allocation entry points through the libcupti
// at `cupti_path` (MT_DEVICE_MEM records while tracing). 0 on success, -1 with the error set
// (no such library, another subscriber). mt_ledger_stop unsubscribes.
int mt_ledger_start(const char* cupti_path);
int mt_ledger_stop(void);
// How many driver entry points the ledger watches for the driver's own growth (first
// launches, module loads, streams, CUDA graphs): 0 where it cannot measure it.
int mt_ledger_growth_watched(void);
// Stops watching first launches once at least `min_launches` launches in a row, over at least
// `quiet_ns`, were of functions launched before: 1 when it stopped now, 0 when not (yet or
// already), -1 on an error. Call it outside CUPTI's callbacks (the device sampler does).
int mt_ledger_settle(uint64_t quiet_ns, uint64_t min_launches);
void mt_mark(uint32_t name, int64_t value);
uint64_t mt_now_ns(void);
// Moves up to cap records into out; returns how many. Call until it returns 0.
size_t mt_drain(MtRecord* out, size_t cap);
void mt_counters(MtCounters* out);
// The CUDA caching allocator's own counters (torch.cuda.memory_stats). 0 on success.
int mt_cuda_device_stats(int8_t device, MtDeviceStats* out);
int mt_cuda_reset_peak(int8_t device);
// Releases the CUDA caching allocator's unused cached blocks (torch.cuda.empty_cache).
int mt_cuda_empty_cache(void);
// Copies the last error message; returns its length.
size_t mt_last_error(char* buf, size_t cap);

// Streaming (the shim inside a Python process, see collector/src/pyrun/wire.rs for the frames).
// Frame: u32 kind, u32 payload length (little endian), payload.
enum {
  MT_FRAME_HELLO = 1,    // JSON: who is talking (pid, argv, torch version, rank, start_ns, ...)
  MT_FRAME_RECORDS = 2,  // n * sizeof(MtRecord)
  MT_FRAME_STRINGS = 3,  // repeated: u32 id, u32 length, bytes
  MT_FRAME_END = 4,      // JSON: counters and the allocator's own statistics at the end
  MT_FRAME_NOTE = 5,     // JSON: something the collector should know (a warning)
  MT_FRAME_HOLDERS = 6,  // n * sizeof(MtHolder): the Python package's, and the workspaces the shim names
};

// Holder kinds (MtHolder.kind): what takes or lets go of a tensor's storage.
enum {
  MT_HOLDER_PARAMETER = 1,
  MT_HOLDER_BUFFER = 2,
  MT_HOLDER_GRADIENT = 3,
  MT_HOLDER_OPTIMIZER_STATE = 4,
  MT_HOLDER_SAVED = 5,          // saved for backward by autograd
  MT_HOLDER_PENDING_FREE = 6,
  MT_HOLDER_PYTHON = 7,         // a Python variable or attribute
  MT_HOLDER_CACHE = 8,          // kept by a library for its next call (a cuBLAS workspace)
};

// One holder taking or letting go of a storage (collector/python/memory_tracer/_holders.py;
// record/src/assemble.rs joins it to the allocation at its address at that time).
typedef struct MtHolder {
  uint64_t ts_ns;       // steady clock (mt_now_ns)
  uint64_t ptr;         // the storage's data pointer
  uint64_t bytes;       // the storage's size
  int64_t seq;          // a saved tensor: the autograd sequence number of the node saving it
                        // (its forward operator and module name it); a gradient or optimizer
                        // state: when (mt_now_ns) the backward or step that made it began (held
                        // from its allocation, if after); -1 otherwise
  uint32_t name;        // interned string id: the parameter, buffer, state key, variable, or
                        // the autograd node's class; 0: none
  uint32_t module;      // interned string id: the module path; 0: none
  uint8_t kind;         // MT_HOLDER_*
  uint8_t take;         // 1: takes it, 0: lets go
  int8_t device_type;   // c10::DeviceType
  int8_t device_index;
  uint32_t unused;      // 0
} MtHolder;
// Starts a thread that drains records every `interval_ms` and writes them, with new strings,
// to the connected socket `fd`. Undrained records are bounded by `max_buffered_records`
// (0: unbounded); past it, records are dropped and counted (MtCounters.buffer_dropped).
// A child made by fork() stops recording and never writes to the socket.
int mt_stream_open(int fd, uint32_t interval_ms, uint64_t max_buffered_records);
// Sends one JSON frame (HELLO, END or NOTE) after everything drained so far.
int mt_stream_send(uint32_t kind, const char* data, size_t len);
// Queues `len` bytes of MtHolder records for the stream thread, which sends them after the
// records it drains next (no drain on the caller's thread, as mt_stream_send makes).
int mt_holders_queue(const char* data, size_t len);
// Drains what is left, sends it, stops the thread and closes the socket.
int mt_stream_close(void);

#ifdef __cplusplus
}
#endif
