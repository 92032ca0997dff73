//! Joins the traces of one job's processes (torchrun ranks, one snapshot per rank) into one
//! trace: each input's devices become their own devices tagged with its rank, strings,
//! streams, stacks, tensors and threads are renumbered, and clocks are aligned on the inputs'
//! wall-clock starts (`TraceMeta::start_unix_ns`) when every input has one.
//!
//! Totals stay each device's own (every event carries its device's allocated and reserved
//! bytes as its source reported them), so each rank's peak in the merged trace is its peak
//! in its own trace, to the byte.

use crate::model::{Device, EventRecord, Frame, IterationSpan, Mark, StrId, Trace, TraceMeta, Totals};

/// One process's trace and its rank.
#[derive(Debug)]
pub struct MergeInput {
    pub trace: Trace,
    pub rank: u32,
    /// What to call it in warnings (a file name).
    pub label: String,
}

/// Why traces cannot be merged.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error("nothing to merge: expected at least one trace")]
    Empty,
    #[error("rank {0} is given twice ({1} and {2}); expected one trace per rank")]
    DuplicateRank(u32, String, String),
    #[error("the merged trace would have {0} devices; at most 256 fit")]
    TooManyDevices(usize),
}

/// Times at or past this (1973 in Unix nanoseconds) are wall-clock times, not times since the
/// trace's start.
const WALL_CLOCK_NS: i128 = 100_000_000_000_000_000;

/// Threads of different processes get distinct ids: the rank goes in the top bits.
fn thread_of(rank: u32, thread: u64) -> u64 {
    (u64::from(rank) + 1) << 48 | (thread & ((1 << 48) - 1))
}

