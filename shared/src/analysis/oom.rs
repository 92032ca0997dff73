//! Out-of-memory explanation: for a trace that records an out-of-memory (snapshots' `oom`
//! actions, the native capture's failing allocation), every out-of-memory listed with its
//! request (a program that catches one and retries hits several), and for the last one, the
//! one the program saw last: the request that failed, what was live
//! at that moment by layer, by the phase that allocated it and by innermost frame, and how
//! much the allocator held but could not use: reserved minus allocated, and the largest free
//! block of its segments, where the trace has segments.

use super::{live_allocations_at, segments_at};
use crate::model::{BlockState, EventType, Phase, Trace};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// What was live at the out-of-memory, one group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OomGroup {
    pub name: String,
    pub bytes: u64,
    pub allocations: u64,
}

/// One out-of-memory event: when, where, what was asked and what was in use.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OomEvent {
    pub time_s: f64,
    pub device: String,
    pub requested_bytes: u64,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    /// The module (path) whose request failed.
    pub layer: Option<String>,
}

/// Why the allocation failed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OomReport {
    /// The device that ran out (`cuda:0`, `cuda:0 (rank 1)`).
    pub device: String,
    /// Seconds since the trace's start.
    pub time_s: f64,
    /// Out-of-memory events in the trace (the last, the one the program saw last, is
    /// explained).
    pub ooms: usize,
    /// Every out-of-memory event, in order.
    #[serde(default)]
    pub all: Vec<OomEvent>,
    /// The module (path) whose request failed, when the request was made inside one.
    #[serde(default)]
    pub layer: Option<String>,
    /// The phase the request was made in: `forward`, `backward`, `optimizer` or `other`.
    #[serde(default)]
    pub phase: String,
    /// The operator running when the request was made (the innermost recorded one), when the
    /// trace records operators there.
    #[serde(default)]
    pub operator: Option<String>,
    /// The innermost Python frame of the request, when the trace has stacks.
    #[serde(default)]
    pub frame: Option<String>,
    /// The request that failed, in bytes (0 when the source did not say).
    pub requested_bytes: u64,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    /// Reserved by the allocator but not allocated: cached blocks that did not fit.
    pub unused_reserved_bytes: u64,
    /// The largest free block of the allocator's segments at that moment, when the trace has
    /// segments (snapshots): a request larger than it needs new memory from the device.
    pub largest_free_block_bytes: Option<u64>,
    /// The device's memory, when the trace knows it.
    pub device_total_bytes: Option<u64>,
    /// Live allocations recorded before the out-of-memory, by layer, largest first.
    pub by_layer: Vec<OomGroup>,
    /// The same by the phase that allocated them: forward (activations), backward (gradients),
    /// optimizer (its state), other (weights, inputs, before the first step).
    pub by_phase: Vec<OomGroup>,
    /// The same by innermost stack frame, when the trace has stacks.
    pub by_frame: Vec<OomGroup>,
    /// Live bytes the trace cannot attribute (allocated before recording began).
    pub unrecorded_bytes: u64,
    /// Allocator settings replayed up to this out-of-memory (`crate::whatif`), with the memory
    /// the run had when it failed (its reserved bytes then): whether the request would have fit.
    #[serde(default)]
    pub settings: Vec<OomSetting>,
    /// Who held the live bytes at the out-of-memory, largest first (at most `top`), where the
    /// capture recorded holders (`collector why --at oom` infers them for other traces).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<super::holders::HolderGroup>,
    /// The explanation in plain words.
    pub verdict: String,
}

/// One allocator setting's replay of the run up to its out-of-memory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OomSetting {
    /// `PYTORCH_CUDA_ALLOC_CONF` (over the run's own settings).
    pub alloc_conf: String,
    /// The replay reached the failing request with room for it, and ran out nowhere before.
    pub fits: bool,
    /// Its reserved peak up to then.
    pub reserved_peak_bytes: u64,
}

fn groups(map: HashMap<String, (u64, u64)>, top: usize) -> Vec<OomGroup> {
    let mut v: Vec<OomGroup> = map.into_iter().map(|(name, (bytes, allocations))| OomGroup { name, bytes, allocations }).collect();
    v.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
    v.truncate(top);
    v
}

