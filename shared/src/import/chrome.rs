//! Importer of torch.profiler Chrome traces (`export_chrome_trace`, `.json` / `.json.gz`).
//!
//! Memory comes from `[memory]` instant events (`Bytes` negative on free, `Total Allocated`,
//! `Total Reserved`, `Device Type`/`Device Id`, `Addr`). Operators come from `cpu_op` slices
//! (`Sequence number`, `Fwd thread id`, `Input Dims`), scopes from `user_annotation` slices
//! (`Optimizer.step#...`, `ProfilerStep#N`) and `nn.Module: ...` python_function slices
//! (`with_modules`). A memory event's layer is the innermost module around it or, in traces
//! without module events, the outermost operator or annotation around it on its thread.

use super::ImportError;
use crate::model::{
    Device, EventRecord, EventType, LayerScope, OperatorEvent, Phase, SourceFormat, StrId, TensorRef, Totals, Trace, TraceMeta,
};
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::collections::HashMap;
use std::io::Read;

#[derive(Deserialize)]
struct DeviceProperties {
    #[serde(default)]
    name: Option<String>,
    #[serde(rename = "totalGlobalMem", default)]
    total_global_mem: Option<u64>,
}

#[derive(Deserialize, Default)]
struct RawEvent {
    #[serde(default)]
    ph: Option<String>,
    #[serde(default)]
    cat: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    tid: Option<Tid>,
    #[serde(default)]
    ts: Option<f64>,
    #[serde(default)]
    dur: Option<f64>,
    #[serde(default)]
    args: Option<RawArgs>,
}

#[derive(Deserialize, Default)]
struct RawArgs {
    #[serde(rename = "Total Reserved", default)]
    total_reserved: Option<i64>,
    #[serde(rename = "Total Allocated", default)]
    total_allocated: Option<i64>,
    #[serde(rename = "Bytes", default)]
    bytes: Option<i64>,
    #[serde(rename = "Device Id", default)]
    device_id: Option<i64>,
    #[serde(rename = "Device Type", default)]
    device_type: Option<i64>,
    #[serde(rename = "Addr", default)]
    addr: Option<i64>,
    #[serde(rename = "Sequence number", default)]
    sequence_number: Option<i64>,
    #[serde(rename = "Fwd thread id", default)]
    fwd_thread_id: Option<i64>,
    #[serde(rename = "Input Dims", default)]
    input_dims: Option<serde_json::Value>,
    #[serde(rename = "Input type", default)]
    input_type: Option<serde_json::Value>,
}

/// A thread id as the importer keys it: an integer as is (negative ones as their two's
/// complement), a named lane ("Spans") hashed to a stable id, anything else 0. Read without
/// building a `serde_json::Value`, so an odd `tid` costs nothing to skip.
struct Tid(u64);

impl<'de> Deserialize<'de> for Tid {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Tid;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a thread id")
            }
            fn visit_u64<E>(self, v: u64) -> Result<Tid, E> {
                Ok(Tid(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Tid, E> {
                Ok(Tid(v as u64))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Tid, E> {
                Ok(Tid(0))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Tid, E> {
                Ok(Tid(0))
            }
            fn visit_str<E>(self, s: &str) -> Result<Tid, E> {
                Ok(Tid(s.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3))))
            }
            fn visit_unit<E>(self) -> Result<Tid, E> {
                Ok(Tid(0))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Tid, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Tid(0))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Tid, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Tid(0))
            }
        }
        d.deserialize_any(V)
    }
}

fn thread_key(v: &Option<Tid>) -> u64 {
    v.as_ref().map_or(0, |t| t.0)
}

/// A `[memory]` event, kept (the rest of its event is dropped as it is read).
struct MemRec {
    ts_ns: u64,
    tid: u64,
    args: Option<MemArgs>,
}

struct MemArgs {
    total_reserved: Option<i64>,
    total_allocated: Option<i64>,
    bytes: Option<i64>,
    device_id: Option<i64>,
    device_type: Option<i64>,
    addr: Option<i64>,
}

/// Most devices a trace may name (device indices are stored in a byte).
const MAX_DEVICES: usize = 256;

