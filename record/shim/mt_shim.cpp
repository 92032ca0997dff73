// Memory Tracer's C++ shim. See mt_shim.h for the contract.
//
// Design: each thread that records gets its own buffer of fixed-size chunks; a record is a
// plain 64-byte struct written in place, so the hot path never allocates (a new chunk every
// 16384 records aside) and never takes a lock another thread holds. Each thread keeps its
// stack of open operators and layer scopes in thread-local vectors reserved up front.
// Readers drain published records (count stored with release ordering) under the buffer's
// mutex, which writers only take to link a new chunk.

#include "mt_shim.h"

#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>
#include <c10/core/Allocator.h>
#include <torch/version.h>
// The device-generic allocator API (c10::getDeviceAllocator) arrived in torch 2.9; built
// against an older torch, the mt_cuda_* functions say so (only collector-capture, which links
// the pinned torch, calls them).
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 9)
#define MT_DEVICE_ALLOCATOR 1
#include <c10/core/CachingDeviceAllocator.h>
#else
#define MT_DEVICE_ALLOCATOR 0
#endif
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/jit/runtime/interpreter.h>
#include <torch/csrc/profiler/orchestration/observer.h>

#include <dlfcn.h>
#include <execinfo.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace {

constexpr size_t kChunkRecords = 16384;

struct Chunk {
  std::atomic<size_t> count{0};
  MtRecord recs[kChunkRecords];
};

struct ThreadBuf {
  std::mutex mu;  // guards `chunks` (linking and unlinking), never held while writing a record
  std::deque<std::unique_ptr<Chunk>> chunks;
  size_t read_pos = 0;  // records of chunks.front() already drained
  uint64_t generation = 0;
};

struct Global {
  std::mutex mu;  // guards bufs and strings
  std::vector<std::shared_ptr<ThreadBuf>> bufs;
  std::deque<std::string> strings;  // id = index + 1; deque keeps addresses stable
  std::unordered_map<std::string, uint32_t> string_ids;
  std::atomic<uint64_t> generation{1};
  std::atomic<bool> active{false};
  std::atomic<uint8_t> phase{3};  // shared::Phase::Other
  std::atomic<bool> torchscript{false};
  bool capture_tensors = true;
  bool capture_ops = true;
  // Only autograd nodes are recorded, and without a RecordFunction callback (whose mere
  // presence makes the autograd engine rebuild its callback lists twice per node): a memory
  // record made while the engine evaluates a node (torch::autograd::get_current_node) names
  // that node, which is recorded as an operator the first time one of its records is made.
  // Forward allocations take their layer from the module scope, backward nodes from the
  // scope whose sequence number range holds theirs (scope records carry
  // at::sequence_number::peek()).
  bool backward_only = false;
  uint64_t max_mem = UINT64_MAX, max_op = UINT64_MAX;
  std::atomic<uint64_t> mem_kept{0}, mem_dropped{0}, op_kept{0}, op_dropped{0};
  std::atomic<uint64_t> peak_allocated{0}, peak_reserved{0};
  // Chunks linked and not yet drained, and the most allowed (0: unbounded).
  // A thread's current chunk never counts against the limit (`recording_threads` of them), so
  // a full buffer always drains and recording resumes.
  std::atomic<uint64_t> live_chunks{0}, max_chunks{0}, buffer_dropped{0}, recording_threads{0};
  std::atomic<uint32_t> next_op{1};
  // Drained chunks kept for reuse: a fresh 900 KB chunk is an mmap, page faults and, when
  // freed, a TLB shootdown on every core.
  std::mutex spare_mu;
  std::vector<std::unique_ptr<Chunk>> spare;
  at::CallbackHandle callback = at::INVALID_CALLBACK_HANDLE;
  std::string last_error;
};

Global& g() {
  static Global* instance = new Global();  // never destroyed: callbacks may run at exit
  return *instance;
}

struct OpFrame {
  uint32_t id;
  bool kept;  // false: dropped by the op limit, so its exit and outputs are not recorded
};

struct ThreadState {
  std::shared_ptr<ThreadBuf> buf;
  Chunk* cur = nullptr;
  uint64_t generation = 0;
  std::vector<OpFrame> ops;
  std::vector<uint32_t> scopes;
  // Backward-only capture: the autograd node this thread's last memory record was made in
  // (compared with its sequence number and forward thread too: a freed node's address comes
  // back), its op id, and the time of its last record (its op ends there).
  const void* node = nullptr;
  uint64_t node_seq = 0, node_fwd_thread = 0, node_last_ns = 0, node_generation = 0;
  uint32_t node_op = 0;
  // The name Python gave the custom autograd Function running on this thread (0: none);
  // a PyNode's own name() takes the GIL, which the allocator's callback must never wait for.
  uint32_t python_node_name = 0;
  // Open nn.Module calls on this thread (the module-call wrapper's depth).
  uint32_t module_depth = 0;
  // Inductor's generated code: one frame per running generated function, holding the scope
  // its switch entered (0: none); see py::switch_to.
  std::vector<uint32_t> switch_frames;
  // The line the innermost frame of the program's own code is at (an interned label, 0: none;
  // mt_py_user_frames keeps it), and the one it was at when the outermost scope opened.
  uint32_t user_line = 0, line_at_scope = 0;
  // Outside every scope: the line current since autograd sequence number line_seq (0: none),
  // in the capture of line_generation (see at_line).
  uint32_t line_label = 0;
  int64_t line_seq = 0;
  uint64_t line_generation = 0;
  uint64_t rf_thread = 0;  // at::RecordFunction::currentThreadId(), once known
  // Node type -> interned name.
  std::unordered_map<const std::type_info*, uint32_t> node_names;
  // name pointer -> (string id, interned copy) cache so interning an op name is a lookup.
  std::unordered_map<const void*, std::pair<uint32_t, const std::string*>> names;
  ThreadState() {
    ops.reserve(256);
    scopes.reserve(64);
    names.reserve(1024);
  }
};

// A pointer, not an object: a thread_local with a constructor costs a guard check on every
// access, and callbacks read it several times per operator.
thread_local ThreadState* tls_state = nullptr;

inline ThreadState* tls_get() {
  ThreadState* p = tls_state;
  if (__builtin_expect(p == nullptr, 0)) p = tls_state = new ThreadState();  // one per thread, kept
  return p;
}
#define tls (*tls_get())

inline uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

// Time. Records are stamped in the hot path with the cheapest clock there is: the CPU's
// time-stamp counter where it is invariant (x86-64 with `constant_tsc` and `nonstop_tsc`: one
// rate, never stopped, the same on every core), else the steady clock's nanoseconds. Reading the
// steady clock cost ~40-100 ns on the H200 machines, the counter ~20. Ticks become the steady
// clock's nanoseconds where they leave the shim (mt_drain, mt_now_ns) through one
// piecewise-linear map that every conversion shares, under one lock. Each conversion at least
// 10 ms after the last check reads a (tick, ns) pair and bridges the map to it from the
// largest tick converted so far (whose value stays), so ticks stamped in between, however long
// the gap, are placed between two readings of the clock; past the pair the measured rate goes
// on. So the map never goes back, a tick converted twice gives the same nanoseconds, and it
// meets the steady clock at every check (where values already given ran ahead of it, it slows
// down instead). MEMORY_TRACER_CLOCK=steady stamps with the steady clock.
namespace clk {

struct Segment {
  uint64_t tick0, ns0;
  double rate;  // ns per tick
  uint64_t at(uint64_t tick) const {
    if (tick >= tick0) return ns0 + static_cast<uint64_t>(static_cast<double>(tick - tick0) * rate);
    const auto back = static_cast<uint64_t>(static_cast<double>(tick0 - tick) * rate);
    return back < ns0 ? ns0 - back : 0;
  }
};

struct Map {
  std::mutex mu;
  bool tsc = false;
  uint64_t tick_first = 0, ns_first = 0;  // the first pair read: the long baseline's start
  uint64_t next_check = 0;                // the tick after which the map is checked again
  uint64_t check_ticks = 0;               // 10 ms in ticks
  uint64_t converted = 0;                 // the largest tick converted so far
  std::deque<Segment> segments;           // the newest last; at most kKept
};
constexpr size_t kKept = 4096;  // 41 s of segments at the densest: older ticks extrapolate

#if defined(__x86_64__)
inline uint64_t tsc() { return __builtin_ia32_rdtsc(); }

// One (tick, ns) pair read close together: the tighter of three readings.
std::pair<uint64_t, uint64_t> pair_now() {
  uint64_t best_gap = UINT64_MAX, tick = 0, ns = 0;
  for (int i = 0; i < 3; ++i) {
    const uint64_t a = tsc(), n = now_ns(), b = tsc();
    if (b - a < best_gap) {
      best_gap = b - a;
      tick = a + (b - a) / 2;
      ns = n;
    }
  }
  return {tick, ns};
}

// Whether the CPU says its counter is invariant (the first "flags" line of /proc/cpuinfo).
bool invariant_tsc() {
  const char* v = std::getenv("MEMORY_TRACER_CLOCK");
  if (v != nullptr && std::strcmp(v, "steady") == 0) return false;
  FILE* f = std::fopen("/proc/cpuinfo", "r");
  if (f == nullptr) return false;
  char line[8192];
  bool found = false;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::strncmp(line, "flags", 5) != 0) continue;
    found = std::strstr(line, " constant_tsc") != nullptr && std::strstr(line, " nonstop_tsc") != nullptr;
    break;
  }
  std::fclose(f);
  return found;
}
#endif

Map& map() {
  static Map* m = [] {
    auto* m = new Map();
#if defined(__x86_64__)
    if (invariant_tsc()) {
      // The first rate from a 200 us baseline (read once, when the shim loads); each check
      // after it measures the rate again from the first pair.
      const auto [t0, n0] = pair_now();
      std::pair<uint64_t, uint64_t> p1;
      do {
        p1 = pair_now();
      } while (p1.second - n0 < 200000);
      const double rate = static_cast<double>(p1.second - n0) / static_cast<double>(p1.first - t0);
      if (p1.first > t0 && rate > 0.01 && rate < 10.0) {  // 0.1-100 GHz, else not a counter to trust
        m->tsc = true;
        m->tick_first = t0;
        m->ns_first = n0;
        m->check_ticks = static_cast<uint64_t>(1e7 / rate);
        m->next_check = p1.first + m->check_ticks;
        m->segments.push_back(Segment{t0, n0, rate});
      }
    }
#endif
    return m;
  }();
  return *m;
}

void push_locked(Map& m, Segment seg) {
  if (m.segments.back().tick0 == seg.tick0) {
    m.segments.back() = seg;  // nothing converted lies past its start: its rate is free
  } else {
    m.segments.push_back(seg);
    if (m.segments.size() > kKept) m.segments.pop_front();
  }
}

// Checks the map against the steady clock when it is due. Caller holds m.mu.
void check_locked(Map& m) {
#if defined(__x86_64__)
  if (tsc() < m.next_check) return;
  const auto [t1, n1] = pair_now();
  const double rate = static_cast<double>(n1 - m.ns_first) / static_cast<double>(t1 - m.tick_first);
  const uint64_t from = std::max(m.converted, m.segments.back().tick0);
  m.next_check = t1 + m.check_ticks;
  if (t1 <= from) return;
  const uint64_t at_from = m.segments.back().at(from);
  if (at_from < n1) {
    // From the last value given to the clock, then on at the measured rate.
    push_locked(m, Segment{from, at_from, static_cast<double>(n1 - at_from) / static_cast<double>(t1 - from)});
    push_locked(m, Segment{t1, n1, rate});
  } else {
    // Values given already ran ahead of the clock: on at half the rate until it is met, 20 ms
    // on at most.
    push_locked(m, Segment{from, at_from, rate * 0.5});
    const uint64_t at_t1 = m.segments.back().at(t1);
    const double ahead = static_cast<double>(at_t1 > n1 ? at_t1 - n1 : 0) / 2e7;
    push_locked(m, Segment{t1, at_t1, rate * std::max(0.5, 1.0 - ahead)});
  }
#else
  (void)m;
#endif
}

// A stamp's nanoseconds. Caller holds m.mu.
uint64_t to_ns_locked(Map& m, uint64_t tick) {
  if (tick > m.converted) m.converted = tick;
  for (auto s = m.segments.rbegin(); s != m.segments.rend(); ++s) {
    if (s->tick0 <= tick) return s->at(tick);
  }
  return m.segments.front().at(tick);
}

// Whether records carry ticks, decided when the shim loads (the first rate is measured then, not
// at a first record inside an allocation); a plain global, so the hot path checks no guard.
const bool kTicks = map().tsc;
inline bool ticks() { return kTicks; }

// What a record is stamped with: a tick or, without the counter, nanoseconds.
inline uint64_t stamp() {
#if defined(__x86_64__)
  if (ticks()) return tsc();
#endif
  return now_ns();
}

// The steady clock's nanoseconds now, on the records' map.
uint64_t now() {
  if (!ticks()) return now_ns();
  Map& m = map();
  std::lock_guard<std::mutex> lock(m.mu);
  check_locked(m);
  return to_ns_locked(m, stamp());
}

