//! Turns the shim's raw records into a [`Trace`]: pairs operator enter/exit, attaches tensors,
//! attributes every operator and allocation to a layer, and orders memory events in time.
//!
//! Pure data in, data out (no libtorch calls), so it is tested without a model.
//!
//! Attribution rules (ARCHITECTURE.md, "Layer attribution"):
//! - a forward op belongs to the innermost layer scope open on its thread when it started;
//! - a backward node (`BACKWARD_FUNCTION`) belongs to the layer of the forward op with the same
//!   (sequence number, forward thread), the innermost such op when several share it;
//! - any other op inherits the layer of its parent op;
//! - an allocation or free belongs to the layer of the innermost op open on its thread, else
//!   to the innermost scope; a free outside both belongs to the layer that allocated the
//!   block; what is left is [`UNATTRIBUTED`].

use crate::layout::{self as ffi, MtCounters, MtHolder, MtRecord};
use shared::model::{Device, EventRecord, EventType, IterationSpan, LayerScope, OperatorEvent, Phase, StrId, TensorRef, Totals, TraceMeta};
use shared::Trace;
use std::collections::HashMap;

mod holders;
use holders::{push_holders, savers};

/// The layer name given to memory that no op or scope claims.
pub const UNATTRIBUTED: &str = "unattributed";
/// The mark that starts an iteration (its value is the iteration index).
pub const ITERATION_BEGIN: &str = "iteration.begin";
/// The mark that ends an iteration.
pub const ITERATION_END: &str = "iteration.end";

/// Everything one capture produced.
#[derive(Debug, Default)]
pub struct Captured {
    pub records: Vec<MtRecord>,
    /// The shim's strings; id `i` is `strings[i - 1]`.
    pub strings: Vec<String>,
    pub counters: MtCounters,
    /// Steady-clock time at start; trace timestamps are relative to it.
    pub start_ns: u64,
    /// Allocated and reserved bytes of each device when recording started.
    pub base_totals: Vec<(Device, Totals)>,
    /// The CUDA caching allocator's own counters when recording stopped (CUDA sessions).
    pub cuda_stats: Option<ffi::MtDeviceStats>,
    /// Holders taking and letting go of storages (`collector trace --holders`).
    pub holders: Vec<MtHolder>,
}

fn device_of(device_type: i8, index: i8) -> Device {
    match device_type {
        1 => Device { kind: "cuda".into(), index: i32::from(index.max(0)), rank: None },
        0 => Device { kind: "cpu".into(), index: 0, rank: None },
        other => Device { kind: format!("device_type_{other}"), index: i32::from(index.max(0)), rank: None },
    }
}

struct OpTmp {
    id: u32,
    name: u32,
    seq_nr: i64,
    fwd_thread: u64,
    parent: u32,
    scope: u32,
    backward_node: bool,
    start_ns: u64,
    end_ns: Option<u64>,
    thread: u32,
    phase: u8,
    inputs: Vec<TensorTmp>,
    outputs: Vec<TensorTmp>,
}

struct TensorTmp {
    t: TensorRef,
    ndim: usize,
    dims: Vec<i64>,
}

/// Where the tensor records that follow an operator's enter or exit go.
enum Target {
    None,
    Inputs(usize),
    Outputs(usize),
}

/// A layer scope open on the thread being walked.
struct OpenScope {
    name: u32,
    start_ns: u64,
    phase: u8,
    /// The autograd sequence number when it opened.
    first_seq: i64,
}

/// The autograd sequence numbers `first..end` made inside a scope (its module's forward).
#[derive(Clone, Copy)]
struct SeqScope {
    first: i64,
    end: i64,
    name: u32,
    /// A line of the program's own code outside every module (`MT_USER_LINE`): a module's
    /// scope over the same numbers is inside it.
    line: bool,
}

/// An iteration mark: `begin` (else end) of iteration `index`.
struct IterationMark {
    ts_ns: u64,
    begin: bool,
    index: i64,
}

/// The shim's string ids to the trace's, each interned once, on first use.
struct Strings<'c> {
    shim: &'c [String],
    map: Vec<Option<StrId>>,
}

impl<'c> Strings<'c> {
    fn new(shim: &'c [String]) -> Self {
        Self { shim, map: vec![None; shim.len() + 1] }
    }

    fn get(&mut self, trace: &mut Trace, id: u32) -> StrId {
        let shim = self.shim;
        let Some(slot) = self.map.get_mut(id as usize) else {
            return StrId::NONE;
        };
        if id == 0 {
            return StrId::NONE;
        }
        *slot.get_or_insert_with(|| trace.strings.intern(&shim[id as usize - 1]))
    }
}

/// Builds the trace. `meta` carries what the caller knows (model, device name, ...). Stages:
/// walk the records thread by thread ([`walk_records`]: operators with their tensors, scopes,
/// marks, memory records set aside), give every operator its layer ([`attribute_layers`]),
/// write the operators, then the memory events in time order, then iterations and what the
/// shim dropped.
pub fn assemble(c: &Captured, meta: TraceMeta) -> Trace {
    let mut trace = Trace::new(meta);
    if let Some(stats) = c.cuda_stats {
        report_cuda_counters(&mut trace, &stats);
    }
    // Interned first, as they always were: the string and stream tables keep their order.
    let unattributed = trace.strings.intern(UNATTRIBUTED);
    let stream = trace.stream_index("default");
    let mut strings = Strings::new(&c.strings);
    for (device, totals) in &c.base_totals {
        let d = trace.device_index(device.clone());
        trace.events.set_base_totals(d as usize, *totals);
    }
    let mut walk = walk_records(c, &mut trace, &mut strings);
    let layers = attribute_layers(&mut walk.ops, &mut walk.seq_scopes);
    push_operators(&mut trace, &mut strings, &walk.ops, &layers.of_op);
    let to = MemoryTarget { unattributed, stream };
    push_memory_events(&mut trace, &mut strings, c, &walk, &layers, to);
    push_ledger(&mut trace, &mut strings, c, &walk.ledger);
    let savers = savers(&walk.ops, &layers.of_op, &walk.seq_scopes);
    push_holders(&mut trace, &mut strings, c, &savers);
    push_iterations(&mut trace, walk.iteration_marks);
    warn_of_drops(&mut trace, &c.counters);
    trace.finish();
    trace
}