/// Longest module path made by joining nested `nn.Module` names. Real paths are a few hundred
/// bytes; past this a module's events keep its parent's path, so that deep nesting costs
/// neither quadratic time nor quadratic memory.
const MAX_MODULE_PATH_BYTES: usize = 1024;

fn ts_ns(us: f64) -> u64 {
    if us.is_finite() && us > 0.0 {
        (us * 1000.0).round() as u64
    } else {
        0
    }
}

fn dtype_bytes(t: &str) -> u64 {
    match t {
        "double" | "long int" | "c10::complex<float>" | "long" | "int64" => 8,
        "float" | "int" | "unsigned int" => 4,
        "c10::Half" | "c10::BFloat16" | "short int" | "short" => 2,
        "bool" | "unsigned char" | "signed char" | "c10::Float8_e4m3fn" | "c10::Float8_e5m2" => 1,
        "c10::complex<double>" => 16,
        _ => 0,
    }
}

struct Slice {
    start_ns: u64,
    end_ns: u64,
    name: StrId,
    kind: SliceKind,
    /// Index into `trace.ops` for operators.
    op: Option<usize>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum SliceKind {
    Op,
    Annotation,
    Module,
}

/// What reading the events builds, one event at a time: no event is kept whole, so a trace
/// costs what its slices and memory events cost, not what its JSON would as values.
struct Reading {
    trace: Trace,
    slices: HashMap<u64, Vec<Slice>>,
    memory: Vec<MemRec>,
    shapes: HashMap<Vec<i64>, u32>,
    has_modules: bool,
    /// Events read so far (error paths name the event).
    events_read: usize,
    device: Option<DeviceProperties>,
    /// The importer's own error, which stopped the parse.
    failed: Option<ImportError>,
}

impl Reading {
    fn event(&mut self, i: usize, e: RawEvent) -> Result<(), ImportError> {
        let ph = e.ph.as_deref().unwrap_or("");
        let name = e.name.as_deref().unwrap_or("");
        let cat = e.cat.as_deref().unwrap_or("");
        let tid = thread_key(&e.tid);
        if name == "[memory]" {
            let Some(ts) = e.ts else {
                return Err(ImportError::Chrome {
                    path: format!("traceEvents[{i}].ts"),
                    reason: "a [memory] event has no timestamp".into(),
                });
            };
            let args = e.args.map(|a| MemArgs {
                total_reserved: a.total_reserved,
                total_allocated: a.total_allocated,
                bytes: a.bytes,
                device_id: a.device_id,
                device_type: a.device_type,
                addr: a.addr,
            });
            self.memory.push(MemRec { ts_ns: ts_ns(ts), tid, args });
            return Ok(());
        }
        if ph != "X" {
            return Ok(());
        }
        let (Some(ts), Some(dur)) = (e.ts, e.dur) else { return Ok(()) };
        let start_ns = ts_ns(ts);
        let end_ns = start_ns.saturating_add(ts_ns(dur.max(0.0)));
        let kind = match cat {
            "cpu_op" => SliceKind::Op,
            "user_annotation" => SliceKind::Annotation,
            "python_function" if name.starts_with("nn.Module: ") => {
                self.has_modules = true;
                SliceKind::Module
            }
            _ => return Ok(()),
        };
        let name_id = self.trace.strings.intern(name.strip_prefix("nn.Module: ").unwrap_or(name));
        let op = if kind == SliceKind::Op {
            let args = e.args.as_ref();
            let t0 = self.trace.tensors.len() as u32;
            if let Some(serde_json::Value::Array(dims)) = args.and_then(|a| a.input_dims.as_ref()) {
                let types = match args.and_then(|a| a.input_type.as_ref()) {
                    Some(serde_json::Value::Array(t)) => t.as_slice(),
                    _ => &[],
                };
                for (k, d) in dims.iter().enumerate() {
                    let serde_json::Value::Array(d) = d else { continue };
                    let Some(shape) = d.iter().map(|x| x.as_i64()).collect::<Option<Vec<i64>>>() else { continue };
                    let ty = types.get(k).and_then(|t| t.as_str()).unwrap_or("");
                    let elem = dtype_bytes(ty);
                    if elem == 0 {
                        continue; // scalars, lists and unknown types are not tensors we can size
                    }
                    let numel = shape.iter().try_fold(1u64, |acc, &x| acc.checked_mul(x.max(0) as u64)).unwrap_or(0);
                    let next = self.trace.shapes.len() as u32;
                    let sid = *self.shapes.entry(shape.clone()).or_insert_with(|| {
                        self.trace.shapes.push(shape);
                        next
                    });
                    self.trace.tensors.push(TensorRef { storage_id: 0, size_bytes: numel.saturating_mul(elem), shape: sid });
                }
            }
            let t1 = self.trace.tensors.len() as u32;
            self.trace.ops.push(OperatorEvent {
                name: name_id,
                phase: Phase::Other,
                seq_nr: args.and_then(|a| a.sequence_number).unwrap_or(-1),
                start_ns,
                end_ns,
                thread: tid,
                fwd_thread: args.and_then(|a| a.fwd_thread_id).unwrap_or(0).max(0) as u64,
                layer: StrId::NONE,
                inputs: (t0, t1),
                outputs: (t1, t1),
            });
            Some(self.trace.ops.len() - 1)
        } else {
            None
        };
        self.slices.entry(tid).or_default().push(Slice { start_ns, end_ns, name: name_id, kind, op });
        Ok(())
    }
}

/// The list of events, handed to [`Reading::event`] as each is parsed.
struct Events<'r>(&'r mut Reading);