/// Lists the trace's out-of-memory events and explains the last (the one the program saw
/// last); `None` when it has none.
pub fn oom(trace: &Trace, top: usize) -> Option<OomReport> {
    let ev = &trace.events;
    let ooms: Vec<usize> = (0..ev.len()).filter(|&i| ev.event_type(i) == EventType::Oom).collect();
    let &at = ooms.last()?;
    let layer_of = |i: usize| trace.opt_str(ev.layer[i]).filter(|l| !l.is_empty() && *l != "unattributed").map(str::to_owned);
    let all: Vec<OomEvent> = ooms
        .iter()
        .map(|&i| {
            let t = ev.totals_at(i);
            OomEvent {
                time_s: ev.ts_ns[i].saturating_sub(trace.start_ns()) as f64 / 1e9,
                device: trace.devices.get(ev.device[i] as usize).map(ToString::to_string).unwrap_or_default(),
                requested_bytes: ev.size_bytes[i],
                allocated_bytes: t.allocated_bytes,
                reserved_bytes: t.reserved_bytes,
                layer: layer_of(i),
            }
        })
        .collect();
    let device = ev.device[at];
    let totals = ev.totals_at(at);
    let start = trace.start_ns();
    let (mut by_layer, mut by_phase, mut by_frame) = (HashMap::new(), HashMap::new(), HashMap::new());
    let mut recorded = 0u64;
    for i in live_allocations_at(trace, at).into_iter().filter(|&i| ev.device[i] == device) {
        let bytes = ev.size_bytes[i];
        recorded += bytes;
        let layer = trace.opt_str(ev.layer[i]).filter(|l| !l.is_empty()).unwrap_or("unattributed");
        let add = |m: &mut HashMap<String, (u64, u64)>, k: &str| {
            let e = m.entry(k.to_owned()).or_insert((0, 0));
            *e = (e.0 + bytes, e.1 + 1);
        };
        add(&mut by_layer, layer);
        add(&mut by_phase, phase_name(ev.phase(i)));
        if let Some(f) = trace.stacks.stack_of_event(i).and_then(|s| python_frame(trace, s)) {
            add(&mut by_frame, &format!("{} ({}:{})", trace.str(f.name), trace.str(f.filename), f.line));
        }
    }
    let largest_free = super::has_segments(trace).then(|| {
        segments_at(trace, at, device)
            .iter()
            .flat_map(|s| s.blocks.iter())
            .filter(|b| b.state == BlockState::Free)
            .map(|b| b.size_bytes)
            .max()
            .unwrap_or(0)
    });
    let layer = layer_of(at);
    let ts = ev.ts_ns[at];
    // The innermost operator open at the request: the latest to start among those spanning it.
    let operator =
        trace.ops.iter().filter(|o| o.start_ns <= ts && ts <= o.end_ns).max_by_key(|o| o.start_ns).map(|o| trace.str(o.name).to_owned());
    let frame = trace
        .stacks
        .stack_of_event(at)
        .and_then(|s| python_frame(trace, s))
        .map(|f| format!("{} ({}:{})", trace.str(f.name), trace.str(f.filename), f.line));
    let mut r = OomReport {
        device: trace.devices.get(device as usize).map(ToString::to_string).unwrap_or_default(),
        time_s: ts.saturating_sub(start) as f64 / 1e9,
        ooms: ooms.len(),
        all,
        layer,
        phase: ev.phase(at).as_str().to_owned(),
        operator,
        frame,
        requested_bytes: ev.size_bytes[at],
        allocated_bytes: totals.allocated_bytes,
        reserved_bytes: totals.reserved_bytes,
        unused_reserved_bytes: totals.reserved_bytes.saturating_sub(totals.allocated_bytes),
        largest_free_block_bytes: largest_free,
        device_total_bytes: trace.meta.device_total_memory_bytes,
        by_layer: groups(by_layer, top),
        by_phase: groups(by_phase, top),
        by_frame: groups(by_frame, top),
        unrecorded_bytes: totals.allocated_bytes.saturating_sub(recorded),
        settings: Vec::new(),
        holders: Vec::new(),
        verdict: String::new(),
    };
    if !trace.event_holders.is_empty() {
        let held = super::holders::why(trace, &super::holders::Moment::Oom, Some(device));
        r.holders = held.map(|w| w.holders.into_iter().take(top).collect()).unwrap_or_default();
    }
    r.settings = settings_at_oom(trace, &r, at);
    r.verdict = verdict(&r);
    Some(r)
}