/// Merges `inputs` (in any order) into one trace, ranks ascending.
pub fn merge(mut inputs: Vec<MergeInput>) -> Result<Trace, MergeError> {
    if inputs.is_empty() {
        return Err(MergeError::Empty);
    }
    inputs.sort_by_key(|i| i.rank);
    for w in inputs.windows(2) {
        if w[0].rank == w[1].rank {
            return Err(MergeError::DuplicateRank(w[0].rank, w[0].label.clone(), w[1].label.clone()));
        }
    }
    let devices: usize = inputs.iter().map(|i| i.trace.devices.len()).sum();
    if devices > 256 {
        return Err(MergeError::TooManyDevices(devices));
    }

    let first = &inputs[0].trace.meta;
    let mut meta = TraceMeta::new(first.source_format);
    meta.model = first.model.clone();
    meta.pytorch_version = first.pytorch_version.clone();
    meta.input_shape = first.input_shape.clone();
    meta.batch_size = first.batch_size;
    meta.fragmentation_tracked = inputs.iter().all(|i| i.trace.meta.fragmentation_tracked);
    // Where each input's time 0 lies on the wall clock: its start for traces timed from their
    // start (native capture), 0 for traces timed on the wall clock already (snapshots).
    let origin = |t: &Trace| -> Option<(i128, i128)> {
        let start = i128::from(t.meta.start_unix_ns?);
        let first = t.events.ts_ns.first().map_or(0, |&f| i128::from(f));
        Some(if first >= WALL_CLOCK_NS { (0, first) } else { (start, start) })
    };
    let aligned = inputs.iter().all(|i| origin(&i.trace).is_some());
    let start = inputs.iter().filter_map(|i| origin(&i.trace)).map(|(_, s)| s).min().unwrap_or(0);
    meta.start_unix_ns = aligned.then_some(start.max(0) as u64);
    let names: Vec<String> = inputs.iter().map(|i| i.trace.meta.device_name.clone().unwrap_or_default()).collect();
    if names.windows(2).all(|w| w[0] == w[1]) {
        meta.device_name = first.device_name.clone();
        meta.device_total_memory_bytes = first.device_total_memory_bytes;
    }
    if !aligned {
        let missing: Vec<&str> = inputs.iter().filter(|i| i.trace.meta.start_unix_ns.is_none()).map(|i| i.label.as_str()).collect();
        meta.warnings.push(format!(
            "clocks not aligned: {} record no wall-clock start, so every rank's time starts at 0",
            missing.join(", ")
        ));
    }
    let mut out = Trace::new(meta);

    // Per input: where its devices, streams and strings went, and its time offset.
    struct Map {
        devices: Vec<u8>,
        streams: Vec<u16>,
        strings: Vec<StrId>,
        /// Added to the input's times (may be negative for wall-clock-timed inputs).
        shift_ns: i128,
        tensors: u32,
        shapes: u32,
    }
    let mut maps = Vec::with_capacity(inputs.len());
    for input in &inputs {
        let t = &input.trace;
        let strings: Vec<StrId> = (0..t.strings.len()).map(|k| out.strings.intern(t.str(StrId(k as u32)))).collect();
        // A rank's snapshot lists every device of its host; only those it used come along.
        let used: Vec<bool> = (0..t.devices.len())
            .map(|k| {
                t.events.device.contains(&(k as u8))
                    || t.events.base_totals.get(k).is_some_and(|b| *b != Totals::default())
                    || t.initial_segments.iter().any(|s| s.device as usize == k)
                    || t.device_samples.iter().any(|s| s.device as usize == k)
            })
            .collect();
        let devices: Vec<u8> = t
            .devices
            .iter()
            .enumerate()
            .map(|(k, d)| {
                if !used[k] {
                    return u8::MAX;
                }
                let nd = out.device_index(Device { kind: d.kind.clone(), index: d.index, rank: Some(input.rank) });
                out.events.set_base_totals(nd as usize, t.events.base_totals.get(k).copied().unwrap_or_default());
                nd
            })
            .collect();
        let streams: Vec<u16> = t.streams.iter().map(|&s| out.stream_index(t.str(s))).collect();
        let shift_ns = match (aligned, origin(t)) {
            (true, Some((o, _))) => o - start,
            _ => 0,
        };
        for (k, v) in &t.meta.reported {
            out.meta.reported.insert(format!("rank{}.{k}", input.rank), *v);
        }
        for w in &t.meta.warnings {
            out.meta.warnings.push(format!("rank {}: {w}", input.rank));
        }
        out.dropped_events += t.dropped_events;
        maps.push(Map { devices, streams, strings, shift_ns, tensors: 0, shapes: 0 });
    }
    let at = |m: &Map, ts: u64| (i128::from(ts) + m.shift_ns).clamp(0, i128::from(u64::MAX)) as u64;
    let s = |m: &Map, id: StrId| if id == StrId::NONE { StrId::NONE } else { m.strings.get(id.0 as usize).copied().unwrap_or(StrId::NONE) };

    // Events, all inputs in time order, with each event's totals as its source had them.
    let mut order: Vec<(u64, usize, usize)> = Vec::new();
    let mut totals: Vec<Vec<Totals>> = Vec::with_capacity(inputs.len());
    for (k, input) in inputs.iter().enumerate() {
        let ev = &input.trace.events;
        let mut cur = ev.cursor();
        totals.push((0..ev.len()).map(|_| cur.advance()).collect());
        order.extend((0..ev.len()).map(|i| (at(&maps[k], ev.ts_ns[i]), k, i)));
    }
    order.sort_unstable();
    for (ts_ns, k, i) in order {
        let (t, m) = (&inputs[k].trace, &maps[k]);
        let rec = t.events.record(i);
        let new_index = out.events.len() as u32;
        out.events.push(EventRecord {
            ts_ns,
            layer: s(m, rec.layer),
            device: m.devices[rec.device as usize],
            stream: m.streams.get(rec.stream as usize).copied().unwrap_or(0),
            totals: Some(totals[k][i]),
            ..rec
        });
        if let Some(stack) = t.stacks.stack_of_event(i) {
            let frames: Vec<u32> = t
                .stacks
                .stack(stack)
                .map(|f| out.stacks.intern_frame(Frame { name: s(m, f.name), filename: s(m, f.filename), line: f.line }))
                .collect();
            let ns = out.stacks.intern_stack(frames);
            out.stacks.event_stacks.push((new_index, ns));
        }
    }

    // Operators, tensors, scopes, segments, samples, marks; iterations of the lowest rank.
    for (k, input) in inputs.iter().enumerate() {
        let t = &input.trace;
        let m = &mut maps[k];
        m.tensors = out.tensors.len() as u32;
        m.shapes = out.shapes.len() as u32;
        out.shapes.extend(t.shapes.iter().cloned());
        out.tensors.extend(t.tensors.iter().map(|x| {
            let mut x = *x;
            if x.shape != u32::MAX {
                x.shape += m.shapes;
            }
            x
        }));
        let m = &maps[k];
        for o in &t.ops {
            let mut o = o.clone();
            o.name = s(m, o.name);
            o.layer = s(m, o.layer);
            o.start_ns = at(m, o.start_ns);
            o.end_ns = at(m, o.end_ns);
            o.thread = thread_of(input.rank, o.thread);
            if o.fwd_thread != 0 {
                o.fwd_thread = thread_of(input.rank, o.fwd_thread);
            }
            o.inputs = (o.inputs.0 + m.tensors, o.inputs.1 + m.tensors);
            o.outputs = (o.outputs.0 + m.tensors, o.outputs.1 + m.tensors);
            out.ops.push(o);
        }
        for sc in &t.scopes {
            let mut sc = sc.clone();
            sc.name = s(m, sc.name);
            sc.start_ns = at(m, sc.start_ns);
            sc.end_ns = at(m, sc.end_ns);
            sc.thread = thread_of(input.rank, sc.thread);
            out.scopes.push(sc);
        }
        for seg in &t.initial_segments {
            let mut seg = seg.clone();
            seg.device = m.devices[seg.device as usize];
            seg.stream = m.streams.get(seg.stream as usize).copied().unwrap_or(0);
            out.initial_segments.push(seg);
        }
        for d in &t.device_samples {
            let mut d = *d;
            d.device = m.devices[d.device as usize];
            d.ts_ns = at(m, d.ts_ns);
            out.device_samples.push(d);
        }
        for mk in &t.marks {
            out.marks.push(Mark { ts_ns: at(m, mk.ts_ns), name: s(m, mk.name), value: mk.value });
        }
        if k == 0 {
            out.iterations = t.iterations.iter().map(|it| IterationSpan { index: it.index, start_ns: at(m, it.start_ns), end_ns: at(m, it.end_ns) }).collect();
        }
    }
    out.ops.sort_by_key(|o| o.start_ns);
    out.scopes.sort_by_key(|x| (x.start_ns, x.depth));
    out.marks.sort_by_key(|x| x.ts_ns);
    out.device_samples.sort_by_key(|x| x.ts_ns);
    out.finish();
    Ok(out)
}