impl<'de> DeserializeSeed<'de> for Events<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Events<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of trace events")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(e) = seq.next_element::<RawEvent>()? {
            let i = self.0.events_read;
            self.0.events_read += 1;
            if let Err(err) = self.0.event(i, e) {
                self.0.failed = Some(err);
                return Err(serde::de::Error::custom("stopped by the importer"));
            }
        }
        Ok(())
    }
}

/// `deviceProperties`: the first device is kept, the rest skipped.
struct FirstDevice<'r>(&'r mut Reading);

impl<'de> DeserializeSeed<'de> for FirstDevice<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for FirstDevice<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of device properties")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if let Some(first) = seq.next_element::<DeviceProperties>()? {
            self.0.device.get_or_insert(first);
        }
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(())
    }
}

/// The whole file: `{"traceEvents": [...], "deviceProperties": [...], ...}` or a bare list of
/// events, parsed as it streams by (an untagged enum would buffer the whole document first).
struct File<'r>(&'r mut Reading);

impl<'de> DeserializeSeed<'de> for File<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for File<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an object with \"traceEvents\" or a list of events")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<(), A::Error> {
        Events(self.0).visit_seq(seq)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        use serde::de::Error;
        let (mut events, mut devices) = (false, false);
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match key.as_ref() {
                "traceEvents" if events => return Err(A::Error::duplicate_field("traceEvents")),
                "traceEvents" => {
                    events = true;
                    map.next_value_seed(Events(&mut *self.0))?;
                }
                "deviceProperties" if devices => return Err(A::Error::duplicate_field("deviceProperties")),
                "deviceProperties" => {
                    devices = true;
                    map.next_value_seed(FirstDevice(&mut *self.0))?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        if !events {
            return Err(A::Error::missing_field("traceEvents"));
        }
        Ok(())
    }
}

/// Imports a Chrome trace.
pub fn import(data: &[u8]) -> Result<Trace, ImportError> {
    read(serde_json::Deserializer::from_slice(data))
}

/// Imports a Chrome trace from a reader, parsing as the bytes arrive: the document is never
/// held whole (gzip input streams through here). I/O errors come back as
/// [`ImportError::Read`].
pub fn import_reader(reader: impl Read) -> Result<Trace, ImportError> {
    read(serde_json::Deserializer::from_reader(std::io::BufReader::with_capacity(64 << 10, reader)))
}

/// Parses a Chrome trace, then places its slices and memory events into the trace in stages.
fn read<'de, R: serde_json::de::Read<'de>>(de: serde_json::Deserializer<R>) -> Result<Trace, ImportError> {
    let Reading { mut trace, mut slices, mut memory, has_modules, device, .. } = parse(de)?;
    if let Some(p) = device {
        trace.meta.device_name = p.name;
        trace.meta.device_total_memory_bytes = p.total_global_mem;
    }
    let contexts = attribute_slices(&mut trace, &mut slices, &mut memory, has_modules);
    memory_events(&mut trace, &memory, &contexts)?;
    if !trace.events.is_empty() && trace.streams.is_empty() {
        trace.stream_index("default");
    }
    let bases = bases_before_first_events(&trace);
    rebase(&mut trace, bases);
    trace.scopes.sort_by_key(|s| (s.start_ns, std::cmp::Reverse(s.end_ns)));
    trace.ops.sort_by_key(|o| (o.start_ns, std::cmp::Reverse(o.end_ns)));
    trace.finish();
    Ok(trace)
}

/// Takes the JSON document; gives what reading its events kept (operators and module paths
/// already in the trace, slices by thread, `[memory]` events), or the first error.
fn parse<'de, R: serde_json::de::Read<'de>>(mut de: serde_json::Deserializer<R>) -> Result<Reading, ImportError> {
    let mut r = Reading {
        trace: Trace::new(TraceMeta::new(SourceFormat::ChromeTrace)),
        slices: HashMap::new(),
        memory: Vec::new(),
        shapes: HashMap::new(),
        has_modules: false,
        events_read: 0,
        device: None,
        failed: None,
    };
    let parsed = File(&mut r).deserialize(&mut de).and_then(|()| de.end());
    if let Some(e) = r.failed.take() {
        return Err(e);
    }
    parsed.map_err(|e| {
        if e.is_io() {
            ImportError::Read { reason: e.to_string() }
        } else if e.is_data() {
            // Typed parsing failed on a valid JSON document: say what shape was expected.
            ImportError::Chrome {
                path: format!("line {} column {}", e.line(), e.column()),
                reason: format!("expected a torch.profiler trace ({{\"traceEvents\": [...]}}): {e}"),
            }
        } else {
            ImportError::json(&e)
        }
    })?;
    Ok(r)
}

/// The phase and layer that a memory event, an op or a scope ran in.
#[derive(Clone, Copy)]
struct Context {
    phase: Phase,
    layer: StrId,
}

const NO_CONTEXT: Context = Context { phase: Phase::Other, layer: StrId::NONE };

/// Phase a slice's name sets for what runs inside it: inside an autograd node = backward,
/// inside Optimizer.step = optimizer, inside zero_grad = other; `None`: its parent's.
fn phase_of_name(trace: &Trace, id: StrId) -> Option<Phase> {
    let n = trace.str(id);
    if n.starts_with("autograd::engine::evaluate_function") {
        Some(Phase::Backward)
    } else if n.starts_with("Optimizer.step") {
        Some(Phase::Optimizer)
    } else if n.starts_with("Optimizer.zero_grad") {
        Some(Phase::Other)
    } else {
        None
    }
}

/// Takes the slices by thread and the memory events; sorts both by time, gives every op its
/// phase and layer, adds a scope per module or annotation slice, and gives the context of each
/// memory event (in the sorted order). Memory events on threads without slices keep
/// [`NO_CONTEXT`].
fn attribute_slices(trace: &mut Trace, slices: &mut HashMap<u64, Vec<Slice>>, memory: &mut [MemRec], has_modules: bool) -> Vec<Context> {
    let mut tids: Vec<u64> = slices.keys().copied().collect();
    tids.sort_unstable();
    for list in slices.values_mut() {
        list.sort_by_key(|s| (s.start_ns, std::cmp::Reverse(s.end_ns)));
    }
    memory.sort_by_key(|m| m.ts_ns);
    // Memory events grouped by thread, keeping their global order index.
    let mut mem_by_tid: HashMap<u64, Vec<usize>> = HashMap::new();
    for (k, rec) in memory.iter().enumerate() {
        mem_by_tid.entry(rec.tid).or_default().push(k);
    }
    let mut contexts = vec![NO_CONTEXT; memory.len()];
    for tid in &tids {
        let list = &slices[tid];
        let mem = mem_by_tid.get(tid).map(Vec::as_slice).unwrap_or(&[]);
        let module_path = if has_modules { module_paths(trace, list) } else { Vec::new() };
        walk_thread(trace, ThreadSlices { tid: *tid, list, module_path: &module_path }, memory, mem, &mut contexts);
    }
    contexts
}

/// Takes one thread's slices in start order; gives the module path of the stack as each slice
/// is pushed (`StrId::NONE`: no module), built from its parent's path so that deep nesting
/// costs one join per slice. Interned in slice order, so the string table reads as it always
/// has.
fn module_paths(trace: &mut Trace, list: &[Slice]) -> Vec<StrId> {
    let mut module_path: Vec<StrId> = Vec::with_capacity(list.len());
    let mut st: Vec<usize> = Vec::new();
    for (i, s) in list.iter().enumerate() {
        while st.last().is_some_and(|&t| list[t].end_ns <= s.start_ns) {
            st.pop();
        }
        let parent = st.last().map_or(StrId::NONE, |&t| module_path[t]);
        let path = if s.kind != SliceKind::Module {
            parent
        } else if parent == StrId::NONE {
            s.name
        } else {
            let (head, name) = (trace.str(parent), trace.str(s.name));
            if head.len() + 1 + name.len() > MAX_MODULE_PATH_BYTES {
                parent
            } else {
                let joined = format!("{head}.{name}");
                trace.strings.intern(&joined)
            }
        };
        module_path.push(path);
        st.push(i);
    }
    module_path
}

/// One thread's slices, sorted by start, with their module paths (empty without modules).
struct ThreadSlices<'a> {
    tid: u64,
    list: &'a [Slice],
    module_path: &'a [StrId],
}