/// The CUDA caching allocator's own counters, into `meta.reported`.
fn report_cuda_counters(trace: &mut Trace, stats: &ffi::MtDeviceStats) {
    use shared::model::Counter;
    let m = &mut trace.meta;
    m.report(Counter::MaxMemoryAllocated, stats.allocated_peak);
    m.report(Counter::MaxMemoryReserved, stats.reserved_peak);
    m.report(Counter::MemoryAllocated, stats.allocated_current);
    m.report(Counter::MemoryReserved, stats.reserved_current);
    m.report(Counter::NumAllocRetries, stats.num_alloc_retries);
    m.report(Counter::NumOoms, stats.num_ooms);
}

/// What one walk over the records found.
#[derive(Default)]
struct Walk {
    ops: Vec<OpTmp>,
    /// Indices of the memory records (allocations, frees, OOMs).
    mem: Vec<usize>,
    /// Indices of the device ledger's records (`MT_DEVICE_MEM`).
    ledger: Vec<usize>,
    /// An allocation outside every scope (its record's index) -> the frame of the program's
    /// own code that made it (`MT_USER_FRAME`).
    frames: HashMap<usize, u32>,
    iteration_marks: Vec<IterationMark>,
    /// Per forward thread: the sequence numbers each scope made.
    seq_scopes: HashMap<u64, Vec<SeqScope>>,
}

/// The walk's state: the open operator's tensor target and the thread's open scopes.
struct Walker<'c, 's> {
    c: &'c Captured,
    strings: &'s mut Strings<'c>,
    walk: Walk,
    op_index: HashMap<u32, usize>,
    target: Target,
    open: Vec<OpenScope>,
    scopes: Vec<LayerScope>,
    user_marks: Vec<(u64, u32, i64)>,
    iteration_begin: Option<u32>,
    iteration_end: Option<u32>,
}

/// Walks the records thread by thread (each thread's records are in order; threads
/// interleave): operators with their tensors, layer scopes (into `trace.scopes`), user marks
/// (into `trace.marks`), iteration marks and memory records (for the later stages).
fn walk_records<'c>(c: &'c Captured, trace: &mut Trace, strings: &mut Strings<'c>) -> Walk {
    let mut order: Vec<usize> = (0..c.records.len()).collect();
    order.sort_by_key(|&i| c.records[i].thread);
    let id_of = |name: &str| c.strings.iter().position(|x| x == name).map(|i| i as u32 + 1);
    let mut w = Walker {
        c,
        strings,
        walk: Walk::default(),
        op_index: HashMap::new(),
        target: Target::None,
        open: Vec::new(),
        scopes: Vec::new(),
        user_marks: Vec::new(),
        iteration_begin: id_of(ITERATION_BEGIN),
        iteration_end: id_of(ITERATION_END),
    };
    let mut current_thread = u32::MAX;
    for &i in &order {
        let r = &c.records[i];
        if r.thread != current_thread {
            w.close_scopes(trace, u64::from(current_thread), None);
            current_thread = r.thread;
            w.target = Target::None;
        }
        w.record(trace, i);
    }
    w.close_scopes(trace, u64::from(current_thread), None);
    w.scopes.sort_by_key(|x| (x.start_ns, x.depth));
    trace.scopes = std::mem::take(&mut w.scopes);
    w.user_marks.sort_by_key(|m| m.0);
    for (ts_ns, name, value) in std::mem::take(&mut w.user_marks) {
        let name = w.strings.get(trace, name);
        trace.marks.push(shared::model::Mark { ts_ns, name, value, rank: None });
    }
    w.walk
}

impl Walker<'_, '_> {
    fn rel(&self, ts: u64) -> u64 {
        ts.saturating_sub(self.c.start_ns)
    }

    fn record(&mut self, trace: &mut Trace, i: usize) {
        let r = &self.c.records[i];
        match r.kind {
            ffi::MT_MEM | ffi::MT_OOM => self.walk.mem.push(i),
            ffi::MT_USER_LINE => {
                // The nodes this line numbered (their forward ran outside every module): a
                // scope of sequence numbers, as a module's is.
                let end = i64::try_from(r.a).unwrap_or(i64::MAX);
                if end > r.value {
                    self.walk.seq_scopes.entry(u64::from(r.thread)).or_default().push(SeqScope {
                        first: r.value,
                        end,
                        name: r.name,
                        line: true,
                    });
                }
            }
            ffi::MT_DEVICE_MEM => self.walk.ledger.push(i),
            ffi::MT_USER_FRAME => {
                // It follows its allocation on the same thread, at the same time.
                if let Some(&m) = self.walk.mem.last() {
                    let a = &self.c.records[m];
                    if a.kind == ffi::MT_MEM && a.thread == r.thread && a.ts_ns == r.ts_ns && r.name != 0 {
                        self.walk.frames.insert(m, r.name);
                    }
                }
            }
            ffi::MT_OP_ENTER => self.op_enter(r),
            ffi::MT_OP_EXIT => {
                self.target = match self.op_index.get(&(r.id as u32)) {
                    Some(&k) => {
                        self.walk.ops[k].end_ns = Some(self.rel(r.ts_ns));
                        Target::Outputs(k)
                    }
                    None => Target::None,
                };
            }
            ffi::MT_TENSOR_IN | ffi::MT_TENSOR_OUT => self.tensor(r),
            ffi::MT_DIMS => self.dims(r),
            ffi::MT_SCOPE_ENTER => {
                self.open.push(OpenScope { name: r.name, start_ns: self.rel(r.ts_ns), phase: r.phase, first_seq: r.value })
            }
            ffi::MT_SCOPE_EXIT => {
                // Pop to the matching scope; scopes left open inside it end with it.
                if let Some(pos) = self.open.iter().rposition(|o| o.name == r.name) {
                    let first = self.open[pos].first_seq;
                    if r.value > first {
                        self.walk.seq_scopes.entry(u64::from(r.thread)).or_default().push(SeqScope {
                            first,
                            end: r.value,
                            name: r.name,
                            line: false,
                        });
                    }
                    let at = self.rel(r.ts_ns);
                    self.close_scopes(trace, r.thread as u64, Some((pos, at)));
                }
            }
            ffi::MT_MARK => {
                let ts_ns = self.rel(r.ts_ns);
                if Some(r.name) == self.iteration_begin {
                    self.walk.iteration_marks.push(IterationMark { ts_ns, begin: true, index: r.value });
                } else if Some(r.name) == self.iteration_end {
                    self.walk.iteration_marks.push(IterationMark { ts_ns, begin: false, index: r.value });
                } else {
                    self.user_marks.push((ts_ns, r.name, r.value));
                }
            }
            _ => {}
        }
    }