// Turns the stamps of `n` drained records into nanoseconds.
void convert(MtRecord* recs, size_t n) {
  if (!ticks() || n == 0) return;
  Map& m = map();
  std::lock_guard<std::mutex> lock(m.mu);
  check_locked(m);
  for (size_t i = 0; i < n; ++i) recs[i].ts_ns = to_ns_locked(m, recs[i].ts_ns);
}

}  // namespace clk

void set_error(const char* what) {
  std::lock_guard<std::mutex> lock(g().mu);
  g().last_error = what;
}

uint32_t intern_locked(const std::string& s) {
  auto& G = g();
  auto it = G.string_ids.find(s);
  if (it != G.string_ids.end()) return it->second;
  G.strings.push_back(s);
  uint32_t id = static_cast<uint32_t>(G.strings.size());
  G.string_ids.emplace(s, id);
  return id;
}

uint32_t intern(const char* s) {
  if (s == nullptr) return 0;
  std::lock_guard<std::mutex> lock(g().mu);
  return intern_locked(std::string(s));
}

// The string interned as `id` (empty for 0).
std::string interned(uint32_t id) {
  std::lock_guard<std::mutex> lock(g().mu);
  return id == 0 || id > g().strings.size() ? std::string() : g().strings[id - 1];
}

// Interns a name through the thread's pointer cache; the strcmp guards against a pointer
// reused for another string.
uint32_t intern_cached(const char* s) {
  if (s == nullptr) return 0;
  auto it = tls.names.find(s);
  if (it != tls.names.end() && std::strcmp(it->second.second->c_str(), s) == 0) {
    return it->second.first;
  }
  uint32_t id;
  const std::string* stored;
  {
    std::lock_guard<std::mutex> lock(g().mu);
    id = intern_locked(std::string(s));
    stored = &g().strings[id - 1];
  }
  tls.names[s] = {id, stored};
  return id;
}

// A slot for one record in this thread's buffer, or null when the undrained buffers are full
// (the record is then dropped and counted).
inline MtRecord* slot(ThreadState& t) {
  auto& G = g();
  uint64_t gen = G.generation.load(std::memory_order_acquire);
  if (t.generation != gen || !t.buf) {
    t.buf = std::make_shared<ThreadBuf>();
    t.buf->generation = gen;
    t.cur = nullptr;
    t.generation = gen;
    std::lock_guard<std::mutex> lock(G.mu);
    G.bufs.push_back(t.buf);
    G.recording_threads.store(G.bufs.size(), std::memory_order_relaxed);
  }
  Chunk* c = t.cur;
  if (c == nullptr || c->count.load(std::memory_order_relaxed) == kChunkRecords) {
    uint64_t max = G.max_chunks.load(std::memory_order_relaxed);
    if (max != 0 && G.live_chunks.load(std::memory_order_relaxed) >=
                        max + G.recording_threads.load(std::memory_order_relaxed)) {
      G.buffer_dropped.fetch_add(1, std::memory_order_relaxed);
      return nullptr;
    }
    G.live_chunks.fetch_add(1, std::memory_order_relaxed);
    std::unique_ptr<Chunk> fresh;
    {
      std::lock_guard<std::mutex> lock(G.spare_mu);
      if (!G.spare.empty()) {
        fresh = std::move(G.spare.back());
        G.spare.pop_back();
      }
    }
    if (fresh) {
      fresh->count.store(0, std::memory_order_relaxed);
    } else {
      fresh = std::make_unique<Chunk>();
    }
    c = fresh.get();
    std::lock_guard<std::mutex> lock(t.buf->mu);
    t.buf->chunks.push_back(std::move(fresh));
    t.cur = c;
  }
  return &c->recs[c->count.load(std::memory_order_relaxed)];
}

inline void publish(ThreadState& t) {
  Chunk* c = t.cur;
  c->count.store(c->count.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

inline void fill_common(ThreadState& t, MtRecord* r, uint8_t kind, uint64_t thread) {
  r->ts_ns = clk::stamp();
  r->kind = kind;
  r->phase = g().phase.load(std::memory_order_relaxed);
  r->thread = static_cast<uint32_t>(thread);
  r->op = t.ops.empty() ? 0 : t.ops.back().id;
  r->name = t.scopes.empty() ? 0 : t.scopes.back();
  r->device_type = -1;
  r->device_index = -1;
  r->id = 0;
  r->value = 0;
  r->a = 0;
  r->b = 0;
  r->c = 0;
}

// The same, for callers that have not looked the thread's state up (each lookup is a call:
// the shim is dlopen-ed).
inline MtRecord* slot() { return slot(tls); }
inline void publish() { publish(tls); }
inline void fill_common(MtRecord* r, uint8_t kind, uint64_t thread) { fill_common(tls, r, kind, thread); }

// RecordFunction's id of this thread, kept in its state.
inline uint64_t thread_id(ThreadState& t) {
  if (__builtin_expect(t.rf_thread == 0, 0)) t.rf_thread = at::RecordFunction::currentThreadId();
  return t.rf_thread;
}

// A tensor record follows its op's record on the same thread and shares its time; only the
// fields `assemble` reads are filled (no clock read, no phase or scope lookups).
void record_tensor(const at::Tensor& t, uint8_t kind, uint32_t thread, uint64_t ts) {
  if (!t.defined() || !t.has_storage()) return;
  const auto& storage = t.storage();
  MtRecord* r = slot();
  if (r == nullptr) return;
  std::memset(r, 0, sizeof(MtRecord));
  r->ts_ns = ts;
  r->kind = kind;
  r->thread = thread;
  r->id = reinterpret_cast<uint64_t>(storage.data());
  r->value = static_cast<int64_t>(storage.nbytes());
  auto sizes = t.sizes();
  r->a = sizes.size();
  const c10::Device device = t.device();
  r->device_type = static_cast<int8_t>(device.type());
  r->device_index = static_cast<int8_t>(device.index());
  publish();
  for (size_t i = 0; i < sizes.size(); i += 4) {
    MtRecord* d = slot();
    if (d == nullptr) return;
    std::memset(d, 0, sizeof(MtRecord));
    d->kind = MT_DIMS;
    d->thread = r->thread;
    int64_t dims[4] = {0, 0, 0, 0};
    for (size_t j = 0; j < 4 && i + j < sizes.size(); ++j) dims[j] = sizes[i + j];
    d->id = static_cast<uint64_t>(dims[0]);
    d->value = dims[1];
    d->a = static_cast<uint64_t>(dims[2]);
    d->b = static_cast<uint64_t>(dims[3]);
    publish();
  }
}

void record_ivalue(const c10::IValue& v, uint8_t kind, uint32_t thread, uint64_t ts) {
  if (v.isTensor()) {
    record_tensor(v.toTensor(), kind, thread, ts);
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList().vec()) record_tensor(t, kind, thread, ts);
  }
}

std::string module_path_from_hierarchy() {
  // Entries look like `TOP(Net)::forward`, `features(Sequential)::forward`, `0(Conv2d)::forward`;
  // keep the instance names.
  std::string path;
  for (const std::string& entry : torch::jit::currentModuleHierarchy()) {
    // `TOP(Net)::forward` is the root, `SELF(Conv2d)::_conv_forward` a method of the module
    // already on the path, `::relu` a free function: none of them adds a path component.
    std::string name = entry.substr(0, entry.find('('));
    if (name.empty() || name == "TOP" || name == "SELF" || name[0] == ':') continue;
    if (!path.empty()) path += '.';
    path += name;
  }
  return path;
}

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  auto& G = g();
  if (!G.active.load(std::memory_order_relaxed)) return nullptr;
  uint32_t id = G.next_op.fetch_add(1, std::memory_order_relaxed);
  if (G.op_kept.load(std::memory_order_relaxed) >= G.max_op) {
    G.op_dropped.fetch_add(1, std::memory_order_relaxed);
    tls.ops.push_back({id, false});
    return nullptr;
  }
  G.op_kept.fetch_add(1, std::memory_order_relaxed);
  uint32_t name = intern_cached(fn.name());
  uint32_t scope = tls.scopes.empty() ? 0 : tls.scopes.back();
  if (G.torchscript.load(std::memory_order_relaxed) &&
      fn.scope() == at::RecordScope::FUNCTION) {
    std::string path = module_path_from_hierarchy();
    if (!path.empty()) {
      std::lock_guard<std::mutex> lock(G.mu);
      scope = intern_locked(path);
    }
  }
  MtRecord* r = slot();
  if (r == nullptr) {
    tls.ops.push_back({id, false});
    return nullptr;
  }
  fill_common(r, MT_OP_ENTER, fn.threadId());
  r->id = id;
  r->value = fn.seqNr();
  r->a = fn.forwardThreadId();
  r->b = tls.ops.empty() ? 0 : tls.ops.back().id;
  r->name = name;
  r->op = scope;  // for operators, `op` carries the layer scope (the name slot holds the op name)
  r->device_type = static_cast<int8_t>(fn.scope());
  publish();
  tls.ops.push_back({id, true});
  if (G.capture_tensors) {
    const uint32_t thread = r->thread;
    const uint64_t ts = r->ts_ns;
    for (const c10::IValue& v : fn.inputs()) record_ivalue(v, MT_TENSOR_IN, thread, ts);
  }
  return nullptr;
}

std::unique_ptr<at::ObserverContext> on_enter_guarded(const at::RecordFunction& fn) {
  try {
    return on_enter(fn);
  } catch (...) {
    return nullptr;  // never let a tracing failure break the model
  }
}

void on_exit(const at::RecordFunction& fn, at::ObserverContext*) {
  auto& G = g();
  if (tls.ops.empty()) return;  // entered before tracing started
  OpFrame frame = tls.ops.back();
  tls.ops.pop_back();
  if (!frame.kept || !G.active.load(std::memory_order_relaxed)) return;
  uint32_t id = frame.id;
  MtRecord* r = slot();
  if (r == nullptr) return;
  fill_common(r, MT_OP_EXIT, fn.threadId());
  r->id = id;
  publish();
  if (G.capture_tensors) {
    const uint32_t thread = r->thread;
    const uint64_t ts = r->ts_ns;
    for (const c10::IValue& v : fn.outputs()) record_ivalue(v, MT_TENSOR_OUT, thread, ts);
  }
}

void on_exit_guarded(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  try {
    on_exit(fn, ctx);
  } catch (...) {
  }
}