/// Takes one thread's slices and its memory events (`mem`, indices into `memory` in time
/// order); sets the context of its ops, pushes its scopes, and writes the context of each
/// of its memory events into `contexts`.
fn walk_thread(trace: &mut Trace, thread: ThreadSlices, memory: &[MemRec], mem: &[usize], contexts: &mut [Context]) {
    let list = thread.list;
    // The open slices, each with the context it gives what runs inside it: the phase of its
    // innermost autograd/optimizer ancestor (else forward) and its layer (the module path,
    // else the outermost slice's name).
    struct Open {
        slice: usize,
        context: Context,
    }
    let mut stack: Vec<Open> = Vec::new();
    let mut m = 0;
    // One pass over the slices and a final step (`None`) that drains the memory events after
    // the last slice starts.
    for (i, s) in list.iter().map(Some).chain(std::iter::once(None)).enumerate() {
        // Memory events before this slice starts see the current stack.
        while m < mem.len() && s.is_none_or(|s| memory[mem[m]].ts_ns < s.start_ns) {
            let ts = memory[mem[m]].ts_ns;
            while stack.last().is_some_and(|t| list[t.slice].end_ns < ts) {
                stack.pop();
            }
            contexts[mem[m]] = stack.last().map_or(NO_CONTEXT, |t| t.context);
            m += 1;
        }
        let Some(s) = s else { break };
        while stack.last().is_some_and(|t| list[t.slice].end_ns <= s.start_ns) {
            stack.pop();
        }
        let phase = phase_of_name(trace, s.name).unwrap_or(stack.last().map_or(Phase::Forward, |t| t.context.phase));
        let path = thread.module_path.get(i).copied().unwrap_or(StrId::NONE);
        let layer = if path != StrId::NONE { path } else { stack.first().map_or(s.name, |t| list[t.slice].name) };
        stack.push(Open { slice: i, context: Context { phase, layer } });
        if let Some(op) = s.op {
            trace.ops[op].phase = phase;
            trace.ops[op].layer = layer;
        }
        if s.kind != SliceKind::Op {
            trace.scopes.push(LayerScope {
                name: if s.kind == SliceKind::Module { layer } else { s.name },
                start_ns: s.start_ns,
                end_ns: s.end_ns,
                depth: (stack.len() - 1).min(u16::MAX as usize) as u16,
                phase,
                thread: thread.tid,
            });
        }
    }
}