    fn op_enter(&mut self, r: &MtRecord) {
        let k = self.walk.ops.len();
        self.op_index.insert(r.id as u32, k);
        self.target = Target::Inputs(k);
        self.walk.ops.push(OpTmp {
            id: r.id as u32,
            name: r.name,
            seq_nr: r.value,
            fwd_thread: r.a,
            parent: r.b as u32,
            scope: r.op,
            backward_node: r.device_type == ffi::RECORD_SCOPE_BACKWARD_FUNCTION,
            start_ns: self.rel(r.ts_ns),
            end_ns: None,
            thread: r.thread,
            phase: r.phase,
            inputs: Vec::new(),
            outputs: Vec::new(),
        });
    }

    fn tensor(&mut self, r: &MtRecord) {
        let t = TensorRef { storage_id: r.id, size_bytes: r.value.max(0) as u64, shape: u32::MAX };
        let ndim = r.a.min(64) as usize;
        let tt = TensorTmp { t, ndim, dims: Vec::with_capacity(ndim) };
        match (&self.target, r.kind) {
            (Target::Inputs(k), ffi::MT_TENSOR_IN) => self.walk.ops[*k].inputs.push(tt),
            (Target::Outputs(k), ffi::MT_TENSOR_OUT) => self.walk.ops[*k].outputs.push(tt),
            _ => {}
        }
    }

    fn dims(&mut self, r: &MtRecord) {
        let last = match self.target {
            Target::Inputs(k) => self.walk.ops[k].inputs.last_mut(),
            Target::Outputs(k) => self.walk.ops[k].outputs.last_mut(),
            Target::None => None,
        };
        if let Some(tt) = last {
            for d in [r.id as i64, r.value, r.a as i64, r.b as i64] {
                if tt.dims.len() < tt.ndim {
                    tt.dims.push(d);
                }
            }
        }
    }

    /// Closes open scopes: all of them at their own start (`until` = None, for scopes never
    /// closed: they get zero length), or those from `pos` up at `ts`.
    fn close_scopes(&mut self, trace: &mut Trace, thread: u64, until: Option<(usize, u64)>) {
        let (pos, end) = until.map_or((0, None), |(p, ts)| (p, Some(ts)));
        while self.open.len() > pos {
            let Some(o) = self.open.pop() else { break };
            let depth = self.open.len() as u16;
            self.scopes.push(LayerScope {
                name: self.strings.get(trace, o.name),
                start_ns: o.start_ns,
                end_ns: end.unwrap_or(o.start_ns).max(o.start_ns),
                depth,
                phase: Phase::from_u8(o.phase).unwrap_or_default(),
                thread,
            });
        }
    }
}

/// Every operator's layer (a shim string id, 0: none), with the operators in time order.
struct Layers {
    /// By operator, in `ops` order after the sort.
    of_op: Vec<u32>,
    /// By operator: whether it is a backward node. A memory record made in one while a scope
    /// is open on its thread was made by code the node runs that opened it (backward runs
    /// outside module calls): compiled backward code switching to the modules it came from,
    /// a checkpointed module's forward run again. The scope names it more closely than the
    /// node's forward layer.
    backward_node: Vec<bool>,
    /// Operator id → index.
    op_index: HashMap<u32, usize>,
}