void update_peak(std::atomic<uint64_t>& peak, uint64_t v) {
  uint64_t cur = peak.load(std::memory_order_relaxed);
  while (v > cur && !peak.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

// The interned name of an autograd node. A PyNode (a custom torch.autograd.Function) takes
// the name Python set for this thread; its name() would take the GIL.
uint32_t node_name(const torch::autograd::Node& node) {
  ThreadState& t = tls;
  const std::type_info* type = &typeid(node);
  if (std::strcmp(type->name(), "N5torch8autograd6PyNodeE") == 0) {
    return t.python_node_name != 0 ? t.python_node_name : intern_cached("PyNode");
  }
  auto it = t.node_names.find(type);
  if (it != t.node_names.end()) return it->second;
  uint32_t id;
  {
    const std::string name = node.name();
    std::lock_guard<std::mutex> lock(g().mu);
    id = intern_locked(name);
  }
  t.node_names.emplace(type, id);
  return id;
}

// The op id of the autograd node this thread evaluates (0: none), writing its MT_OP_ENTER
// record (and the previous node's MT_OP_EXIT, at that node's last record) when it changes.
uint32_t current_node_op(ThreadState& t, uint64_t thread) {
  auto& G = g();
  const uint64_t generation = G.generation.load(std::memory_order_acquire);
  if (t.node_generation != generation) {  // a new capture (mt_reset): its op ids start over
    t.node = nullptr;
    t.node_op = 0;
    t.node_generation = generation;
  }
  auto current = torch::autograd::get_current_node();
  const torch::autograd::Node* node = current.get();
  if (node == nullptr) return 0;
  const uint64_t seq = node->sequence_nr(), fwd_thread = node->thread_id();
  if (node == t.node && seq == t.node_seq && fwd_thread == t.node_fwd_thread) return t.node_op;
  if (t.node_op != 0) {
    MtRecord* e = slot(t);
    if (e != nullptr) {
      fill_common(t, e, MT_OP_EXIT, thread);
      e->ts_ns = t.node_last_ns;
      e->id = t.node_op;
      publish(t);
    }
  }
  t.node = node;
  t.node_seq = seq;
  t.node_fwd_thread = fwd_thread;
  t.node_op = 0;
  if (G.op_kept.load(std::memory_order_relaxed) >= G.max_op) {
    G.op_dropped.fetch_add(1, std::memory_order_relaxed);
    return 0;
  }
  MtRecord* r = slot(t);
  if (r == nullptr) return 0;
  G.op_kept.fetch_add(1, std::memory_order_relaxed);
  const uint32_t id = G.next_op.fetch_add(1, std::memory_order_relaxed);
  const uint32_t name = node_name(*node);
  fill_common(t, r, MT_OP_ENTER, thread);
  r->id = id;
  r->value = static_cast<int64_t>(seq);
  r->a = fwd_thread;
  r->b = 0;
  r->name = name;
  r->op = t.scopes.empty() ? 0 : t.scopes.back();  // the layer scope, as in on_enter
  r->device_type = static_cast<int8_t>(at::RecordScope::BACKWARD_FUNCTION);
  publish(t);
  t.node_op = id;
  t.node_last_ns = r->ts_ns;
  return id;
}

// The bytes ever requested of the CUDA caching allocator of `device` (the cumulative count of
// its `requested_bytes` statistic), read inside its report of an allocation: PyTorch adds the
// request (`orig_size`, before rounding) to that count just before it reports the block, under
// the allocator's recursive mutex, which this thread already holds, and nothing else adds to
// it, so two reports' difference is the later one's request. 0 where not known (torch before
// 2.9, another allocator, an error).
#if MT_DEVICE_ALLOCATOR
// The CUDA allocator as a DeviceAllocator: c10::getDeviceAllocator's dynamic_cast (a type-name
// comparison across libraries) done once per allocator PyTorch has registered, not per
// allocation; nullptr for one that is no DeviceAllocator (never a throw per allocation). A
// swap at run time (CUDAPluggableAllocator) is a new pointer and is cast again.
c10::DeviceAllocator* cuda_device_allocator() {
  static std::atomic<c10::Allocator*> raw{nullptr};
  static std::atomic<c10::DeviceAllocator*> cast{nullptr};
  c10::Allocator* now = c10::GetAllocator(c10::DeviceType::CUDA);
  if (now != raw.load(std::memory_order_acquire)) {
    cast.store(dynamic_cast<c10::DeviceAllocator*>(now), std::memory_order_relaxed);
    raw.store(now, std::memory_order_release);
  }
  return cast.load(std::memory_order_relaxed);
}
#endif

uint64_t cuda_requested_so_far(c10::Device device) {
#if MT_DEVICE_ALLOCATOR
  if (device.type() != c10::DeviceType::CUDA) return 0;
  try {
    auto* alloc = cuda_device_allocator();
    if (alloc == nullptr || !alloc->initialized()) return 0;
    const auto stats = alloc->getDeviceStats(device.index());
    const size_t agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    const int64_t so_far = stats.requested_bytes[agg].allocated;
    return so_far > 0 ? static_cast<uint64_t>(so_far) : 0;
  } catch (...) {
    return 0;
  }
#else
  (void)device;
  return 0;
#endif
}

// mt_py_user_frames: allocations outside every scope are named by their thread's user_line.
std::atomic<bool> user_frames_on{false};

// Writes one MT_MEM or MT_OOM record (`value` is the signed size or the requested size).
void record_memory(uint8_t kind, void* ptr, int64_t value, size_t total_allocated,
                   size_t total_reserved, c10::Device device) {
  ThreadState& t = tls;
  const uint64_t thread = thread_id(t);
  const uint32_t node_op = g().backward_only ? current_node_op(t, thread) : 0;
  const uint32_t frame = kind == MT_MEM && value > 0 && node_op == 0 && t.scopes.empty() &&
                                 user_frames_on.load(std::memory_order_relaxed)
                             ? t.user_line
                             : 0;
  MtRecord* r = slot(t);
  if (r == nullptr) return;
  fill_common(t, r, kind, thread);
  if (node_op != 0) {
    r->op = node_op;
    t.node_last_ns = r->ts_ns;
  }
  r->id = reinterpret_cast<uint64_t>(ptr);
  r->value = value;
  r->a = total_allocated;
  r->b = total_reserved;
  r->device_type = static_cast<int8_t>(device.type());
  r->device_index = static_cast<int8_t>(device.index());
  if (kind == MT_MEM && value > 0) r->c = cuda_requested_so_far(device);
  publish(t);
  if (frame != 0) {
    MtRecord* f = slot(t);
    if (f == nullptr) return;
    std::memset(f, 0, sizeof(MtRecord));
    f->ts_ns = r->ts_ns;
    f->kind = MT_USER_FRAME;
    f->thread = static_cast<uint32_t>(thread);
    f->name = frame;
    publish(t);
  }
}

// The device ledger (mt_ledger_start): device memory the driver hands out to anyone in the
// process, seen through a CUPTI subscription to the driver's allocation entry points (the
// libcupti of torch's own CUDA wheels, loaded at run time: the shim links no CUDA). Each
// allocation is named by the library that asked for it, the first frame of its stack outside
// CUPTI, the driver, the runtime and this shim (a backtrace: the driver allocates rarely), and
// written as an MT_DEVICE_MEM record; its free finds it by address or handle.
namespace cupti {
using Result = int;
using Subscriber = void*;
using CallbackFunc = void (*)(void*, int, uint32_t, const void*);
constexpr int kDriverDomain = 1;  // CUPTI_CB_DOMAIN_DRIVER_API
constexpr int kApiEnter = 0;      // CUPTI_API_ENTER
constexpr int kApiExit = 1;       // CUPTI_API_EXIT
// CUPTI_DRIVER_TRACE_CBID_* (cupti_driver_cbid.h; the numbers never change)
enum : uint32_t {
  kMemAlloc = 243, kMemAllocPitch = 244, kMemFree = 245, kMemAllocManaged = 371, kMemCreate = 549,
  kMemRelease = 550, kMemAllocAsync = 598, kMemFreeAsync = 600, kMemAllocFromPoolAsync = 611,
};
struct CallbackData {  // CUpti_CallbackData
  int callback_site;
  const char* function_name;
  const void* params;
  void* return_value;
  const char* symbol_name;
  void* context;
  uint32_t context_uid;
  uint64_t* correlation_data;
  uint32_t correlation_id;
};
struct AllocParams { uint64_t* dptr; size_t bytes; };                 // cuMemAlloc_v2, Async, FromPool, Managed
struct PitchParams { uint64_t* dptr; size_t* pitch; size_t width; size_t height; unsigned element; };
struct FreeParams { uint64_t dptr; };                                  // cuMemFree_v2, cuMemFreeAsync
struct CreateParams { uint64_t* handle; size_t size; const int32_t* prop; unsigned long long flags; };
struct ReleaseParams { uint64_t handle; };
// What a driver call the ledger watches for growth is (Ledger::growth_kind): a launch, a
// lookup of a kernel or function (the runtime makes one per launch; with lazy loading the
// first one loads its module: `kGetter1` is told apart by its second parameter, `kGetter2` by
// its second and third), a module load, a stream, a graph.
enum : uint8_t { kNoGrowth = 0, kLaunch, kLaunchEx, kGetter1, kGetter2, kModule, kStream, kGraph };
inline bool per_launch(uint8_t k) { return k == kLaunch || k == kLaunchEx || k == kGetter1 || k == kGetter2; }
}  // namespace cupti

struct Ledger {
  std::mutex mu;  // guards everything below but the function pointers
  void* lib = nullptr;
  cupti::Result (*subscribe)(cupti::Subscriber*, cupti::CallbackFunc, void*) = nullptr;
  cupti::Result (*unsubscribe)(cupti::Subscriber) = nullptr;
  cupti::Result (*enable)(uint32_t, cupti::Subscriber, int, uint32_t) = nullptr;
  int (*ctx_get_device)(int*) = nullptr;  // cuCtxGetDevice
  cupti::Subscriber subscriber = nullptr;
  struct Block {
    uint64_t bytes;
    uint32_t source;
    int8_t device;
  };
  // (address, or handle with the top bit set) -> what it is
  std::unordered_map<uint64_t, Block> live;
  std::unordered_map<void*, uint32_t> frames;  // a return address -> its library's label
  // Growth the allocation calls do not show: the driver's memory for kernels loaded lazily at
  // their first launch, modules, streams and CUDA graphs, measured as the device's free memory
  // before and after such a call less what the allocation calls took meanwhile.
  int (*mem_get_info)(size_t*, size_t*) = nullptr;  // cuMemGetInfo_v2
  uint8_t growth_kind[2048] = {};                   // driver cbid -> cupti::k*
  std::atomic<int64_t> tracked{0};                  // net bytes of the allocations seen
  std::unordered_set<uint64_t> launched;            // launches and lookups seen once (guarded by mu)
  uint64_t next_growth = 0;
  // First launches and lookups are watched until the program has launched no function for the
  // first time for a while (mt_ledger_settle): each watched call costs a callback, and the
  // runtime makes a launch and a lookup per kernel it runs. Settled stays settled for the
  // process (its kernels stay loaded).
  bool launches_settled = false;
  uint64_t last_new_launch_ns = 0, launches_since_new = 0;
  uint32_t nccl_label = UINT32_MAX;  // intern("nccl"), once the ledger starts
};

// NCCL's communicators, told apart through NCCL's profiler plugin interface (NCCL 2.25+ reads
// NCCL_PROFILER_PLUGIN, which the Python capture points at this library when the ledger
// starts): `init` hears each communicator made (its name, hash, ranks), `startEvent` each
// group, collective and point-to-point call with its communicator. The NCCL allocations the
// ledger sees go to the communicator that last became current on any thread: NCCL's proxy
// threads allocate a communicator's buffers while the calling thread waits on them.
std::atomic<uint32_t> nccl_current{0};  // the label (`nccl <communicator>`) of the current one
struct NcclComm {
  uint32_t label;
};

// A driver call being measured on this thread (enter to exit).
struct GrowthCall {
  uint32_t correlation;
  size_t free;
  int64_t tracked;
};
thread_local GrowthCall tls_growth[4];
thread_local int tls_growth_depth = 0;

Ledger& ledger() {
  static Ledger* instance = new Ledger();  // never destroyed: the driver may call at exit
  return *instance;
}

// What the library at `path` is, for the ledger.
std::string source_of_library(const char* path) {
  const char* base = std::strrchr(path, '/');
  base = base != nullptr ? base + 1 : path;
  const std::string b(base);
  auto has = [&](const char* s) { return b.find(s) != std::string::npos; };
  if (has("libc10_cuda") || has("libtorch_cuda")) return "pytorch";
  if (has("libnccl")) return "nccl";
  if (has("libcublasLt")) return "cublaslt";
  if (has("libcublas")) return "cublas";
  if (has("libcudnn")) return "cudnn";
  if (has("libtriton") || has("cuda_utils")) return "triton";
  return "raw_cuda " + b;
}

// The label of the library that made the driver call this callback reports (0: unknown).
uint32_t ledger_source(Ledger& L) {
  constexpr uint32_t kPassThrough = UINT32_MAX;  // CUPTI, the driver, the runtime, this shim
  void* frames[48];
  const int n = backtrace(frames, 48);
  for (int i = 1; i < n; ++i) {
    // dladdr's symbol lookup scans a library's symbol table: each return address is classified
    // once (the caller holds L.mu).
    auto it = L.frames.find(frames[i]);
    if (it == L.frames.end()) {
      Dl_info info;
      uint32_t id = kPassThrough;
      if (dladdr(frames[i], &info) != 0 && info.dli_fname != nullptr) {
        const char* f = info.dli_fname;
        const bool ours = std::strstr(f, "libcupti") || std::strstr(f, "libcuda.so") || std::strstr(f, "libcudart") ||
                          std::strstr(f, "mt_shim") || std::strstr(f, "memory_tracer") || std::strstr(f, "libc.so");
        if (!ours) id = intern(source_of_library(f).c_str());
      }
      it = L.frames.emplace(frames[i], id).first;
    }
    if (it->second != kPassThrough) return it->second;
  }
  return intern("raw_cuda (no library on the stack)");
}

// `a`: the line of the program's own code the thread is at, for what it makes (0: none).
void ledger_record(uint64_t key, int64_t bytes, uint32_t source, int8_t device) {
  auto& G = g();
  if (!G.active.load(std::memory_order_relaxed)) return;
  ThreadState& t = tls;
  MtRecord* r = slot(t);
  if (r == nullptr) return;
  fill_common(t, r, MT_DEVICE_MEM, thread_id(t));
  r->id = key;
  r->value = bytes;
  r->name = source;
  r->a = bytes > 0 && user_frames_on.load(std::memory_order_relaxed) ? t.user_line : 0;
  r->device_type = static_cast<int8_t>(c10::DeviceType::CUDA);
  r->device_index = device;
  publish(t);
}

// The label of growth of `kind`, by the library that made the call.
uint32_t growth_source(Ledger& L, uint8_t kind) {
  if (kind == cupti::kStream) return intern("streams");
  if (kind == cupti::kGraph) return intern("cuda_graphs");
  std::string library = interned(ledger_source(L));
  // Inductor launches Triton's kernels through its static launcher in libtorch_python.
  if (library.find("libtorch_python") != std::string::npos) library = "triton";
  return intern(("kernels " + library).c_str());
}

// A watched call: the device's free memory at its entry (a launch only for a function never
// launched before); at its exit, what the device lost beyond the allocations seen meanwhile is
// recorded as a block of the call's kind, never released (modules stay loaded).
void ledger_growth(Ledger& L, const cupti::CallbackData* d, uint8_t kind) {
  if (L.mem_get_info == nullptr) return;
  if (d->callback_site == cupti::kApiEnter) {
    if (cupti::per_launch(kind)) {
      if (d->params == nullptr) return;
      const auto* p = static_cast<const uint64_t*>(d->params);
      // What is launched or looked up: the function (its launch config's second field for
      // cuLaunchKernelEx), or the handle and name looked up, with the kind so no two collide.
      uint64_t key = kind == cupti::kLaunchEx ? p[1] : kind == cupti::kLaunch ? p[0] : p[1];
      if (kind == cupti::kGetter2) key = key * 0x9E3779B97F4A7C15ull ^ p[2];
      key = key * 31 + kind;
      std::lock_guard<std::mutex> lock(L.mu);
      if (!L.launched.insert(key).second) {
        ++L.launches_since_new;
        return;
      }
      L.last_new_launch_ns = now_ns();
      L.launches_since_new = 0;
    }
    if (tls_growth_depth >= 4) return;
    size_t free = 0, total = 0;
    if (L.mem_get_info(&free, &total) != 0) return;
    tls_growth[tls_growth_depth++] = GrowthCall{d->correlation_id, free, L.tracked.load()};
    return;
  }
  if (tls_growth_depth == 0 || tls_growth[tls_growth_depth - 1].correlation != d->correlation_id) return;
  const GrowthCall before = tls_growth[--tls_growth_depth];
  if (d->return_value != nullptr && *static_cast<const int*>(d->return_value) != 0) return;
  size_t free = 0, total = 0;
  if (L.mem_get_info(&free, &total) != 0) return;
  const int64_t grew = static_cast<int64_t>(before.free) - static_cast<int64_t>(free) - (L.tracked.load() - before.tracked);
  if (grew <= 0) return;
  int device = -1;
  if (L.ctx_get_device != nullptr && L.ctx_get_device(&device) != 0) device = -1;
  std::lock_guard<std::mutex> lock(L.mu);
  const uint64_t key = (1ull << 62) | L.next_growth++;
  ledger_record(key, grew, growth_source(L, kind), static_cast<int8_t>(device));
}

void ledger_callback(void*, int domain, uint32_t cbid, const void* data) {
  if (domain != cupti::kDriverDomain || data == nullptr) return;
  const auto* d = static_cast<const cupti::CallbackData*>(data);
  Ledger& watched = ledger();
  if (cbid < sizeof(watched.growth_kind) && watched.growth_kind[cbid] != cupti::kNoGrowth) {
    try {
      ledger_growth(watched, d, watched.growth_kind[cbid]);
    } catch (...) {
    }
    return;
  }
  if (d->callback_site != cupti::kApiExit || d->params == nullptr) return;
  if (d->return_value != nullptr && *static_cast<const int*>(d->return_value) != 0) return;  // failed: nothing made
  try {
    Ledger& L = ledger();
    constexpr uint64_t kHandle = 1ull << 63;
    uint64_t key = 0, bytes = 0;
    int device = -1;
    bool alloc = true;
    switch (cbid) {
      case cupti::kMemAlloc:
      case cupti::kMemAllocAsync:
      case cupti::kMemAllocFromPoolAsync:
      case cupti::kMemAllocManaged: {
        const auto* p = static_cast<const cupti::AllocParams*>(d->params);
        if (p->dptr == nullptr) return;
        key = *p->dptr;
        bytes = p->bytes;
        break;
      }
      case cupti::kMemAllocPitch: {
        const auto* p = static_cast<const cupti::PitchParams*>(d->params);
        if (p->dptr == nullptr || p->pitch == nullptr) return;
        key = *p->dptr;
        bytes = static_cast<uint64_t>(*p->pitch) * p->height;
        break;
      }
      case cupti::kMemCreate: {
        const auto* p = static_cast<const cupti::CreateParams*>(d->params);
        if (p->handle == nullptr) return;
        key = *p->handle | kHandle;
        bytes = p->size;
        // CUmemAllocationProp: type, requestedHandleTypes, location {type, id}
        if (p->prop != nullptr && p->prop[2] == 1 /* CU_MEM_LOCATION_TYPE_DEVICE */) device = p->prop[3];
        break;
      }
      case cupti::kMemFree:
      case cupti::kMemFreeAsync:
        key = static_cast<const cupti::FreeParams*>(d->params)->dptr;
        alloc = false;
        break;
      case cupti::kMemRelease:
        key = static_cast<const cupti::ReleaseParams*>(d->params)->handle | kHandle;
        alloc = false;
        break;
      default:
        return;
    }
    std::lock_guard<std::mutex> lock(L.mu);
    if (alloc) {
      if (device < 0 && L.ctx_get_device != nullptr) {
        int dev = -1;
        if (L.ctx_get_device(&dev) == 0) device = dev;
      }
      uint32_t source = ledger_source(L);
      if (source == L.nccl_label) {
        const uint32_t comm = nccl_current.load(std::memory_order_relaxed);
        if (comm != 0) source = comm;
      }
      L.tracked += static_cast<int64_t>(bytes);
      L.live[key] = Ledger::Block{bytes, source, static_cast<int8_t>(device)};
      ledger_record(key, static_cast<int64_t>(bytes), source, static_cast<int8_t>(device));
    } else {
      auto it = L.live.find(key);
      if (it == L.live.end()) return;  // made before the subscription
      const Ledger::Block b = it->second;
      L.live.erase(it);
      L.tracked -= static_cast<int64_t>(b.bytes);
      ledger_record(key, -static_cast<int64_t>(b.bytes), b.source, b.device);
    }
  } catch (...) {
  }
}

// Which driver calls the ledger measures for growth, by name (cuptiGetCallbackName: the
// numbers of newer entry points differ between CUDA versions); without it, the numbers of
// cupti_driver_cbid.h for the calls every CUDA since 11 has.
void growth_kinds(Ledger& L, void* lib) {
  using NameFn = cupti::Result (*)(int, uint32_t, const char**);
  auto name_of = reinterpret_cast<NameFn>(dlsym(lib, "cuptiGetCallbackName"));
  auto kind_of = [](const char* n) -> uint8_t {
    auto is = [n](const char* s) { return std::strcmp(n, s) == 0; };
    auto starts = [n](const char* s) { return std::strncmp(n, s, std::strlen(s)) == 0; };
    if (is("cuLaunchKernelEx") || is("cuLaunchKernelEx_ptsz")) return cupti::kLaunchEx;
    if (is("cuLaunchKernel") || is("cuLaunchKernel_ptsz") || is("cuLaunchCooperativeKernel") || is("cuLaunchCooperativeKernel_ptsz")) {
      return cupti::kLaunch;
    }
    if (is("cuKernelGetFunction") || is("cuLibraryGetModule")) return cupti::kGetter1;
    if (is("cuModuleGetFunction") || is("cuLibraryGetKernel")) return cupti::kGetter2;
    if (starts("cuModuleLoad") || starts("cuLibraryLoad")) return cupti::kModule;
    if (starts("cuStreamCreate")) return cupti::kStream;
    if (starts("cuGraphInstantiate") || starts("cuGraphUpload")) return cupti::kGraph;
    return cupti::kNoGrowth;
  };
  bool named = false;
  if (name_of != nullptr) {
    for (uint32_t cbid = 1; cbid < sizeof(L.growth_kind); ++cbid) {
      const char* n = nullptr;
      if (name_of(cupti::kDriverDomain, cbid, &n) != 0 || n == nullptr) continue;
      L.growth_kind[cbid] = kind_of(n);
      named = true;
    }
  }
  if (named) return;
  for (uint32_t cbid : {307u, 442u, 477u, 478u}) L.growth_kind[cbid] = cupti::kLaunch;
  for (uint32_t cbid : {652u, 653u}) L.growth_kind[cbid] = cupti::kLaunchEx;
  for (uint32_t cbid : {18u, 19u, 20u, 21u}) L.growth_kind[cbid] = cupti::kModule;
  L.growth_kind[23] = cupti::kGetter2;  // cuModuleGetFunction
  L.growth_kind[124] = cupti::kStream;
  for (uint32_t cbid : {513u, 580u, 581u, 643u, 656u}) L.growth_kind[cbid] = cupti::kGraph;
}

// Library workspaces (mt_name_workspaces): a cuBLAS handle's workspace, and cuBLASLt's, are
// allocated through the caching allocator by the first matmul of each (thread, stream) and kept
// for every later one; no tensor holds them. An allocation is one when its size lies within a
// megabyte above the size PyTorch picks for them (at::cuda::getChosenWorkspaceSize and
// getCUDABlasLtWorkspaceSize, read from libtorch_cuda at the first CUDA allocation, when CUDA
// is up; calling them allocates nothing) and its stack passes through PyTorch's cuBLAS handle
// pool. Only those few allocations pay for a backtrace. Each one found becomes a holder
// record (MT_HOLDER_CACHE) that the stream thread sends after the records, as it does the
// Python side's (mt_holders_queue).
struct Workspaces {
  std::atomic<bool> on{false};
  std::once_flag sizes_once;
  std::vector<uint64_t> sizes;  // rounded up to the allocator's 512 bytes
  uint32_t cublas = 0, cublaslt = 0;
  std::mutex mu;  // guards pending and frames
  std::vector<MtHolder> pending;
  std::unordered_map<void*, uint32_t> frames;  // a return address -> what it lies in
};

Workspaces& workspaces() {
  static Workspaces* instance = new Workspaces();
  return *instance;
}

void workspace_sizes(Workspaces& W) {
  using SizeFn = size_t (*)();
  void* lib = dlopen("libtorch_cuda.so", RTLD_LAZY | RTLD_NOLOAD);
  for (const char* name : {"_ZN2at4cuda22getChosenWorkspaceSizeEv", "_ZN2at4cuda26getCUDABlasLtWorkspaceSizeEv"}) {
    void* f = lib != nullptr ? dlsym(lib, name) : nullptr;
    if (f == nullptr) f = dlsym(RTLD_DEFAULT, name);
    if (f == nullptr) continue;
    uint64_t size = reinterpret_cast<SizeFn>(f)();
    if (size > 0) W.sizes.push_back((size + 511) / 512 * 512);
  }
  W.cublas = intern("cuBLAS workspace");
  W.cublaslt = intern("cuBLASLt workspace");
}

// What a return address lies in: a cuBLAS or cuBLASLt workspace's getter, or neither (0).
// dladdr's symbol lookup scans a library's symbol table (libtorch_cuda's holds hundreds of
// thousands): each address is looked up once and remembered (`frames`, under `mu`).
uint32_t workspace_frame(Workspaces& W, void* frame) {
  {
    std::lock_guard<std::mutex> lock(W.mu);
    auto it = W.frames.find(frame);
    if (it != W.frames.end()) return it->second;
  }
  uint32_t what = 0;
  Dl_info info;
  if (dladdr(frame, &info) != 0 && info.dli_sname != nullptr && std::strncmp(info.dli_sname, "_ZN2at4cuda", 11) == 0) {
    const char* name = info.dli_sname;
    if (std::strstr(name, "BlasLtWorkspace") != nullptr) {
      what = W.cublaslt;
    } else if (std::strstr(name, "getCurrentCUDABlasHandle") != nullptr || std::strstr(name, "handle_stream_to_workspace") != nullptr) {
      what = W.cublas;
    }
  }
  std::lock_guard<std::mutex> lock(W.mu);
  W.frames.emplace(frame, what);
  return what;
}

// Which workspace the calling thread is allocating (0: none), from its stack.
uint32_t workspace_on_stack(Workspaces& W) {
  void* frames[32];
  int n = backtrace(frames, 32);
  for (int i = 0; i < n; ++i) {
    const uint32_t what = workspace_frame(W, frames[i]);
    if (what != 0) return what;
  }
  return 0;
}

void note_workspace(void* ptr, int64_t alloc_size, c10::Device device) {
  Workspaces& W = workspaces();
  std::call_once(W.sizes_once, [&] { workspace_sizes(W); });
  uint64_t size = static_cast<uint64_t>(alloc_size);
  // A cached block a little larger than asked for is handed out whole (it is split only when
  // more than 1 MiB would be left).
  bool candidate = false;
  for (uint64_t s : W.sizes) candidate |= size >= s && size <= s + (uint64_t{1} << 20);
  if (!candidate) return;
  uint32_t name = workspace_on_stack(W);
  if (name == 0) return;
  MtHolder h{};
  h.ts_ns = clk::now();
  h.ptr = reinterpret_cast<uint64_t>(ptr);
  h.bytes = size;
  h.seq = -1;
  h.name = name;
  h.kind = MT_HOLDER_CACHE;
  h.take = 1;
  h.device_type = static_cast<int8_t>(device.type());
  h.device_index = static_cast<int8_t>(device.index());
  std::lock_guard<std::mutex> lock(W.mu);
  W.pending.push_back(h);
}

// libtorch reads whatever sits in the PROFILER_STATE slot as a ProfilerStateBase (for example
// `profilerEnabled()`, which torch.autograd.Function.apply and torch.compile's runtime call),
// so the reporter must be one: a profiler state whose config is Disabled, so PyTorch sees no
// profiler running, that takes memory reports.
struct Reporter final : public torch::profiler::impl::ProfilerStateBase {
  Reporter()
      : torch::profiler::impl::ProfilerStateBase(
            torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::Disabled)) {}

  torch::profiler::impl::ActiveProfilerType profilerType() override {
    return torch::profiler::impl::ActiveProfilerType::NONE;
  }

  void reportMemoryUsage(void* ptr, int64_t alloc_size, size_t total_allocated,
                         size_t total_reserved, c10::Device device) override {
    auto& G = g();
    if (!G.active.load(std::memory_order_relaxed)) return;
    update_peak(G.peak_allocated, total_allocated);
    update_peak(G.peak_reserved, total_reserved);
    if (G.mem_kept.load(std::memory_order_relaxed) >= G.max_mem) {
      G.mem_dropped.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    G.mem_kept.fetch_add(1, std::memory_order_relaxed);
    try {
      record_memory(MT_MEM, ptr, alloc_size, total_allocated, total_reserved, device);
      if (alloc_size > 0 && device.is_cuda() && workspaces().on.load(std::memory_order_relaxed)) {
        note_workspace(ptr, alloc_size, device);
      }
    } catch (...) {
    }
  }

  void reportOutOfMemory(int64_t alloc_size, size_t total_allocated, size_t total_reserved,
                         c10::Device device) override {
    if (!g().active.load(std::memory_order_relaxed)) return;
    try {
      record_memory(MT_OOM, nullptr, alloc_size, total_allocated, total_reserved, device);
    } catch (...) {
    }
  }

  bool memoryProfilingEnabled() const override {
    return g().active.load(std::memory_order_relaxed);
  }
};

// The one reporter every thread that records holds (it does nothing while tracing is off).
const std::shared_ptr<Reporter>& reporter() {
  static auto* instance = new std::shared_ptr<Reporter>(std::make_shared<Reporter>());
  return *instance;
}

// The streaming side (a shim loaded into a Python process): one thread drains the buffers
// and writes frames to the collector's socket. Writers of records never wait for it.
struct Stream {
  std::mutex write_mu;  // one frame at a time on the socket
  int fd = -1;
  bool broken = false;  // the collector went away: recording stopped, nothing more is sent
  bool forked_child = false;
  uint32_t strings_sent = 0;
  std::vector<MtRecord> buf;
  std::thread thread;
  std::mutex cv_mu;
  std::condition_variable cv;
  bool stop = false;
  uint32_t interval_ms = 20;
  bool atfork_registered = false;
};

Stream& stream() {
  static Stream* instance = new Stream();  // never destroyed: the thread may outlive statics
  return *instance;
}

bool write_all(int fd, const void* data, size_t len) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

bool send_frame_locked(Stream& S, uint32_t kind, const void* data, size_t len) {
  if (S.broken || S.fd < 0) return false;
  uint32_t header[2] = {kind, static_cast<uint32_t>(len)};
  if (!write_all(S.fd, header, sizeof header) || (len > 0 && !write_all(S.fd, data, len))) {
    S.broken = true;
    g().active.store(false);  // nobody listens: stop recording rather than buffer forever
    return false;
  }
  return true;
}

// Sends new strings, then every published record. Caller holds S.write_mu.
void flush_locked(Stream& S) {
  if (S.broken || S.fd < 0) return;
  std::string payload;
  {
    std::lock_guard<std::mutex> lock(g().mu);
    uint32_t total = static_cast<uint32_t>(g().strings.size());
    for (uint32_t id = S.strings_sent + 1; id <= total; ++id) {
      const std::string& str = g().strings[id - 1];
      uint32_t head[2] = {id, static_cast<uint32_t>(str.size())};
      payload.append(reinterpret_cast<const char*>(head), sizeof head);
      payload.append(str);
    }
    S.strings_sent = total;
  }
  if (!payload.empty() && !send_frame_locked(S, MT_FRAME_STRINGS, payload.data(), payload.size())) return;
  if (S.buf.empty()) S.buf.resize(kChunkRecords);
  for (;;) {
    size_t n = mt_drain(S.buf.data(), S.buf.size());
    if (n == 0) break;
    if (!send_frame_locked(S, MT_FRAME_RECORDS, S.buf.data(), n * sizeof(MtRecord))) return;
  }
  std::vector<MtHolder> found;
  {
    std::lock_guard<std::mutex> lock(workspaces().mu);
    found.swap(workspaces().pending);
  }
  if (!found.empty()) send_frame_locked(S, MT_FRAME_HOLDERS, found.data(), found.size() * sizeof(MtHolder));
}

void stream_loop() {
  Stream& S = stream();
  for (;;) {
    bool stopping;
    {
      std::unique_lock<std::mutex> lk(S.cv_mu);
      S.cv.wait_for(lk, std::chrono::milliseconds(S.interval_ms), [&] { return S.stop; });
      stopping = S.stop;
    }
    {
      std::lock_guard<std::mutex> lock(S.write_mu);
      flush_locked(S);
    }
    if (stopping) return;
  }
}

void atfork_prepare() {
  g().mu.lock();
  clk::map().mu.lock();
}
void atfork_parent() {
  clk::map().mu.unlock();
  g().mu.unlock();
}
void atfork_child() {
  clk::map().mu.unlock();
  g().mu.unlock();
  // A forked child (a DataLoader worker) records nothing and never writes to the parent's
  // socket; closing its copy lets the collector see the parent's end of stream.
  g().active.store(false);
  Stream& S = stream();
  S.forked_child = true;
  S.broken = true;
  if (S.fd >= 0) ::close(S.fd);
  S.fd = -1;
}

// NCCL's profiler plugin interface: the types of NCCL's profiler_v4.h and profiler_v5.h this
// library uses (ncclResult_t is an int, 0 success; event descriptors are not read).
namespace nccl {
using Logger = void (*)(int, unsigned long, const char*, int, const char*, ...);
constexpr int kGroup = 1 << 0, kColl = 1 << 1, kP2p = 1 << 2;                      // v4
constexpr int kGroupApi = 1 << 8, kCollApi = 1 << 9, kP2pApi = 1 << 10;            // v5
int init(void** context, int* mask, const char* name, uint64_t hash, int nranks, int rank, int events) {
  if (context != nullptr) *context = nullptr;
  if (mask != nullptr) *mask = 0;
  // A process whose ledger is not running (a child that inherited the variable) hears nothing.
  if (ledger().subscriber == nullptr || context == nullptr) return 0;
  char label[160];
  if (name != nullptr && *name != '\0') {
    std::snprintf(label, sizeof label, "nccl %.100s (rank %d of %d)", name, rank, nranks);
  } else {
    std::snprintf(label, sizeof label, "nccl communicator %016llx (rank %d of %d)", static_cast<unsigned long long>(hash), rank, nranks);
  }
  auto* c = new NcclComm{intern(label)};
  *context = c;
  if (mask != nullptr) *mask = events;
  nccl_current.store(c->label, std::memory_order_relaxed);
  return 0;
}
int init_v4(void** context, int* mask, const char* name, uint64_t hash, int, int nranks, int rank, Logger) {
  return init(context, mask, name, hash, nranks, rank, kGroup | kColl | kP2p);
}
int init_v5(void** context, uint64_t hash, int* mask, const char* name, int, int nranks, int rank, Logger) {
  return init(context, mask, name, hash, nranks, rank, kGroupApi | kCollApi | kP2pApi);
}
int start_event(void* context, void** handle, void*) {
  if (handle != nullptr) *handle = nullptr;  // no stop events wanted
  if (context != nullptr) nccl_current.store(static_cast<NcclComm*>(context)->label, std::memory_order_relaxed);
  return 0;
}
int stop_event(void*) { return 0; }
int record_state(void*, int, void*) { return 0; }
int finalize(void* context) {
  if (context == nullptr) return 0;
  auto* c = static_cast<NcclComm*>(context);
  uint32_t expected = c->label;
  nccl_current.compare_exchange_strong(expected, 0);
  delete c;
  return 0;
}
}  // namespace nccl

}  // namespace

extern "C" {

// NCCL's profiler plugin symbols (NCCL tries v5, then v4).
struct MtNcclProfilerV4 {
  const char* name;
  int (*init)(void**, int*, const char*, uint64_t, int, int, int, nccl::Logger);
  int (*start_event)(void*, void**, void*);
  int (*stop_event)(void*);
  int (*record_state)(void*, int, void*);
  int (*finalize)(void*);
};
struct MtNcclProfilerV5 {
  const char* name;
  int (*init)(void**, uint64_t, int*, const char*, int, int, int, nccl::Logger);
  int (*start_event)(void*, void**, void*);
  int (*stop_event)(void*);
  int (*record_state)(void*, int, void*);
  int (*finalize)(void*);
};
__attribute__((visibility("default"))) MtNcclProfilerV4 ncclProfiler_v4 = {
    "memory-tracer", nccl::init_v4, nccl::start_event, nccl::stop_event, nccl::record_state, nccl::finalize};
__attribute__((visibility("default"))) MtNcclProfilerV5 ncclProfiler_v5 = {
    "memory-tracer", nccl::init_v5, nccl::start_event, nccl::stop_event, nccl::record_state, nccl::finalize};

int mt_reset(uint64_t max_mem_records, uint64_t max_op_records, int capture_tensors, int capture_ops) {
  auto& G = g();
  if (G.active.load()) {
    set_error("mt_reset while tracing is active");
    return -1;
  }
  std::lock_guard<std::mutex> lock(G.mu);
  G.bufs.clear();
  G.live_chunks = 0;
  G.buffer_dropped = 0;
  G.recording_threads = 0;
  G.generation.fetch_add(1, std::memory_order_acq_rel);
  G.max_mem = max_mem_records;
  G.max_op = max_op_records;
  G.capture_tensors = capture_tensors != 0;
  G.capture_ops = capture_ops != 0;
  G.backward_only = capture_ops == 2;
  if (G.backward_only) G.capture_tensors = false;
  G.mem_kept = 0;
  G.mem_dropped = 0;
  G.op_kept = 0;
  G.op_dropped = 0;
  G.peak_allocated = 0;
  G.peak_reserved = 0;
  G.next_op = 1;
  G.phase = 3;
  return 0;
}

int mt_start(void) {
  auto& G = g();
  try {
    if (G.active.load()) return 0;
    tls.ops.clear();
    tls.scopes.clear();
    c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE, reporter());
    if (G.capture_ops && !G.backward_only && G.callback == at::INVALID_CALLBACK_HANDLE) {
      auto cb = at::RecordFunctionCallback(on_enter_guarded, on_exit_guarded)
                    .needsInputs(G.capture_tensors)
                    .needsOutputs(G.capture_tensors)
                    .needsIds(true);
      G.callback = at::addGlobalCallback(std::move(cb));
    }
    G.active.store(true);
    return 0;
  } catch (const std::exception& e) {
    set_error(e.what());
    return -1;
  }
}

int mt_stop(void) {
  auto& G = g();
  try {
    if (!G.active.load()) return 0;
    G.active.store(false);
    if (G.callback != at::INVALID_CALLBACK_HANDLE) {
      at::removeCallback(G.callback);
      G.callback = at::INVALID_CALLBACK_HANDLE;
    }
    c10::ThreadLocalDebugInfo::_pop(c10::DebugInfoKind::PROFILER_STATE);
    return 0;
  } catch (const std::exception& e) {
    set_error(e.what());
    return -1;
  }
}

int mt_is_active(void) { return g().active.load() ? 1 : 0; }

int mt_thread_attach(void) {
  try {
    // A thread started by the program (not by libtorch, which hands its threads the starting
    // thread's debug info) reports its allocations too; a thread that already has a profiler
    // state (ours, or PyTorch's profiler) keeps it.
    if (c10::ThreadLocalDebugInfo::get(c10::DebugInfoKind::PROFILER_STATE) != nullptr) return 0;
    c10::ThreadLocalDebugInfo::_push(c10::DebugInfoKind::PROFILER_STATE, reporter());
    return 1;
  } catch (const std::exception& e) {
    set_error(e.what());
    return -1;
  }
}

void mt_set_phase(uint8_t phase) { g().phase.store(phase, std::memory_order_relaxed); }

void mt_python_node(uint32_t name) { tls.python_node_name = name; }

void mt_set_torchscript(int enabled) { g().torchscript.store(enabled != 0); }

void mt_name_workspaces(int enabled) { workspaces().on.store(enabled != 0); }

int mt_ledger_start(const char* cupti_path) {
  try {
    Ledger& L = ledger();
    std::lock_guard<std::mutex> lock(L.mu);
    if (L.subscriber != nullptr) return 0;
    if (L.lib == nullptr) {
      if (cupti_path == nullptr || *cupti_path == '\0') {
        set_error("no libcupti given");
        return -1;
      }
      void* lib = dlopen(cupti_path, RTLD_NOW | RTLD_LOCAL);
      if (lib == nullptr) {
        const char* e = dlerror();
        set_error((std::string("cannot load ") + cupti_path + ": " + (e != nullptr ? e : "?")).c_str());
        return -1;
      }
      L.subscribe = reinterpret_cast<decltype(L.subscribe)>(dlsym(lib, "cuptiSubscribe"));
      L.unsubscribe = reinterpret_cast<decltype(L.unsubscribe)>(dlsym(lib, "cuptiUnsubscribe"));
      L.enable = reinterpret_cast<decltype(L.enable)>(dlsym(lib, "cuptiEnableCallback"));
      if (L.subscribe == nullptr || L.unsubscribe == nullptr || L.enable == nullptr) {
        set_error((std::string(cupti_path) + " lacks cuptiSubscribe, cuptiUnsubscribe or cuptiEnableCallback").c_str());
        return -1;
      }
      L.lib = lib;
      void* cuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
      if (cuda == nullptr) cuda = dlopen("libcuda.so.1", RTLD_LAZY);
      if (cuda != nullptr) {
        L.ctx_get_device = reinterpret_cast<int (*)(int*)>(dlsym(cuda, "cuCtxGetDevice"));
        L.mem_get_info = reinterpret_cast<int (*)(size_t*, size_t*)>(dlsym(cuda, "cuMemGetInfo_v2"));
      }
      growth_kinds(L, lib);
      L.nccl_label = intern("nccl");
    }
    cupti::Subscriber sub = nullptr;
    const int r = L.subscribe(&sub, &ledger_callback, nullptr);
    if (r != 0) {
      // 39: CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED (a profiler holds CUPTI)
      set_error(r == 39 ? "another CUPTI subscriber (a profiler) is active" : ("cuptiSubscribe failed with CUPTI error " + std::to_string(r)).c_str());
      return -1;
    }
    for (uint32_t cbid : {cupti::kMemAlloc, cupti::kMemAllocPitch, cupti::kMemFree, cupti::kMemAllocManaged, cupti::kMemCreate,
                          cupti::kMemRelease, cupti::kMemAllocAsync, cupti::kMemFreeAsync, cupti::kMemAllocFromPoolAsync}) {
      L.enable(1, sub, cupti::kDriverDomain, cbid);
    }
    for (uint32_t cbid = 0; cbid < sizeof(L.growth_kind); ++cbid) {
      const uint8_t k = L.growth_kind[cbid];
      if (k != cupti::kNoGrowth && !(cupti::per_launch(k) && L.launches_settled)) L.enable(1, sub, cupti::kDriverDomain, cbid);
    }
    L.subscriber = sub;
    return 0;
  } catch (...) {
    set_error("the ledger could not start");
    return -1;
  }
}

int mt_ledger_settle(uint64_t quiet_ns, uint64_t min_launches) {
  try {
    Ledger& L = ledger();
    std::lock_guard<std::mutex> lock(L.mu);
    if (L.subscriber == nullptr || L.launches_settled) return 0;
    if (L.launches_since_new < min_launches || now_ns() - L.last_new_launch_ns < quiet_ns) return 0;
    for (uint32_t cbid = 0; cbid < sizeof(L.growth_kind); ++cbid) {
      const uint8_t k = L.growth_kind[cbid];
      if (cupti::per_launch(k)) L.enable(0, L.subscriber, cupti::kDriverDomain, cbid);
    }
    L.launches_settled = true;
    return 1;
  } catch (...) {
    return -1;
  }
}

int mt_ledger_growth_watched(void) {
  Ledger& L = ledger();
  if (L.mem_get_info == nullptr) return 0;
  int n = 0;
  for (uint8_t k : L.growth_kind) n += k != cupti::kNoGrowth;
  return n;
}

int mt_ledger_stop(void) {
  try {
    Ledger& L = ledger();
    std::lock_guard<std::mutex> lock(L.mu);
    if (L.subscriber == nullptr) return 0;
    const int r = L.unsubscribe(L.subscriber);
    L.subscriber = nullptr;
    L.live.clear();
    return r == 0 ? 0 : -1;
  } catch (...) {
    return -1;
  }
}


uint32_t mt_intern(const char* s) {
  try {
    return intern(s);
  } catch (...) {
    return 0;
  }
}

const char* mt_string(uint32_t id, size_t* len) {
  auto& G = g();
  std::lock_guard<std::mutex> lock(G.mu);
  if (id == 0 || id > G.strings.size()) {
    *len = 0;
    return nullptr;
  }
  const std::string& s = G.strings[id - 1];
  *len = s.size();
  return s.data();
}

uint32_t mt_string_count(void) {
  std::lock_guard<std::mutex> lock(g().mu);
  return static_cast<uint32_t>(g().strings.size());
}

void mt_scope_enter(uint32_t name) {
  try {
    ThreadState& t = tls;
    // Lines inside a module move user_line; its caller's line comes back when it returns.
    if (t.scopes.empty()) t.line_at_scope = t.user_line;
    if (g().active.load(std::memory_order_relaxed)) {
      MtRecord* r = slot(t);
      if (r == nullptr) {
        t.scopes.push_back(name);
        return;
      }
      fill_common(t, r, MT_SCOPE_ENTER, thread_id(t));
      r->name = name;
      r->value = static_cast<int64_t>(at::sequence_number::peek());
      publish(t);
    }
    t.scopes.push_back(name);
  } catch (...) {
  }
}

void mt_scope_exit(uint32_t name) {
  try {
    ThreadState& t = tls;
    if (!t.scopes.empty()) {
      t.scopes.pop_back();
      if (t.scopes.empty()) t.user_line = t.line_at_scope;
    }
    if (g().active.load(std::memory_order_relaxed)) {
      MtRecord* r = slot(t);
      if (r == nullptr) return;
      fill_common(t, r, MT_SCOPE_EXIT, thread_id(t));
      r->name = name;
      r->value = static_cast<int64_t>(at::sequence_number::peek());
      publish(t);
    }
  } catch (...) {
  }
}

// Scope enter/exit as Python builtin functions (METH_O, taking the scope id): a call costs
// what calling a builtin does, a fraction of a ctypes call. The shim is loaded into a Python
// process but links no libpython: the few C API functions it needs are found at run time, and
// the method table is the stable ABI's PyMethodDef.
extern "C++" {
namespace py {
struct MethodDef {
  const char* name;
  void* meth;
  int flags;
  const char* doc;
};
static_assert(sizeof(MethodDef) == 4 * sizeof(void*), "PyMethodDef is four pointers wide");
constexpr int kMethO = 0x0008;
constexpr int kMethFastcall = 0x0080;
constexpr int kMethKeywords = 0x0002;
using Object = void;
using Ssize = intptr_t;
unsigned long (*as_unsigned_long)(Object*) = nullptr;
unsigned long long (*as_unsigned_long_long)(Object*) = nullptr;
Object* (*from_long)(long) = nullptr;
Object* (*err_occurred)() = nullptr;
void (*err_fetch)(Object**, Object**, Object**) = nullptr;
void (*err_clear)() = nullptr;
void (*err_restore)(Object*, Object*, Object*) = nullptr;
void (*err_set_string)(Object*, const char*) = nullptr;
Object* type_error = nullptr;
void (*incref)(Object*) = nullptr;
void (*decref)(Object*) = nullptr;
int (*is_true)(Object*) = nullptr;
Ssize (*tuple_size)(Object*) = nullptr;
Object* (*vectorcall)(Object*, Object* const*, size_t, Object*) = nullptr;
Object* (*vectorcall_method)(Object*, Object* const*, size_t, Object*) = nullptr;
Object* (*get_attr)(Object*, Object*) = nullptr;
Object* (*intern)(const char*) = nullptr;
Object* (*descr_new_method)(Object*, MethodDef*) = nullptr;
Object* (*weakref_new)(Object*, Object*) = nullptr;
Object* (*weakref_get_object)(Object*) = nullptr;  // borrowed (before 3.13's PyWeakref_GetRef)
int (*weakref_get_ref)(Object*, Object**) = nullptr;  // 3.13+
Object* none = nullptr;

template <typename F>
bool find(F& out, const char* name) {
  out = reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
  return out != nullptr;
}

// Finds the C API functions the builtins use (the shim links no libpython); false, with the
// error set, outside a Python process.
bool load() {
  static int state = 0;  // 0: not tried, 1: found, -1: missing (under the GIL: no race)
  if (state == 0) {
    Object** type_error_ptr = nullptr;
    bool ok = find(as_unsigned_long, "PyLong_AsUnsignedLong") && find(as_unsigned_long_long, "PyLong_AsUnsignedLongLong") &&
              find(from_long, "PyLong_FromLong") && find(err_occurred, "PyErr_Occurred") && find(err_fetch, "PyErr_Fetch") && find(err_clear, "PyErr_Clear") &&
              find(err_restore, "PyErr_Restore") && find(err_set_string, "PyErr_SetString") &&
              find(type_error_ptr, "PyExc_TypeError") && find(incref, "Py_IncRef") && find(decref, "Py_DecRef") &&
              find(is_true, "PyObject_IsTrue") && find(tuple_size, "PyTuple_Size") && find(vectorcall, "PyObject_Vectorcall") &&
              find(vectorcall_method, "PyObject_VectorcallMethod") && find(get_attr, "PyObject_GetAttr") &&
              find(intern, "PyUnicode_InternFromString") && find(descr_new_method, "PyDescr_NewMethod") &&
              find(weakref_new, "PyWeakref_NewRef") && find(none, "_Py_NoneStruct");
    find(weakref_get_ref, "PyWeakref_GetRef");
    if (weakref_get_ref == nullptr) ok = ok && find(weakref_get_object, "PyWeakref_GetObject");
    if (ok) type_error = *type_error_ptr;
    state = ok ? 1 : -1;
  }
  if (state < 0) set_error("the Python C API is not in this process");
  return state > 0;
}

Object* done() {
  incref(none);
  return none;
}

Object* scope_enter(Object*, Object* arg) {
  const unsigned long id = as_unsigned_long(arg);
  if (id == static_cast<unsigned long>(-1) && err_occurred() != nullptr) return nullptr;
  mt_scope_enter(static_cast<uint32_t>(id));
  return done();
}

Object* scope_exit(Object*, Object* arg) {
  const unsigned long id = as_unsigned_long(arg);
  if (id == static_cast<unsigned long>(-1) && err_occurred() != nullptr) return nullptr;
  mt_scope_exit(static_cast<uint32_t>(id));
  return done();
}

// The line of the program's own code each thread is at (mt_py_user_frames), kept by
// sys.monitoring (Python 3.12+) calling these builtins: PY_START once per code object (its
// own code gets LINE and PY_RETURN events, the rest is disabled), LINE in the program's own
// code, PY_RETURN from it outside every scope. Allocations happen with the GIL released, where
// no frame can be read: the thread's last line is what they read. Everything here runs under
// the GIL, which guards the caches.
void set(Object*& slot, Object* value);

struct UserFrames {
  Object* (*get_frame)() = nullptr;          // borrowed
  Object* (*frame_code)(Object*) = nullptr;  // new reference
  Object* (*frame_back)(Object*) = nullptr;  // new reference
  int (*frame_line)(Object*) = nullptr;
  const char* (*utf8)(Object*) = nullptr;
  Object* co_filename = nullptr;
  Object* co_name = nullptr;
  Object* enable = nullptr;   // enable(code): its LINE and PY_RETURN events
  Object* disable = nullptr;  // sys.monitoring.DISABLE
  std::vector<std::string> skip, library;
  enum Kind : uint8_t { kSkip, kUser, kLibrary };
  struct Code {
    Kind kind;
    std::string file, function;  // the file's base name
  };
  // Each code object seen, kept alive so that its address stays its own.
  std::unordered_map<Object*, uint32_t> code_index;
  std::vector<Code> codes;
  std::unordered_map<uint64_t, uint32_t> labels;  // (code index, line) -> interned label
};
UserFrames& uf = *new UserFrames();  // never destroyed: events may come at exit

bool load_user_frames() {
  if (uf.get_frame != nullptr) return true;
  const bool ok = find(uf.get_frame, "PyEval_GetFrame") && find(uf.frame_code, "PyFrame_GetCode") &&
                  find(uf.frame_back, "PyFrame_GetBack") && find(uf.frame_line, "PyFrame_GetLineNumber") &&
                  find(uf.utf8, "PyUnicode_AsUTF8");
  if (!ok) {
    uf.get_frame = nullptr;
    err_set_string(type_error, "memory-tracer: this Python lacks the frame functions");
  }
  return ok;
}

bool attr_utf8(Object* code, Object* name, std::string& out) {
  Object* v = get_attr(code, name);
  if (v == nullptr) return false;
  const char* s = uf.utf8(v);
  if (s != nullptr) out = s;
  decref(v);
  return s != nullptr;
}

// The length of the longest of `prefixes` that `file` starts with (0: none).
size_t longest_prefix(const std::string& file, const std::vector<std::string>& prefixes) {
  size_t best = 0;
  for (const auto& p : prefixes) {
    if (p.size() > best && file.compare(0, p.size(), p) == 0) best = p.size();
  }
  return best;
}

uint32_t code_of(Object* code) {
  auto it = uf.code_index.find(code);
  if (it != uf.code_index.end()) return it->second;
  UserFrames::Code c{UserFrames::kSkip, {}, {}};
  std::string file;
  if (attr_utf8(code, uf.co_filename, file) && attr_utf8(code, uf.co_name, c.function)) {
    // The longest prefix decides: torch lies inside site-packages, which may lie inside the
    // standard library's folder.
    const size_t skip = longest_prefix(file, uf.skip), library = longest_prefix(file, uf.library);
    c.kind = skip == 0 && library == 0 ? UserFrames::kUser : skip >= library ? UserFrames::kSkip : UserFrames::kLibrary;
    const size_t slash = file.find_last_of('/');
    c.file = slash == std::string::npos ? file : file.substr(slash + 1);
  } else {
    err_clear();
  }
  incref(code);
  const uint32_t index = static_cast<uint32_t>(uf.codes.size());
  uf.codes.push_back(std::move(c));
  uf.code_index.emplace(code, index);
  return index;
}

uint32_t label_of(uint32_t code, int line) {
  const uint64_t key = (static_cast<uint64_t>(code) << 32) | static_cast<uint32_t>(line);
  auto it = uf.labels.find(key);
  if (it != uf.labels.end()) return it->second;
  const auto& c = uf.codes[code];
  const std::string label = c.file + ":" + std::to_string(line) + " in " + c.function;
  const uint32_t id = ::intern(label.c_str());
  uf.labels.emplace(key, id);
  return id;
}

// The innermost frame of the program's own code above `frame` (a new reference, released
// here), else the innermost library frame: its label, or 0.
uint32_t label_above(Object* frame) {
  uint32_t found = 0;
  int64_t library = -1;  // (code << 32 | line) of the innermost library frame
  for (int depth = 0; frame != nullptr && depth < 256; ++depth) {
    Object* code = uf.frame_code(frame);
    if (code == nullptr) break;
    const uint32_t index = code_of(code);
    decref(code);
    const auto kind = uf.codes[index].kind;
    if (kind == UserFrames::kUser) {
      found = label_of(index, uf.frame_line(frame));
      break;
    }
    if (kind == UserFrames::kLibrary && library < 0) {
      library = (static_cast<int64_t>(index) << 32) | static_cast<uint32_t>(uf.frame_line(frame));
    }
    Object* back = uf.frame_back(frame);
    decref(frame);
    frame = back;
  }
  if (frame != nullptr) decref(frame);
  if (err_occurred() != nullptr) err_clear();
  if (found == 0 && library >= 0) {
    found = label_of(static_cast<uint32_t>(library >> 32), static_cast<int>(library & 0xffffffff));
  }
  return found;
}

// The thread is at `label` now. Outside every scope, while tracing, the line it leaves is
// recorded if autograd nodes were numbered while it was current (MT_USER_LINE: the numbers
// [first, end) are its), so a loop that makes no nodes records nothing.
void at_line(uint32_t label) {
  ThreadState& t = tls;
  t.user_line = label;
  if (!t.scopes.empty()) return;
  auto& G = g();
  if (!G.active.load(std::memory_order_relaxed)) return;
  const uint64_t generation = G.generation.load(std::memory_order_relaxed);
  const int64_t now = static_cast<int64_t>(at::sequence_number::peek());
  if (generation != t.line_generation) {  // a new capture: nothing of the last one is open
    t.line_label = 0;
    t.line_generation = generation;
  }
  if (t.line_label != 0 && now != t.line_seq) {
    MtRecord* r = slot(t);
    if (r != nullptr) {
      fill_common(t, r, MT_USER_LINE, thread_id(t));
      r->name = t.line_label;
      r->value = t.line_seq;
      r->a = static_cast<uint64_t>(now);
      publish(t);
    }
  }
  t.line_label = label;
  t.line_seq = now;
}

Object* user_start(Object*, Object* const* args, Ssize nargs) {
  if (nargs < 1) return done();
  const uint32_t index = code_of(args[0]);
  if (uf.codes[index].kind == UserFrames::kUser && uf.enable != nullptr) {
    Object* r = vectorcall(uf.enable, args, 1, nullptr);
    if (r == nullptr) return nullptr;
    decref(r);
  }
  incref(uf.disable);
  return uf.disable;
}

Object* user_line(Object*, Object* const* args, Ssize nargs) {
  if (nargs < 2) return done();
  const long line = static_cast<long>(as_unsigned_long(args[1]));
  if (line == -1 && err_occurred() != nullptr) {
    err_clear();
    return done();
  }
  // A line run inside a module is named by the module: its event is turned off for good (a
  // helper called from both sides is then named, outside modules, by its caller's line).
  if (!tls.scopes.empty()) {
    incref(uf.disable);
    return uf.disable;
  }
  at_line(label_of(code_of(args[0]), static_cast<int>(line)));
  return done();
}

// A function of the program's own returns: outside every scope, its caller's line is the
// thread's again (inside one, the scope's exit restores it).
Object* user_return(Object*, Object* const* args, Ssize nargs) {
  ThreadState& t = tls;
  if (!t.scopes.empty()) return done();
  Object* frame = uf.get_frame();  // the returning frame, still running
  Object* back = frame != nullptr ? uf.frame_back(frame) : nullptr;
  at_line(label_above(back));
  return done();
}

// user_setup(prefixes, enable, disable): `prefixes` is newline-separated lines "s<prefix>"
// (files never named: torch, this package, the standard library) and "l<prefix>" (library
// files, named only when no frame of the program's own is on the stack).
Object* user_setup(Object*, Object* const* args, Ssize nargs) {
  if (nargs != 3) {
    err_set_string(type_error, "user_setup(prefixes, enable, disable)");
    return nullptr;
  }
  if (!load_user_frames()) return nullptr;
  const char* text = uf.utf8(args[0]);
  if (text == nullptr) return nullptr;
  if (uf.co_filename == nullptr) {
    uf.co_filename = intern("co_filename");
    uf.co_name = intern("co_name");
    if (uf.co_filename == nullptr || uf.co_name == nullptr) return nullptr;
  }
  set(uf.enable, args[1]);
  set(uf.disable, args[2]);
  uf.skip.clear();
  uf.library.clear();
  for (const char* p = text; *p != '\0';) {
    const char* end = std::strchr(p, '\n');
    const size_t n = end != nullptr ? static_cast<size_t>(end - p) : std::strlen(p);
    if (n > 1 && (p[0] == 's' || p[0] == 'l')) (p[0] == 's' ? uf.skip : uf.library).emplace_back(p + 1, n - 1);
    p += n;
    if (*p == '\n') ++p;
  }
  // Codes classified under other lists are classified again.
  for (auto& [code, index] : uf.code_index) decref(code);
  uf.code_index.clear();
  uf.codes.clear();
  uf.labels.clear();
  // The line this thread is at now (its frames started before the events were on).
  Object* frame = uf.get_frame();
  if (frame != nullptr) incref(frame);
  user_frames_on.store(true);
  at_line(label_above(frame));
  return done();
}

// user_off(): allocations outside scopes stay unattributed from here on.
Object* user_off(Object*, Object* const*, Ssize) {
  user_frames_on.store(false);
  return done();
}

MethodDef user_frame_methods[] = {
    {"user_setup", reinterpret_cast<void*>(&user_setup), kMethFastcall, "user_setup(prefixes, enable, disable)"},
    {"user_off", reinterpret_cast<void*>(&user_off), kMethFastcall, "user_off()"},
    {"user_start", reinterpret_cast<void*>(&user_start), kMethFastcall, "sys.monitoring PY_START"},
    {"user_line", reinterpret_cast<void*>(&user_line), kMethFastcall, "sys.monitoring LINE"},
    {"user_return", reinterpret_cast<void*>(&user_return), kMethFastcall, "sys.monitoring PY_RETURN"},
};

MethodDef methods[] = {
    {"scope_enter", reinterpret_cast<void*>(&scope_enter), kMethO, "mt_scope_enter(id)"},
    {"scope_exit", reinterpret_cast<void*>(&scope_exit), kMethO, "mt_scope_exit(id)"},
};

// The scope switches Inductor's generated code calls (_compiled.py's Switch, as builtins: a
// compiled ResNet-50 step makes hundreds, each a Python method call before): switch_open() at
// a generated function's start, switch_to(scope) before each statement whose module differs
// from the last one's, switch_close() in its `finally`. A scope is entered only while the
// capture's hooks are live (switch_live(flag)); leaving one always balances its enter.
constexpr int kMethNoargs = 0x0004;
std::atomic<bool> switch_live{false};

Object* switch_open(Object*, Object*) {
  tls.switch_frames.push_back(0);
  return done();
}

Object* switch_to(Object*, Object* arg) {
  const unsigned long id = as_unsigned_long(arg);
  if (id == static_cast<unsigned long>(-1) && err_occurred() != nullptr) return nullptr;
  ThreadState& t = tls;
  if (t.switch_frames.empty()) return done();
  const uint32_t scope = static_cast<uint32_t>(id);
  const uint32_t top = t.switch_frames.back();
  if (top == scope) return done();
  if (top != 0) mt_scope_exit(top);
  const bool enter = scope != 0 && switch_live.load(std::memory_order_relaxed);
  if (enter) mt_scope_enter(scope);
  t.switch_frames.back() = enter ? scope : 0;
  return done();
}

Object* switch_close(Object*, Object*) {
  ThreadState& t = tls;
  if (t.switch_frames.empty()) return done();
  const uint32_t top = t.switch_frames.back();
  t.switch_frames.pop_back();
  if (top != 0) mt_scope_exit(top);
  return done();
}

Object* switch_set_live(Object*, Object* arg) {
  const int on = is_true(arg);
  if (on < 0) return nullptr;
  switch_live.store(on != 0, std::memory_order_relaxed);
  return done();
}

MethodDef switch_methods[] = {
    {"switch_open", reinterpret_cast<void*>(&switch_open), kMethNoargs, "switch_open()"},
    {"switch_to", reinterpret_cast<void*>(&switch_to), kMethO, "switch_to(scope)"},
    {"switch_close", reinterpret_cast<void*>(&switch_close), kMethNoargs, "switch_close()"},
    {"switch_live", reinterpret_cast<void*>(&switch_set_live), kMethO, "switch_live(flag)"},
};

// nn.Module.__call__ as a method descriptor made here: a module call costs a C call, a
// lookup and the two scope records, not a Python frame. Everything rare (a thread's outermost
// call: phase and iteration; a module not yet named; an iteration-marker module) is left to
// Python's `before(module, depth) -> info` and `after(module, depth, info)`; `info` is the
// module's scope id (low 32 bits) and kMarker. All of it runs under the GIL.
constexpr uint64_t kMarker = 1ull << 32;
enum : uint32_t { kLive = 1, kDirect = 2, kScopes = 4, kTrack = 8 };
struct Named {
  Object* ref;  // weak reference to the module: a reused address is not the module named
  uint64_t info;
};
struct ModuleCall {
  uint32_t flags = 0;
  Object* before = nullptr;
  Object* after = nullptr;
  Object* orig = nullptr;  // the __call__ this one replaced (called when not kDirect)
  Object* descr = nullptr;
  Object* call_impl = nullptr;  // "_call_impl"
  Object* compiled = nullptr;   // "_compiled_call_impl"
  std::unordered_map<Object*, Named> named;
};
ModuleCall& mc = *new ModuleCall();  // never destroyed: modules may be called at exit

bool referent_is(Object* ref, Object* obj) {
  if (weakref_get_ref != nullptr) {
    Object* got = nullptr;
    if (weakref_get_ref(ref, &got) < 0) return false;
    if (got != nullptr) decref(got);
    return got == obj;
  }
  return weakref_get_object(ref) == obj;
}

void forget_named() {
  for (auto& [module, n] : mc.named) decref(n.ref);
  mc.named.clear();
}

// (self, *args) as one array: `stack` if it fits, else a heap copy the caller frees.
Object* const* with_self(Object* self, Object* const* args, Ssize n, Object** stack, size_t room, Object*** heap) {
  Object** out = stack;
  if (static_cast<size_t>(n) + 1 > room) {
    out = *heap = static_cast<Object**>(std::malloc((n + 1) * sizeof(Object*)));
    if (out == nullptr) return nullptr;
  }
  out[0] = self;
  if (n > 0) std::memcpy(out + 1, args, n * sizeof(Object*));
  return out;
}

Object* call_module(Object* self, Object* const* args, Ssize nargs, Object* kwnames) {
  const Ssize nkw = kwnames != nullptr ? tuple_size(kwnames) : 0;
  Object* stack[16];
  Object** heap = nullptr;
  Object* const* all = with_self(self, args, nargs + nkw, stack, 16, &heap);
  if (all == nullptr) {
    err_set_string(type_error, "memory-tracer: out of memory calling a module");
    return nullptr;
  }
  Object* result;
  if (mc.flags & kDirect) {
    // What nn.Module._wrapped_call_impl does: the compiled call if torch.compile set one.
    Object* compiled = get_attr(self, mc.compiled);
    if (compiled == nullptr) {
      result = nullptr;
    } else if (compiled != none) {
      result = vectorcall(compiled, all + 1, static_cast<size_t>(nargs), kwnames);
      decref(compiled);
    } else {
      decref(compiled);
      result = vectorcall_method(mc.call_impl, all, static_cast<size_t>(nargs + 1), kwnames);
    }
  } else {
    result = vectorcall(mc.orig, all, static_cast<size_t>(nargs + 1), kwnames);
  }
  std::free(heap);
  return result;
}

// Calls `hook(module, depth[, info])`, keeping an exception already raised (the module's own).
Object* call_hook(Object* hook, Object* module, uint32_t depth, const uint64_t* info) {
  Object* d = from_long(static_cast<long>(depth));
  if (d == nullptr) return nullptr;
  Object* i = nullptr;
  if (info != nullptr) {
    i = from_long(static_cast<long>(*info));
    if (i == nullptr) {
      decref(d);
      return nullptr;
    }
  }
  Object* argv[3] = {module, d, i};
  Object* r = vectorcall(hook, argv, info != nullptr ? 3 : 2, nullptr);
  decref(d);
  if (i != nullptr) decref(i);
  return r;
}

Object* module_call(Object* self, Object* const* args, Ssize nargs, Object* kwnames) {
  const uint32_t flags = mc.flags;
  if (!(flags & kLive)) return call_module(self, args, nargs, kwnames);
  ThreadState& t = tls;
  const uint32_t depth = t.module_depth;
  uint64_t info = 0;
  bool ask = depth == 0;
  if (flags & kTrack) {
    auto it = mc.named.find(self);
    if (it != mc.named.end() && referent_is(it->second.ref, self)) {
      info = it->second.info;
      ask = ask || (info & kMarker);
    } else {
      ask = true;
    }
  }
  if (ask) {
    Object* r = call_hook(mc.before, self, depth, nullptr);
    if (r == nullptr) return nullptr;
    info = as_unsigned_long_long(r);
    decref(r);
    if (info == static_cast<unsigned long long>(-1) && err_occurred() != nullptr) return nullptr;
    if (flags & kTrack) {
      auto it = mc.named.find(self);
      if (it == mc.named.end() || !referent_is(it->second.ref, self)) {
        Object* ref = weakref_new(self, nullptr);
        if (ref == nullptr) {  // a module that takes no weak reference is asked at every call
          err_clear();
        } else if (it != mc.named.end()) {
          decref(it->second.ref);
          it->second = Named{ref, info};
        } else {
          mc.named.emplace(self, Named{ref, info});
        }
      }
    }
  }
  const uint32_t scope = static_cast<uint32_t>(info);
  const bool scoped = (flags & kScopes) && scope != 0;
  t.module_depth = depth + 1;
  if (scoped) mt_scope_enter(scope);
  Object* result = call_module(self, args, nargs, kwnames);
  if (scoped) mt_scope_exit(scope);
  tls.module_depth = depth;
  if (depth == 0 || (info & kMarker)) {
    Object *type = nullptr, *value = nullptr, *trace = nullptr;
    if (result == nullptr) err_fetch(&type, &value, &trace);
    Object* r = call_hook(mc.after, self, depth, &info);
    if (r != nullptr) {
      decref(r);
    } else if (result != nullptr) {
      decref(result);
      result = nullptr;
    } else {  // the module's own exception wins over the hook's
      err_clear();
    }
    if (result == nullptr && type != nullptr) err_restore(type, value, trace);
  }
  return result;
}

MethodDef module_call_def = {"__call__", reinterpret_cast<void*>(&module_call), kMethFastcall | kMethKeywords,
                             "__call__($self, /, *args, **kwargs)\n--\n\n"
                             "nn.Module.__call__ with Memory Tracer's module scopes"};

void set(Object*& slot, Object* value) {
  incref(value);
  if (slot != nullptr) decref(slot);
  slot = value;
}

// setup(module_type, orig, before, after, flags) -> the descriptor to set as
// module_type.__call__ (one per process, made on the first call).
Object* module_call_setup(Object*, Object* const* args, Ssize nargs) {
  if (nargs != 5) {
    err_set_string(type_error, "module_call_setup(module_type, orig, before, after, flags)");
    return nullptr;
  }
  const unsigned long flags = as_unsigned_long(args[4]);
  if (flags == static_cast<unsigned long>(-1) && err_occurred() != nullptr) return nullptr;
  if (mc.descr == nullptr) {
    mc.call_impl = intern("_call_impl");
    mc.compiled = intern("_compiled_call_impl");
    if (mc.call_impl == nullptr || mc.compiled == nullptr) return nullptr;
    mc.descr = descr_new_method(args[0], &module_call_def);
    if (mc.descr == nullptr) return nullptr;
  }
  set(mc.orig, args[1]);
  set(mc.before, args[2]);
  set(mc.after, args[3]);
  forget_named();
  mc.flags = static_cast<uint32_t>(flags);
  incref(mc.descr);
  return mc.descr;
}

// live(flag): off, the descriptor only passes calls on (it stays wherever someone copied it).
Object* module_call_live(Object*, Object* arg) {
  const int on = is_true(arg);
  if (on < 0) return nullptr;
  mc.flags = on ? (mc.flags | kLive) : (mc.flags & ~kLive);
  if (!on) forget_named();
  return done();
}

MethodDef module_call_methods[] = {
    {"module_call_setup", reinterpret_cast<void*>(&module_call_setup), kMethFastcall,
     "module_call_setup(module_type, orig, before, after, flags)"},
    {"module_call_live", reinterpret_cast<void*>(&module_call_live), kMethO, "module_call_live(flag)"},
};
}  // namespace py
}  // extern "C++"

const void* mt_py_methods(void) {
  if (!py::load()) return nullptr;
  return py::methods;
}

const void* mt_py_user_frames(void) {
  if (!py::load()) return nullptr;
  return py::user_frame_methods;
}

const void* mt_py_module_call(void) {
  if (!py::load()) return nullptr;
  return py::module_call_methods;
}

const void* mt_py_switch(void) {
  if (!py::load()) return nullptr;
  return py::switch_methods;
}

void mt_mark(uint32_t name, int64_t value) {
  try {
    if (!g().active.load(std::memory_order_relaxed)) return;
    MtRecord* r = slot();
    if (r == nullptr) return;
    fill_common(r, MT_MARK, at::RecordFunction::currentThreadId());
    r->name = name;
    r->value = value;
    publish();
  } catch (...) {
  }
}

uint64_t mt_now_ns(void) { return clk::now(); }

size_t mt_drain(MtRecord* out, size_t cap) {
  auto& G = g();
  std::vector<std::shared_ptr<ThreadBuf>> bufs;
  {
    std::lock_guard<std::mutex> lock(G.mu);
    bufs = G.bufs;
  }
  size_t n = 0;
  for (auto& buf : bufs) {
    std::lock_guard<std::mutex> lock(buf->mu);
    while (n < cap && !buf->chunks.empty()) {
      Chunk* c = buf->chunks.front().get();
      size_t published = c->count.load(std::memory_order_acquire);
      size_t take = std::min(published - buf->read_pos, cap - n);
      std::memcpy(out + n, c->recs + buf->read_pos, take * sizeof(MtRecord));
      n += take;
      buf->read_pos += take;
      // A full chunk that is completely read can go once the writer has linked the next
      // one (the last chunk is the writer's current one).
      if (buf->read_pos == kChunkRecords && buf->chunks.size() > 1) {
        std::unique_ptr<Chunk> done = std::move(buf->chunks.front());
        buf->chunks.pop_front();
        G.live_chunks.fetch_sub(1, std::memory_order_relaxed);
        std::lock_guard<std::mutex> spare_lock(G.spare_mu);
        if (G.spare.size() < 64) G.spare.push_back(std::move(done));
        buf->read_pos = 0;
      } else {
        break;
      }
    }
    if (n == cap) break;
  }
  clk::convert(out, n);
  return n;
}

void mt_counters(MtCounters* out) {
  auto& G = g();
  out->mem_kept = G.mem_kept.load();
  out->mem_dropped = G.mem_dropped.load();
  out->op_kept = G.op_kept.load();
  out->op_dropped = G.op_dropped.load();
  out->peak_allocated = G.peak_allocated.load();
  out->peak_reserved = G.peak_reserved.load();
  out->buffer_dropped = G.buffer_dropped.load();
}

int mt_cuda_device_stats(int8_t device, MtDeviceStats* out) {
#if !MT_DEVICE_ALLOCATOR
  set_error("the CUDA allocator's statistics need torch 2.9 or newer (this capture was built for an older torch)");
  return -1;
#else
  try {
    auto* alloc = c10::getDeviceAllocator(c10::DeviceType::CUDA);
    if (alloc == nullptr || !alloc->initialized()) {
      set_error("the CUDA caching allocator is not initialized");
      return -1;
    }
    auto stats = alloc->getDeviceStats(device);
    const size_t agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    out->allocated_current = static_cast<uint64_t>(stats.allocated_bytes[agg].current);
    out->allocated_peak = static_cast<uint64_t>(stats.allocated_bytes[agg].peak);
    out->reserved_current = static_cast<uint64_t>(stats.reserved_bytes[agg].current);
    out->reserved_peak = static_cast<uint64_t>(stats.reserved_bytes[agg].peak);
    out->num_alloc_retries = static_cast<uint64_t>(stats.num_alloc_retries);
    out->num_ooms = static_cast<uint64_t>(stats.num_ooms);
    return 0;
  } catch (const std::exception& e) {
    set_error(e.what());
    return -1;
  }
#endif
}

int mt_cuda_reset_peak(int8_t device) {
#if !MT_DEVICE_ALLOCATOR
  set_error("the CUDA allocator's statistics need torch 2.9 or newer (this capture was built for an older torch)");
  return -1;
#else
  try {
    auto* alloc = c10::getDeviceAllocator(c10::DeviceType::CUDA);
    if (alloc == nullptr || !alloc->initialized()) return -1;
    alloc->resetPeakStats(device);
    return 0;
  } catch (const std::exception& e) {
    set_error(e.what());
    return -1;
  }
#endif
}

int mt_cuda_empty_cache(void) {
#if !MT_DEVICE_ALLOCATOR
  set_error("the CUDA allocator's statistics need torch 2.9 or newer (this capture was built for an older torch)");
  return -1;
#else
  try {
    auto* alloc = c10::getDeviceAllocator(c10::DeviceType::CUDA);
    if (alloc == nullptr || !alloc->initialized()) return -1;
    alloc->emptyCache();
    return 0;
  } catch (const std::exception& e) {
    set_error(e.what());
    return -1;
  }
#endif
}

int mt_stream_open(int fd, uint32_t interval_ms, uint64_t max_buffered_records) {
  try {
    Stream& S = stream();
    std::lock_guard<std::mutex> lock(S.write_mu);
    if (S.fd >= 0 || S.forked_child) {
      set_error("a stream is already open in this process");
      return -1;
    }
    if (!S.atfork_registered) {
      pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
      S.atfork_registered = true;
    }
    S.fd = fd;
    S.broken = false;
    S.stop = false;
    S.strings_sent = 0;
    S.interval_ms = interval_ms == 0 ? 20 : interval_ms;
    uint64_t chunks = max_buffered_records == 0 ? 0 : (max_buffered_records + kChunkRecords - 1) / kChunkRecords;
    g().max_chunks.store(chunks);
    S.thread = std::thread(stream_loop);
    return 0;
  } catch (const std::exception& e) {
    set_error(e.what());
    return -1;
  }
}

int mt_holders_queue(const char* data, size_t len) {
  try {
    if (len % sizeof(MtHolder) != 0) {
      set_error("mt_holders_queue: the length is not a whole number of MtHolder records");
      return -1;
    }
    if (stream().forked_child) return -1;
    Workspaces& W = workspaces();
    std::lock_guard<std::mutex> lock(W.mu);
    const size_t at = W.pending.size();
    W.pending.resize(at + len / sizeof(MtHolder));
    if (len > 0) std::memcpy(W.pending.data() + at, data, len);
    return 0;
  } catch (const std::exception& e) {
    set_error(e.what());
    return -1;
  }
}

int mt_stream_send(uint32_t kind, const char* data, size_t len) {
  try {
    Stream& S = stream();
    if (S.forked_child) return -1;
    std::lock_guard<std::mutex> lock(S.write_mu);
    flush_locked(S);
    return send_frame_locked(S, kind, data, len) ? 0 : -1;
  } catch (const std::exception& e) {
    set_error(e.what());
    return -1;
  }
}

int mt_stream_close(void) {
  try {
    Stream& S = stream();
    if (S.forked_child || S.fd < 0) return 0;
    {
      std::lock_guard<std::mutex> lk(S.cv_mu);
      S.stop = true;
    }
    S.cv.notify_all();
    if (S.thread.joinable()) S.thread.join();
    std::lock_guard<std::mutex> lock(S.write_mu);
    flush_locked(S);
    ::shutdown(S.fd, SHUT_RDWR);
    ::close(S.fd);
    S.fd = -1;
    g().max_chunks.store(0);
    return 0;
  } catch (const std::exception& e) {
    set_error(e.what());
    return -1;
  }
}

size_t mt_last_error(char* buf, size_t cap) {
  std::lock_guard<std::mutex> lock(g().mu);
  const std::string& e = g().last_error;
  size_t n = std::min(cap, e.size());
  std::memcpy(buf, e.data(), n);
  return n;
}

}  // extern "C"