/// Takes the `[memory]` events in time order and their contexts; gives the trace an event
/// for each, on a device per (Device Type, Device Id).
fn memory_events(trace: &mut Trace, memory: &[MemRec], contexts: &[Context]) -> Result<(), ImportError> {
    let mut devices: HashMap<(i64, i64), u8> = HashMap::new();
    for (rec, context) in memory.iter().zip(contexts) {
        let ts = rec.ts_ns;
        let a = rec.args.as_ref().ok_or_else(|| ImportError::Chrome {
            path: "traceEvents[[memory]].args".into(),
            reason: "a [memory] event has no args".into(),
        })?;
        let bytes = a.bytes.ok_or_else(|| ImportError::Chrome {
            path: format!("[memory] event at ts {}µs: args.Bytes", ts as f64 / 1000.0),
            reason: "expected the number of bytes allocated (positive) or freed (negative), found none".into(),
        })?;
        let dtype = a.device_type.unwrap_or(0);
        let did = a.device_id.unwrap_or(-1);
        let dev = match devices.get(&(dtype, did)) {
            Some(&d) => d,
            None => {
                if trace.devices.len() >= MAX_DEVICES {
                    return Err(ImportError::Chrome {
                        path: format!("[memory] event at ts {}µs: args.Device Id", ts as f64 / 1000.0),
                        reason: format!("more than {MAX_DEVICES} distinct devices (Device Type, Device Id)"),
                    });
                }
                let kind = match dtype {
                    0 => "cpu",
                    1 => "cuda",
                    _ => "device",
                };
                let d = trace.device_index(Device { kind: kind.into(), index: if dtype == 0 { -1 } else { did as i32 }, rank: None });
                devices.insert((dtype, did), d);
                d
            }
        };
        let totals = match (a.total_allocated, a.total_reserved) {
            (Some(al), rs) => Some(Totals { allocated_bytes: al.max(0) as u64, reserved_bytes: rs.unwrap_or(0).max(0) as u64 }),
            _ => None,
        };
        trace.events.push(EventRecord {
            ts_ns: ts,
            event_type: if bytes >= 0 { EventType::Alloc } else { EventType::Free },
            phase: context.phase,
            size_bytes: bytes.unsigned_abs(),
            address: a.addr.unwrap_or(0) as u64,
            layer: context.layer,
            device: dev,
            stream: 0,
            totals,
        });
    }
    Ok(())
}