/// Sorts the operators by start and gives each its layer: a backward node the layer of the
/// forward op with its sequence number (else the scope that made the number), any other op
/// its scope, else its parent's.
fn attribute_layers(ops: &mut [OpTmp], seq_scopes: &mut HashMap<u64, Vec<SeqScope>>) -> Layers {
    ops.sort_by_key(|o| (o.start_ns, o.id));
    let op_index: HashMap<u32, usize> = ops.iter().enumerate().map(|(k, o)| (o.id, k)).collect();
    let mut layer: Vec<u32> = vec![0; ops.len()];
    let mut forward_by_seq: HashMap<(i64, u64), usize> = HashMap::new();
    for list in seq_scopes.values_mut() {
        // Outer scopes before the inner ones that start with them.
        list.sort_unstable_by_key(|s| (s.first, std::cmp::Reverse(s.end), std::cmp::Reverse(s.line)));
    }
    for (k, o) in ops.iter().enumerate() {
        let from_forward = if o.backward_node && o.seq_nr >= 0 {
            forward_by_seq
                .get(&(o.seq_nr, o.fwd_thread))
                .map(|&f| layer[f])
                .filter(|&l| l != 0)
                .or_else(|| scope_of_sequence(seq_scopes.get(&o.fwd_thread), o.seq_nr))
        } else {
            None
        };
        let from_parent = op_index.get(&o.parent).map(|&p| layer[p]).filter(|&l| l != 0);
        layer[k] = from_forward.or(if o.scope != 0 { Some(o.scope) } else { None }).or(from_parent).unwrap_or(0);
        if !o.backward_node && o.seq_nr >= 0 {
            // Later entries are inner ops sharing the number (aten::conv2d -> aten::convolution).
            forward_by_seq.insert((o.seq_nr, u64::from(o.thread)), k);
        }
    }
    // The engine's `autograd::engine::evaluate_function: X` wrapper allocates on behalf of its
    // node (gradient buffers): give it the node's layer, then let unresolved ops inherit again.
    for k in 0..ops.len() {
        if ops[k].backward_node && layer[k] != 0 {
            if let Some(&p) = op_index.get(&ops[k].parent) {
                if layer[p] == 0 {
                    layer[p] = layer[k];
                }
            }
        }
    }
    for k in 0..ops.len() {
        if layer[k] == 0 {
            if let Some(&p) = op_index.get(&ops[k].parent) {
                layer[k] = layer[p];
            }
        }
    }
    let backward_node = ops.iter().map(|o| o.backward_node).collect();
    Layers { of_op: layer, op_index, backward_node }
}

/// The operators and their tensors (shapes interned) into the trace.
fn push_operators(trace: &mut Trace, strings: &mut Strings, ops: &[OpTmp], layer: &[u32]) {
    let mut shape_ids: HashMap<Vec<i64>, u32> = HashMap::new();
    let mut push_tensors = |trace: &mut Trace, list: &[TensorTmp]| -> (u32, u32) {
        let start = trace.tensors.len() as u32;
        for tt in list {
            let mut t = tt.t;
            if tt.dims.len() == tt.ndim {
                t.shape = *shape_ids.entry(tt.dims.clone()).or_insert_with(|| {
                    trace.shapes.push(tt.dims.clone());
                    (trace.shapes.len() - 1) as u32
                });
            }
            trace.tensors.push(t);
        }
        (start, trace.tensors.len() as u32)
    };
    trace.ops.reserve(ops.len());
    for (k, o) in ops.iter().enumerate() {
        let inputs = push_tensors(trace, &o.inputs);
        let outputs = push_tensors(trace, &o.outputs);
        let name = strings.get(trace, o.name);
        let layer_id = strings.get(trace, layer[k]);
        trace.ops.push(OperatorEvent {
            name,
            phase: Phase::from_u8(o.phase).unwrap_or_default(),
            seq_nr: o.seq_nr,
            start_ns: o.start_ns,
            end_ns: o.end_ns.unwrap_or(o.start_ns).max(o.start_ns),
            thread: u64::from(o.thread),
            fwd_thread: o.fwd_thread,
            layer: layer_id,
            inputs,
            outputs,
        });
    }
}

/// The layer of memory nothing claims, and the stream every event is on.
#[derive(Clone, Copy)]
struct MemoryTarget {
    unattributed: StrId,
    stream: u16,
}

/// The memory records in time order, each with its layer (its operator's, else its scope's,
/// else, for an allocation, the frame of the program's own code that made it; a free outside
/// all of them: the layer that allocated the block) and the totals after it.
fn push_memory_events(trace: &mut Trace, strings: &mut Strings, c: &Captured, walk: &Walk, layers: &Layers, to: MemoryTarget) {
    let MemoryTarget { unattributed, stream } = to;
    let rel = |ts: u64| ts.saturating_sub(c.start_ns);
    let mut mem = walk.mem.clone();
    mem.sort_by_key(|&i| c.records[i].ts_ns);
    let mut owner: HashMap<(u8, u64), StrId> = HashMap::new();
    // CPU totals are our own running sums: libtorch's CPU reporter keeps a process-wide count
    // that misses frees made while no one was recording, so it drifts across traces.
    let mut cpu_running: HashMap<u8, u64> = HashMap::new();
    let mut skipped_cpu_frees = 0u64;
    let mut requested = RequestedSizes::default();
    for &i in &mem {
        let r = &c.records[i];
        let device = device_of(r.device_type, r.device_index);
        let is_cpu = device.kind == "cpu";
        let d = trace.device_index(device);
        if is_cpu && r.kind == ffi::MT_MEM && r.value < 0 && !owner.contains_key(&(d, r.id)) {
            // A block allocated before this trace: its allocation is not in the totals either.
            skipped_cpu_frees += 1;
            continue;
        }
        let op = layers.op_index.get(&r.op).copied();
        let opened_in_node = r.name != 0 && op.is_some_and(|k| layers.backward_node[k]);
        let layer_id = op
            .map(|k| layers.of_op[k])
            .filter(|&l| l != 0 && !opened_in_node)
            .or(if r.name != 0 { Some(r.name) } else { None })
            .or_else(|| walk.frames.get(&i).copied())
            .map(|l| strings.get(trace, l));
        // A free outside every op and scope (a graph released after backward, a dropped
        // tensor) belongs to the layer that allocated the block.
        let layer_id = match (r.kind, r.value >= 0) {
            (ffi::MT_MEM, true) => {
                let l = layer_id.unwrap_or(unattributed);
                owner.insert((d, r.id), l);
                l
            }
            (ffi::MT_MEM, false) => {
                let from_alloc = owner.remove(&(d, r.id));
                layer_id.or(from_alloc).unwrap_or(unattributed)
            }
            _ => layer_id.unwrap_or(unattributed),
        };
        let (event_type, size) = match r.kind {
            // Explained by the out-of-memory report (analysis::oom), whose time shares the
            // trace's origin.
            ffi::MT_OOM => (EventType::Oom, r.value.max(0) as u64),
            _ if r.value >= 0 => (EventType::Alloc, r.value as u64),
            _ => (EventType::Free, r.value.unsigned_abs()),
        };
        // libtorch's CPU allocator caches nothing and reports no reserved total; it stays 0
        // (so CPU events need no per-event override and cost 32 bytes).
        let totals = if is_cpu {
            let run = cpu_running.entry(d).or_insert(0);
            match event_type {
                EventType::Alloc => *run += size,
                EventType::Free => *run = run.saturating_sub(size),
                _ => {}
            }
            Totals { allocated_bytes: *run, reserved_bytes: 0 }
        } else {
            Totals { allocated_bytes: r.a, reserved_bytes: r.b }
        };
        let phase = Phase::from_u8(r.phase).unwrap_or_default();
        let totals = Some(totals);
        if let Some(bytes) = requested.of(d, event_type, size, r.c) {
            trace.event_requested.push((trace.events.len() as u32, bytes));
        }
        trace.events.push(EventRecord {
            ts_ns: rel(r.ts_ns),
            event_type,
            phase,
            size_bytes: size,
            address: r.id,
            layer: layer_id,
            device: d,
            stream,
            totals,
        });
    }
    if skipped_cpu_frees > 0 {
        trace.meta.warnings.push(format!(
            "{skipped_cpu_frees} CPU frees of blocks allocated before the trace started were left out (their allocations are not in the totals)"
        ));
    }
}