/// The allocator settings advice tries, each replayed with the memory the run had when it
/// failed (the reserved bytes at the out-of-memory, which the request could not grow): fits
/// when the replay has no out-of-memory up to the recorded one's time. The trace before the
/// failure only: what it would have done after is not known.
fn settings_at_oom(trace: &Trace, r: &OomReport, at: usize) -> Vec<OomSetting> {
    if r.reserved_bytes == 0 || !r.device.starts_with("cuda") {
        return Vec::new();
    }
    let opts = crate::whatif::WhatIfOptions {
        settings: super::advice::ALLOCATOR_CANDIDATES.iter().map(|s| (*s).to_owned()).collect(),
        device_memory_bytes: Some(r.reserved_bytes),
        device: Some(r.device.clone()),
    };
    let Ok(report) = crate::whatif::what_if(trace, &opts) else { return Vec::new() };
    let failed_at = trace.events.ts_ns[at].saturating_sub(trace.start_ns()) as f64 / 1e9;
    report
        .settings
        .iter()
        .skip(1)
        .map(|s| OomSetting {
            alloc_conf: s.alloc_conf.clone(),
            // Times, not events: the replay names its failure by time (1 µs apart is another request).
            fits: s.oom.as_ref().is_none_or(|o| o.at_s > failed_at + 1e-6),
            reserved_peak_bytes: s.reserved_peak_bytes,
        })
        .collect()
}

/// The innermost Python frame of a stack (snapshots' stacks start with C++ frames), else its
/// innermost frame.
fn python_frame(trace: &Trace, stack: u32) -> Option<&crate::model::Frame> {
    let mut frames = trace.stacks.stack(stack).peekable();
    let first = *frames.peek()?;
    Some(frames.find(|f| trace.str(f.filename).ends_with(".py")).unwrap_or(first))
}

fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Forward => "forward (activations)",
        Phase::Backward => "backward (gradients)",
        Phase::Optimizer => "optimizer (state)",
        Phase::Other => "other (weights, inputs)",
    }
}

fn verdict(r: &OomReport) -> String {
    use crate::units::format_bytes as b;
    // Where the request was made first: module, phase, operator (or the Python line).
    let mut site = match &r.layer {
        Some(l) => format!("in {l} ({}", r.phase),
        None => format!("outside every module ({}", r.phase),
    };
    match (&r.operator, &r.frame) {
        (Some(op), _) => site.push_str(&format!(", {op})")),
        (None, Some(f)) => site.push_str(&format!(", at {f})")),
        (None, None) => site.push(')'),
    }
    let mut s = format!(
        "out of memory on {} at {:.3} s {site}: a request of {} failed with {} allocated and {} reserved",
        r.device,
        r.time_s,
        b(r.requested_bytes),
        b(r.allocated_bytes),
        b(r.reserved_bytes)
    );
    if let Some(total) = r.device_total_bytes {
        s.push_str(&format!(" of the device's {}", b(total)));
    }
    if r.ooms > 1 {
        let earlier: Vec<String> =
            r.all[..r.all.len() - 1].iter().map(|o| format!("{} at {:.3} s", b(o.requested_bytes), o.time_s)).collect();
        s.push_str(&format!(
            " (the last of {} out-of-memory errors, the one the program saw last; it caught the earlier ones: {})",
            r.ooms,
            earlier.join(", ")
        ));
    }
    if let Some(top) = r.by_layer.first() {
        s.push_str(&format!("; the largest live layer is {} ({})", top.name, b(top.bytes)));
    }
    let fit: Vec<&str> = r.settings.iter().filter(|s| s.fits).map(|s| s.alloc_conf.as_str()).collect();
    if !r.settings.is_empty() {
        if fit.is_empty() {
            s.push_str("; no allocator setting tried makes the request fit in the memory the run had (replayed: ");
            s.push_str(&r.settings.iter().map(|s| s.alloc_conf.as_str()).collect::<Vec<_>>().join(", "));
            s.push(')');
        } else {
            s.push_str(&format!(
                "; replayed with the memory the run had, the request fits with PYTORCH_CUDA_ALLOC_CONF={}",
                fit.join(" or with ")
            ));
        }
    }
    match r.largest_free_block_bytes {
        Some(free) if r.unused_reserved_bytes >= r.requested_bytes && free < r.requested_bytes => s.push_str(&format!(
            "; the allocator held {} unused but its largest free block was {}: fragmentation (try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)",
            b(r.unused_reserved_bytes),
            b(free)
        )),
        _ if r.unused_reserved_bytes > r.reserved_bytes / 5 => {
            s.push_str(&format!("; {} reserved was not in use (fragmentation)", b(r.unused_reserved_bytes)))
        }
        _ => {}
    }
    s
}
