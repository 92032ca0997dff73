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
    Device, EventRecord, EventType, LayerScope, OperatorEvent, Phase, SourceFormat, StrId, TensorRef, Totals, Trace,
    TraceMeta,
};
use serde::Deserialize;
use std::collections::HashMap;

#[derive(Deserialize)]
#[serde(untagged)]
enum ChromeFile {
    Object {
        #[serde(rename = "traceEvents")]
        trace_events: Vec<RawEvent>,
        #[serde(rename = "deviceProperties", default)]
        device_properties: Vec<DeviceProperties>,
    },
    Array(Vec<RawEvent>),
}

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
    tid: Option<serde_json::Value>,
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

fn thread_key(v: &Option<serde_json::Value>) -> u64 {
    match v {
        Some(serde_json::Value::Number(n)) => n.as_u64().or_else(|| n.as_i64().map(|i| i as u64)).unwrap_or(0),
        Some(serde_json::Value::String(s)) => {
            // Named lanes ("Spans"): hash to a stable id.
            s.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3))
        }
        _ => 0,
    }
}

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

/// Imports a Chrome trace.
pub fn import(data: &[u8]) -> Result<Trace, ImportError> {
    let file: ChromeFile = serde_json::from_slice(data).map_err(|e| {
        if e.is_data() {
            // Typed parsing failed on a valid JSON document: say what shape was expected.
            ImportError::Chrome {
                path: format!("line {} column {}", e.line(), e.column()),
                reason: format!("expected a torch.profiler trace ({{\"traceEvents\": [...]}}): {e}"),
            }
        } else {
            ImportError::json(&e)
        }
    })?;
    let (events, props) = match file {
        ChromeFile::Object {
            trace_events,
            device_properties,
        } => (trace_events, device_properties),
        ChromeFile::Array(a) => (a, Vec::new()),
    };
    let mut meta = TraceMeta::new(SourceFormat::ChromeTrace);
    if let Some(p) = props.first() {
        meta.device_name = p.name.clone();
        meta.device_total_memory_bytes = p.total_global_mem;
    }
    let mut trace = Trace::new(meta);

    // Slices per thread.
    let mut slices: HashMap<u64, Vec<Slice>> = HashMap::new();
    let mut memory: Vec<(u64, u64, &RawEvent)> = Vec::new(); // (ts, tid, event)
    let mut shapes: HashMap<Vec<i64>, u32> = HashMap::new();
    let mut has_modules = false;
    for (i, e) in events.iter().enumerate() {
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
            memory.push((ts_ns(ts), tid, e));
            continue;
        }
        if ph != "X" {
            continue;
        }
        let (Some(ts), Some(dur)) = (e.ts, e.dur) else { continue };
        let start_ns = ts_ns(ts);
        let end_ns = start_ns.saturating_add(ts_ns(dur.max(0.0)));
        let kind = match cat {
            "cpu_op" => SliceKind::Op,
            "user_annotation" => SliceKind::Annotation,
            "python_function" if name.starts_with("nn.Module: ") => {
                has_modules = true;
                SliceKind::Module
            }
            _ => continue,
        };
        let name_id = trace.strings.intern(name.strip_prefix("nn.Module: ").unwrap_or(name));
        let op = if kind == SliceKind::Op {
            let args = e.args.as_ref();
            let t0 = trace.tensors.len() as u32;
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
                    let next = trace.shapes.len() as u32;
                    let sid = *shapes.entry(shape.clone()).or_insert_with(|| {
                        trace.shapes.push(shape);
                        next
                    });
                    trace.tensors.push(TensorRef {
                        storage_id: 0,
                        size_bytes: numel.saturating_mul(elem),
                        shape: sid,
                    });
                }
            }
            let t1 = trace.tensors.len() as u32;
            trace.ops.push(OperatorEvent {
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
            Some(trace.ops.len() - 1)
        } else {
            None
        };
        slices.entry(tid).or_default().push(Slice {
            start_ns,
            end_ns,
            name: name_id,
            kind,
            op,
        });
    }

    // Phase of each slice: inside an autograd node = backward, inside Optimizer.step = optimizer,
    // inside zero_grad = other, otherwise forward.
    let mut tids: Vec<u64> = slices.keys().copied().collect();
    tids.sort_unstable();
    for list in slices.values_mut() {
        list.sort_by_key(|s| (s.start_ns, std::cmp::Reverse(s.end_ns)));
    }
    let phase_of_name = |trace: &Trace, id: StrId| -> Option<Phase> {
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
    };
    memory.sort_by_key(|&(ts, _, _)| ts);
    // Memory events grouped by thread, keeping their global order index.
    let mut mem_by_tid: HashMap<u64, Vec<usize>> = HashMap::new();
    for (k, &(_, tid, _)) in memory.iter().enumerate() {
        mem_by_tid.entry(tid).or_default().push(k);
    }
    let mut mem_ctx: Vec<(Phase, StrId)> = vec![(Phase::Other, StrId::NONE); memory.len()];
    for tid in &tids {
        let list = &slices[tid];
        let mem = mem_by_tid.get(tid).map(Vec::as_slice).unwrap_or(&[]);
        let mut stack: Vec<usize> = Vec::new();
        let mut m = 0;
        let context = |stack: &[usize], trace: &Trace| -> (Phase, StrId) {
            let mut phase = Phase::Forward;
            for &s in stack {
                if let Some(p) = phase_of_name(trace, list[s].name) {
                    phase = p;
                }
            }
            let module = stack.iter().rev().find(|&&s| list[s].kind == SliceKind::Module).map(|&s| list[s].name);
            let module_path = match module {
                Some(_) => {
                    let path: Vec<&str> = stack
                        .iter()
                        .filter(|&&s| list[s].kind == SliceKind::Module)
                        .map(|&s| trace.str(list[s].name))
                        .collect();
                    Some(path.join("."))
                }
                None => None,
            };
            let outer = stack.first().map(|&s| list[s].name).unwrap_or(StrId::NONE);
            let layer = match module_path {
                Some(p) => trace.strings.lookup(&p).unwrap_or(StrId::NONE),
                None => outer,
            };
            (phase, layer)
        };
        // Module paths must be interned before lookups; do it in a first pass.
        if has_modules {
            let mut st: Vec<usize> = Vec::new();
            let mut paths = Vec::new();
            for (i, s) in list.iter().enumerate() {
                while st.last().is_some_and(|&t| list[t].end_ns <= s.start_ns) {
                    st.pop();
                }
                st.push(i);
                let path: Vec<&str> = st
                    .iter()
                    .filter(|&&t| list[t].kind == SliceKind::Module)
                    .map(|&t| trace.str(list[t].name))
                    .collect();
                if !path.is_empty() {
                    paths.push(path.join("."));
                }
            }
            for p in paths {
                trace.strings.intern(&p);
            }
        }
        // One pass over the slices and a final step (`None`) that drains the memory events
        // after the last slice starts.
        for (i, s) in list.iter().map(Some).chain(std::iter::once(None)).enumerate() {
            // Memory events before this slice starts see the current stack.
            while m < mem.len() && s.is_none_or(|s| memory[mem[m]].0 < s.start_ns) {
                let ts = memory[mem[m]].0;
                while stack.last().is_some_and(|&t| list[t].end_ns < ts) {
                    stack.pop();
                }
                let (phase, layer) = context(&stack, &trace);
                mem_ctx[mem[m]] = (if stack.is_empty() { Phase::Other } else { phase }, layer);
                m += 1;
            }
            let Some(s) = s else { break };
            while stack.last().is_some_and(|&t| list[t].end_ns <= s.start_ns) {
                stack.pop();
            }
            stack.push(i);
            let (phase, layer) = context(&stack, &trace);
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
                    phase: phase_of_name(&trace, s.name).unwrap_or(phase),
                    thread: *tid,
                });
            }
        }
    }
    // Memory events on threads without slices keep (Other, none).

    let mut devices: HashMap<(i64, i64), u8> = HashMap::new();
    for (k, &(ts, _, e)) in memory.iter().enumerate() {
        let a = e.args.as_ref().ok_or_else(|| ImportError::Chrome {
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
                let kind = match dtype {
                    0 => "cpu",
                    1 => "cuda",
                    _ => "device",
                };
                let d = trace.device_index(Device {
                    kind: kind.into(),
                    index: if dtype == 0 { -1 } else { did as i32 },
                    rank: None,
                });
                devices.insert((dtype, did), d);
                d
            }
        };
        let totals = match (a.total_allocated, a.total_reserved) {
            (Some(al), rs) => Some(Totals {
                allocated_bytes: al.max(0) as u64,
                reserved_bytes: rs.unwrap_or(0).max(0) as u64,
            }),
            _ => None,
        };
        let (phase, layer) = mem_ctx[k];
        trace.events.push(EventRecord {
            ts_ns: ts,
            event_type: if bytes >= 0 { EventType::Alloc } else { EventType::Free },
            phase,
            size_bytes: bytes.unsigned_abs(),
            address: a.addr.unwrap_or(0) as u64,
            layer,
            device: dev,
            stream: 0,
            totals,
        });
    }
    if !trace.events.is_empty() && trace.streams.is_empty() {
        trace.stream_index("default");
    }
    // The first memory event's totals include memory from before profiling began: make the
    // base equal to its totals minus its own delta, so that derived values agree from the start.
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
    drop(cursor);
    rebase(&mut trace, bases);
    trace.scopes.sort_by_key(|s| (s.start_ns, std::cmp::Reverse(s.end_ns)));
    trace.ops.sort_by_key(|o| (o.start_ns, std::cmp::Reverse(o.end_ns)));
    trace.finish();
    Ok(trace)
}

/// Sets new base totals and drops overrides that the running sum now predicts.
fn rebase(trace: &mut Trace, bases: Vec<Totals>) {
    let events = std::mem::take(&mut trace.events);
    let mut cursor = events.cursor();
    let totals: Vec<Totals> = (0..events.len()).map(|_| cursor.advance()).collect();
    drop(cursor);
    let mut fresh = crate::model::EventStore::new(bases);
    for (i, t) in totals.into_iter().enumerate() {
        fresh.push(EventRecord {
            totals: Some(t),
            ..events.record(i)
        });
    }
    trace.events = fresh;
}