/// The device ledger's records into `trace.ledger`, in time order, on the trace's devices: a
/// record whose device the driver did not say belongs to the trace's one CUDA device; one on
/// a device the trace has no events of is left out and counted.
fn push_ledger(trace: &mut Trace, strings: &mut Strings, c: &Captured, records: &[usize]) {
    let cuda: Vec<u8> = (0..trace.devices.len()).filter(|&d| trace.devices[d].kind == "cuda").map(|d| d as u8).collect();
    let mut elsewhere = 0usize;
    for &i in records {
        let r = &c.records[i];
        let device = if r.device_index < 0 {
            (cuda.len() == 1).then(|| cuda[0])
        } else {
            let want = device_of(r.device_type, r.device_index);
            trace.devices.iter().position(|d| *d == want).map(|d| d as u8)
        };
        let Some(device) = device else {
            elsewhere += 1;
            continue;
        };
        let source = strings.get(trace, r.name);
        let frame = if r.a == 0 { shared::model::StrId::NONE } else { strings.get(trace, r.a as u32) };
        trace.ledger.events.push(shared::model::LedgerEvent {
            ts_ns: r.ts_ns.saturating_sub(c.start_ns),
            device,
            source,
            bytes: r.value,
            address: r.id,
            frame,
        });
    }
    trace.ledger.events.sort_by_key(|e| e.ts_ns);
    if elsewhere > 0 {
        trace.ledger.missing.push(format!("{elsewhere} driver allocations on devices this trace has no memory events of were left out"));
    }
}

/// The bytes each CUDA allocation asked for. The shim reports blocks (rounded up by the
/// caching allocator) and, with each, the bytes ever requested of the device's allocator
/// (`MtRecord::c`): only allocations add to that count, so two consecutive allocations'
/// counts differ by the later one's request. A difference that cannot be one (an allocation
/// this trace did not see, counters reset) leaves that request unknown.
#[derive(Default)]
struct RequestedSizes {
    /// Per device: the count after the last allocation seen.
    so_far: HashMap<u8, u64>,
}

impl RequestedSizes {
    fn of(&mut self, device: u8, event_type: EventType, block: u64, so_far: u64) -> Option<u64> {
        if event_type != EventType::Alloc || so_far == 0 {
            return None;
        }
        // The first allocation seen: the count began at 0 when the allocator did.
        let before = self.so_far.insert(device, so_far).unwrap_or(0);
        let asked = so_far.checked_sub(before)?;
        (asked > 0 && asked <= block).then_some(asked)
    }
}

/// Iterations: a begin mark opens, the next end mark closes.
fn push_iterations(trace: &mut Trace, mut marks: Vec<IterationMark>) {
    let mut open: Option<(u64, i64)> = None;
    marks.sort_by_key(|m| m.ts_ns);
    for m in marks {
        match (m.begin, open) {
            (true, _) => open = Some((m.ts_ns, m.index)),
            (false, Some((start, index))) => {
                trace.iterations.push(IterationSpan { index: index.max(0) as u32, start_ns: start, end_ns: m.ts_ns });
                open = None;
            }
            (false, None) => {}
        }
    }
}

/// Warnings for what the shim dropped (the event limits, a full buffer), and their count.
fn warn_of_drops(trace: &mut Trace, counters: &MtCounters) {
    if counters.mem_dropped > 0 {
        trace.meta.warnings.push(format!(
            "the event limit kept the first {} allocations and frees and dropped {} later ones; peaks reported by the allocator while dropping: {} allocated, {} reserved",
            counters.mem_kept,
            counters.mem_dropped,
            counters.peak_allocated,
            counters.peak_reserved
        ));
    }
    if counters.op_dropped > 0 {
        trace
            .meta
            .warnings
            .push(format!("the event limit kept the first {} operators and dropped {} later ones", counters.op_kept, counters.op_dropped));
    }
    if counters.buffer_dropped > 0 {
        trace.meta.warnings.push(format!(
            "{} records were dropped because the program recorded faster than the collector drained (bounded buffer full); the allocator's peaks while dropping: {} allocated, {} reserved",
            counters.buffer_dropped, counters.peak_allocated, counters.peak_reserved
        ));
    }
    trace.dropped_events = counters.mem_dropped + counters.op_dropped + counters.buffer_dropped;
}