/// Takes the trace with its events; gives each device's base totals: the first memory event's
/// totals include memory from before profiling began, so the base is its totals minus its own
/// delta, and derived values agree from the start.
fn bases_before_first_events(trace: &Trace) -> Vec<Totals> {
    let mut seen = vec![false; trace.devices.len()];
    let mut bases = trace.events.base_totals.clone();
    let mut cursor = trace.events.cursor();
    for i in 0..trace.events.len() {
        let t = cursor.advance();
        let d = trace.events.device[i] as usize;
        if !seen[d] {
            seen[d] = true;
            let s = trace.events.size_bytes[i];
            let (al, rs) = (t.allocated_bytes, t.reserved_bytes);
            bases[d] = match trace.events.event_type(i) {
                EventType::Alloc => Totals { allocated_bytes: al.saturating_sub(s), reserved_bytes: rs },
                _ => Totals { allocated_bytes: al + s, reserved_bytes: rs },
            };
        }
    }
    bases
}

/// Sets new base totals and drops overrides that the running sum now predicts.
fn rebase(trace: &mut Trace, bases: Vec<Totals>) {
    let events = std::mem::take(&mut trace.events);
    let mut cursor = events.cursor();
    let totals: Vec<Totals> = (0..events.len()).map(|_| cursor.advance()).collect();
    drop(cursor);
    let mut fresh = crate::model::EventStore::new(bases);
    for (i, t) in totals.into_iter().enumerate() {
        fresh.push(EventRecord { totals: Some(t), ..events.record(i) });
    }
    trace.events = fresh;
}