/// The innermost scope whose sequence-number range holds `seq` (the module whose forward made
/// the autograd node numbered `seq`). Scopes nest and are sorted by start, outer first among
/// equal starts, so walking back from the last one that starts at or before `seq`, the first
/// that also ends after it is the innermost.
fn scope_of_sequence(sorted: Option<&Vec<SeqScope>>, seq: i64) -> Option<u32> {
    let list = sorted?;
    let upto = list.partition_point(|s| s.first <= seq);
    list[..upto].iter().rev().find(|s| s.end > seq).map(|s| s.name)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use shared::model::HolderKind;

    fn rec(kind: u8, ts: u64, thread: u32) -> MtRecord {
        MtRecord { ts_ns: ts, kind, thread, phase: Phase::Other as u8, device_type: -1, device_index: -1, ..Default::default() }
    }

    /// A hand-made capture: forward `linear` in layer `fc` (thread 1) allocates, its backward
    /// node runs on thread 2 inside the engine's wrapper and allocates there, the graph is
    /// freed outside any op.
    #[test]
    fn attribution_follows_scopes_sequence_numbers_and_allocations() {
        let strings: Vec<String> =
            ["fc", "aten::linear", "AddmmBackward0", "autograd::engine::evaluate_function: AddmmBackward0"].map(String::from).to_vec();
        let (fc, linear, node, wrapper) = (1, 2, 3, 4);
        let mut r = Vec::new();
        let mut scope_enter = rec(ffi::MT_SCOPE_ENTER, 10, 1);
        scope_enter.name = fc;
        r.push(scope_enter);
        let mut op = rec(ffi::MT_OP_ENTER, 11, 1);
        (op.id, op.value, op.b, op.name, op.op, op.phase) = (1, 7, 0, linear, fc, Phase::Forward as u8);
        r.push(op);
        let mut t_in = rec(ffi::MT_TENSOR_IN, 11, 1);
        (t_in.id, t_in.value, t_in.a) = (0xA0, 64, 2);
        r.push(t_in);
        let mut dims = rec(ffi::MT_DIMS, 0, 1);
        (dims.id, dims.value) = (4, 4);
        r.push(dims);
        let mut alloc = rec(ffi::MT_MEM, 12, 1);
        (alloc.id, alloc.value, alloc.a, alloc.op, alloc.name, alloc.device_type, alloc.phase) =
            (0x100, 512, 512, 1, fc, 0, Phase::Forward as u8);
        r.push(alloc);
        let mut exit = rec(ffi::MT_OP_EXIT, 13, 1);
        exit.id = 1;
        r.push(exit);
        let mut scope_exit = rec(ffi::MT_SCOPE_EXIT, 14, 1);
        scope_exit.name = fc;
        r.push(scope_exit);
        // backward on thread 2
        let mut w = rec(ffi::MT_OP_ENTER, 20, 2);
        (w.id, w.value, w.name, w.phase) = (2, -1, wrapper, Phase::Backward as u8);
        r.push(w);
        let mut n = rec(ffi::MT_OP_ENTER, 21, 2);
        (n.id, n.value, n.a, n.b, n.name, n.device_type, n.phase) =
            (3, 7, 1, 2, node, ffi::RECORD_SCOPE_BACKWARD_FUNCTION, Phase::Backward as u8);
        r.push(n);
        let mut ne = rec(ffi::MT_OP_EXIT, 22, 2);
        ne.id = 3;
        r.push(ne);
        let mut grad = rec(ffi::MT_MEM, 23, 2);
        (grad.id, grad.value, grad.a, grad.op, grad.device_type, grad.phase) = (0x200, 256, 768, 2, 0, Phase::Backward as u8);
        r.push(grad);
        let mut we = rec(ffi::MT_OP_EXIT, 24, 2);
        we.id = 2;
        r.push(we);
        // the graph (the forward activation) freed outside every op, on thread 1
        let mut free = rec(ffi::MT_MEM, 30, 1);
        (free.id, free.value, free.a, free.device_type) = (0x100, -512, 256, 0);
        r.push(free);
        let mut stray = rec(ffi::MT_MEM, 31, 1);
        (stray.id, stray.value, stray.a, stray.device_type) = (0x300, 128, 384, 0);
        r.push(stray);

        let captured = Captured { records: r, strings, counters: MtCounters::default(), start_ns: 10, ..Default::default() };
        let t = assemble(&captured, TraceMeta::new(shared::model::SourceFormat::MemoryTracer));
        let layers: Vec<Option<&str>> = (0..t.events.len()).map(|i| t.memory_event(i).layer_name).collect();
        assert_eq!(layers, [Some("fc"), Some("fc"), Some("fc"), Some(UNATTRIBUTED)]);
        let phases: Vec<Phase> = (0..t.events.len()).map(|i| t.events.phase(i)).collect();
        assert_eq!(phases, [Phase::Forward, Phase::Backward, Phase::Other, Phase::Other]);
        let op_layers: Vec<(&str, &str)> = t.ops.iter().map(|o| (t.str(o.name), t.str(o.layer))).collect();
        assert_eq!(
            op_layers,
            [("aten::linear", "fc"), ("autograd::engine::evaluate_function: AddmmBackward0", "fc"), ("AddmmBackward0", "fc")]
        );
        let lin = &t.ops[0];
        assert_eq!(lin.inputs.1 - lin.inputs.0, 1);
        let tensor = t.tensors[lin.inputs.0 as usize];
        assert_eq!((tensor.storage_id, tensor.size_bytes), (0xA0, 64));
        assert_eq!(t.shapes[tensor.shape as usize], vec![4, 4]);
        assert_eq!(t.scopes.len(), 1);
        assert_eq!((t.scopes[0].start_ns, t.scopes[0].end_ns), (0, 4));
        // Timestamps are relative to the start, totals are the allocator's.
        assert_eq!(t.events.ts_ns[0], 2);
        assert_eq!(t.events.totals_at(1).allocated_bytes, 768);
    }

    /// Lines of the program's own code outside every module: an allocation made there takes
    /// the line its frame record names; backward nodes numbered while a line was current take
    /// that line, except those a module's scope numbered over the same range (the module is
    /// inside the line); a free takes its allocation's line.
    #[test]
    fn lines_outside_modules_name_their_allocations_and_backward_nodes() {
        let strings: Vec<String> =
            ["train.py:40 in step", "fc", "MulBackward0", "AddmmBackward0", "train.py:41 in step"].map(String::from).to_vec();
        let (line40, fc, mul, addmm, line41) = (1, 2, 3, 4, 5);
        let mut r = Vec::new();
        let line = |ts, seq, end, name| {
            let mut l = rec(ffi::MT_USER_LINE, ts, 1);
            (l.value, l.a, l.name) = (seq, end, name);
            l
        };
        // model(x) on line 40 numbers node 1 inside fc, whose range is the line's
        let mut enter = rec(ffi::MT_SCOPE_ENTER, 11, 1);
        (enter.name, enter.value) = (fc, 1);
        r.push(enter);
        let mut exit = rec(ffi::MT_SCOPE_EXIT, 12, 1);
        (exit.name, exit.value) = (fc, 2);
        r.push(exit);
        r.push(line(13, 1, 2, line40));
        // `y * 3` on line 41: node 2, an allocation with its frame
        let mut alloc = rec(ffi::MT_MEM, 14, 1);
        (alloc.id, alloc.value, alloc.a, alloc.device_type) = (0x100, 512, 512, 0);
        r.push(alloc);
        let mut frame = rec(ffi::MT_USER_FRAME, 14, 1);
        frame.name = line41;
        r.push(frame);
        let mut free = rec(ffi::MT_MEM, 15, 1);
        (free.id, free.value, free.device_type) = (0x100, -512, 0);
        r.push(free);
        r.push(line(16, 2, 3, line41));
        // backward on thread 2: node 2 then node 1, each allocating
        for (k, (seq, name, ts)) in [(2i64, mul, 20u64), (1, addmm, 22)].into_iter().enumerate() {
            let mut n = rec(ffi::MT_OP_ENTER, ts, 2);
            (n.id, n.value, n.a, n.name, n.device_type, n.phase) =
                (10 + k as u64, seq, 1, name, ffi::RECORD_SCOPE_BACKWARD_FUNCTION, Phase::Backward as u8);
            r.push(n);
            let mut g = rec(ffi::MT_MEM, ts + 1, 2);
            (g.id, g.value, g.a, g.op, g.device_type, g.phase) =
                (0x200 + k as u64 * 0x100, 256, 256, 10 + k as u32, 0, Phase::Backward as u8);
            r.push(g);
        }
        let captured = Captured { records: r, strings, counters: MtCounters::default(), start_ns: 10, ..Default::default() };
        let t = assemble(&captured, TraceMeta::new(shared::model::SourceFormat::MemoryTracer));
        let layers: Vec<Option<&str>> = (0..t.events.len()).map(|i| t.memory_event(i).layer_name).collect();
        assert_eq!(layers, [Some("train.py:41 in step"), Some("train.py:41 in step"), Some("train.py:41 in step"), Some("fc")]);
        let op_layers: Vec<(&str, &str)> = t.ops.iter().map(|o| (t.str(o.name), t.str(o.layer))).collect();
        assert_eq!(op_layers, [("MulBackward0", "train.py:41 in step"), ("AddmmBackward0", "fc")]);
    }

    /// Each CUDA allocation's request is the rise of the allocator's count of bytes ever
    /// requested since the last allocation of its device; a rise that cannot be one (larger
    /// than the block, or a count that fell) leaves it unknown, as does a record without one.
    #[test]
    fn requested_sizes_are_the_rise_of_the_devices_request_count() {
        let cuda = 1; // c10::DeviceType::CUDA
        let mut r = Vec::new();
        let mem = |ts, ptr: u64, value: i64, index: i8, c: u64| {
            let mut m = rec(ffi::MT_MEM, ts, 1);
            (m.id, m.value, m.device_type, m.device_index, m.c) = (ptr, value, cuda, index, c);
            m
        };
        r.push(mem(11, 0x1000, 512, 0, 4)); // first of device 0: 4 bytes asked since the start
        r.push(mem(12, 0x2000, 2 << 20, 1, 1_500_000)); // device 1 counts on its own
        r.push(mem(13, 0x1000, -512, 0, 0)); // frees carry no count
        r.push(mem(14, 0x1200, 1024, 0, 4 + 1000));
        r.push(mem(15, 0x1600, 1024, 0, 4 + 1000 + 5000)); // more than its block: a missed allocation
        r.push(mem(16, 0x1a00, 512, 0, 0)); // no count (an older torch)
        r.push(mem(17, 0x1c00, 512, 0, 7)); // the counts were reset
        r.push(mem(18, 0x1e00, 512, 0, 7 + 300));
        let captured = Captured { records: r, strings: Vec::new(), counters: MtCounters::default(), start_ns: 10, ..Default::default() };
        let t = assemble(&captured, TraceMeta::new(shared::model::SourceFormat::MemoryTracer));
        assert_eq!(t.event_requested, [(0, 4), (1, 1_500_000), (3, 1000), (7, 300)]);
        assert_eq!(t.requested_of(3), Some(1000));
        assert_eq!(t.requested_of(4), None);
    }

    /// Backward-only capture: no forward op records; the node numbered 8 was made inside
    /// scope `block.fc` (numbers 7..9) nested in `block` (numbers 7..12, the same start), so
    /// it and what it allocates belong to `block.fc`; node 11 to `block`.
    #[test]
    fn backward_nodes_without_forward_ops_take_the_scope_of_their_sequence_number() {
        let strings: Vec<String> = ["block", "block.fc", "MmBackward0", "AddBackward0"].map(String::from).to_vec();
        let scope = |kind, ts, name, seq| {
            let mut x = rec(kind, ts, 1);
            (x.name, x.value) = (name, seq);
            x
        };
        let node = |id: u64, ts, seq, name| {
            let mut n = rec(ffi::MT_OP_ENTER, ts, 2);
            (n.id, n.value, n.a, n.name, n.device_type, n.phase) =
                (id, seq, 1, name, ffi::RECORD_SCOPE_BACKWARD_FUNCTION, Phase::Backward as u8);
            n
        };
        let exit = |id: u64, ts| {
            let mut e = rec(ffi::MT_OP_EXIT, ts, 2);
            e.id = id;
            e
        };
        let mut grad = rec(ffi::MT_MEM, 24, 2);
        (grad.id, grad.value, grad.a, grad.op, grad.device_type) = (0x200, 256, 256, 1, 0);
        let r = vec![
            scope(ffi::MT_SCOPE_ENTER, 10, 1, 7),
            scope(ffi::MT_SCOPE_ENTER, 11, 2, 7),
            scope(ffi::MT_SCOPE_EXIT, 12, 2, 9),
            scope(ffi::MT_SCOPE_EXIT, 13, 1, 12),
            node(1, 20, 8, 3),
            exit(1, 23),
            grad,
            node(2, 30, 11, 4),
            exit(2, 31),
        ];
        let captured = Captured { records: r, strings, start_ns: 10, ..Default::default() };
        let t = assemble(&captured, TraceMeta::new(shared::model::SourceFormat::MemoryTracer));
        let op_layers: Vec<(&str, &str)> = t.ops.iter().map(|o| (t.str(o.name), t.str(o.layer))).collect();
        assert_eq!(op_layers, [("MmBackward0", "block.fc"), ("AddBackward0", "block")]);
        assert_eq!(t.memory_event(0).layer_name, Some("block.fc"));
    }

    #[test]
    fn holders_join_the_block_live_at_their_address_then() {
        // Strings: scopes "block", "block.fc"; names "weight", "ReluBackward0".
        let strings: Vec<String> = ["block", "block.fc", "weight", "ReluBackward0"].map(String::from).to_vec();
        let scope = |kind, ts, name, seq| {
            let mut x = rec(kind, ts, 1);
            (x.name, x.value) = (name, seq);
            x
        };
        let mem = |ts, id: u64, value: i64| {
            let mut m = rec(ffi::MT_MEM, ts, 1);
            (m.id, m.value, m.device_type, m.device_index) = (id, value, 0, 0);
            m
        };
        let r = vec![
            scope(ffi::MT_SCOPE_ENTER, 10, 1, 5),
            scope(ffi::MT_SCOPE_ENTER, 11, 2, 5),
            mem(12, 0x1000, 64),  // 0: a weight
            mem(13, 0x2000, 128), // 1: an activation
            scope(ffi::MT_SCOPE_EXIT, 14, 2, 7),
            scope(ffi::MT_SCOPE_EXIT, 15, 1, 8), // block made node 7 after block.fc returned
            mem(20, 0x2000, -128),               // its backward ran
            mem(21, 0x2000, 256),                // 3: a gradient at the same address
        ];
        let holder = |ts, ptr, kind, take, name, seq| MtHolder {
            ts_ns: ts,
            ptr,
            bytes: 0,
            seq,
            name,
            module: 0,
            kind,
            take,
            device_type: 0,
            device_index: 0,
            unused: 0,
        };
        let holders = vec![
            holder(16, 0x1000, ffi::MT_HOLDER_PARAMETER, 1, 3, -1),
            // Saved by the node with sequence number 6, made inside block.fc's forward.
            holder(16, 0x2000, ffi::MT_HOLDER_SAVED, 1, 4, 6),
            holder(19, 0x2000, ffi::MT_HOLDER_SAVED, 0, 4, 6),
            // Found when the backward that began at 17 ended: held since its allocation at 21.
            holder(22, 0x2000, ffi::MT_HOLDER_GRADIENT, 1, 3, 17),
            // State found after a step that began at 17: the weight's block is older, so held
            // from the look on.
            holder(22, 0x1000, ffi::MT_HOLDER_OPTIMIZER_STATE, 1, 4, 17),
            holder(22, 0x9000, ffi::MT_HOLDER_GRADIENT, 1, 3, -1), // nothing lives there
            // The activation's free waited for another stream: seen pending after it, and done
            // at a look after its address was taken again (no block to let go of: not counted).
            holder(20, 0x2000, ffi::MT_HOLDER_PENDING_FREE, 1, 0, -1),
            holder(23, 0x2000, ffi::MT_HOLDER_PENDING_FREE, 0, 0, -1),
        ];
        let captured = Captured { records: r, strings, start_ns: 10, holders, ..Default::default() };
        let t = assemble(&captured, TraceMeta::new(shared::model::SourceFormat::MemoryTracer));
        type Row<'t> = (u32, HolderKind, &'t str, &'t str, u64, Option<u64>);
        let got: Vec<Row> =
            t.event_holders.iter().map(|h| (h.event, h.kind, t.str(h.name), t.str(h.module), h.taken_ns, h.released_ns)).collect();
        assert_eq!(
            got,
            [
                (0, HolderKind::Parameter, "weight", "", 6, None),
                (0, HolderKind::OptimizerState, "ReluBackward0", "", 12, None),
                // Found at the look at 16, held since its allocation at 13 (its node's operator
                // was not recorded).
                (1, HolderKind::SavedForBackward, "ReluBackward0", "block.fc", 3, Some(9)),
                (1, HolderKind::PendingFree, "", "", 10, None),
                (3, HolderKind::Gradient, "weight", "", 11, None),
            ]
        );
        assert!(t.meta.warnings.iter().any(|w| w.starts_with("1 holder records named no allocation")), "{:?}", t.meta.warnings);
    }
}
