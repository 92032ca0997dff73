//! The device ledger at a moment (`collector ledger`, the summary's `device` line): the
//! process's device memory by source. PyTorch's reserved bytes come from the allocator's own
//! totals; every other source from the driver allocations the ledger saw, by the library that
//! asked, and the driver's own growth around the calls that make it without an allocation call
//! (kernels loaded at their first launch, streams, CUDA graphs); NVML's figure for the process bounds them, and what it counts beyond everything named
//! (the CUDA context among it) is `unexplained`. The driver's view of PyTorch's own segments
//! is kept as a check, never added twice.

use crate::model::{EventType, ProcessSample, Trace};
use crate::units::format_bytes;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub use crate::model::{outside_pytorch_peak, PYTORCH_SOURCE as PYTORCH};

/// How far from an NVML sample the sources must stand still for the sample to be read.
const QUIET_NS: u64 = 50_000_000;

/// One source's bytes at the moment and its highest over the run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LedgerSource {
    pub source: String,
    pub bytes: u64,
    pub peak_bytes: u64,
    pub detail: String,
    /// The source's parts where they can be told apart: NCCL's communicators (`default_pg
    /// (rank 0 of 2)`), with `not told apart` for bytes NCCL made before its first
    /// communicator was named.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<LedgerPart>,
}

/// A part of a source.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LedgerPart {
    pub name: String,
    pub bytes: u64,
    pub peak_bytes: u64,
}

/// The capture labels NCCL's allocations `nccl <communicator>` where NCCL told it which
/// communicator they are for: the source is `nccl`, the rest the part.
const NCCL: &str = "nccl";

/// The source a driver allocation's label belongs to, and its part (a communicator).
fn source_and_part(label: &str) -> (&str, Option<&str>) {
    match label.strip_prefix("nccl ") {
        Some(part) => (NCCL, Some(part)),
        None => (label, None),
    }
}

/// When the ledger is read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LedgerMoment {
    /// `peak`, `end`, `oom`, a mark's name, or `seconds`.
    pub what: String,
    pub ts_s: f64,
}

/// The ledger of one device at one moment (the JSON of `collector ledger --json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LedgerAt {
    pub at: LedgerMoment,
    pub device: String,
    /// NVML's count of this process's memory on the device (the sample nearest the moment).
    pub nvml_used_bytes: Option<u64>,
    /// When that NVML sample was taken (seconds from the start).
    pub nvml_at_s: Option<f64>,
    /// PyTorch's reserved bytes first, the CUDA context (where NVML was sampled), every other
    /// source by bytes, then `other_processes` where NVML counts them.
    pub sources: Vec<LedgerSource>,
    /// NVML's figure less every source of this process at that sample's time: what no
    /// allocation call showed (kernels loaded after the context's figure, the driver's growth).
    pub unexplained_bytes: Option<i64>,
    /// The driver's bytes of PyTorch's own segments at the moment (a check on the reserved
    /// figure: equal unless segments were made before the ledger started).
    pub pytorch_segments_bytes: u64,
    /// Why a part of the ledger is missing.
    pub missing: Vec<String>,
}

/// The moment `at` names: `peak` (the allocated peak), `end`, `oom` (the first out-of-memory
/// error), a mark's name, or seconds from the start; an error saying what it takes otherwise.
pub fn moment(trace: &Trace, at: &str) -> Result<LedgerMoment, String> {
    let start = trace.start_ns();
    let secs = |ts: u64| ts.saturating_sub(start) as f64 / 1e9;
    let ts = match at {
        "peak" => {
            let s = super::summary(trace);
            return Ok(LedgerMoment { what: "peak".into(), ts_s: s.peak_time_s });
        }
        "end" => trace.end_ns(),
        "oom" => {
            let i = (0..trace.events.len())
                .find(|&i| trace.events.event_type(i) == EventType::Oom)
                .ok_or("the trace has no out-of-memory error")?;
            trace.events.ts_ns[i]
        }
        _ => match at.parse::<f64>() {
            Ok(s) if s.is_finite() && s >= 0.0 => return Ok(LedgerMoment { what: "seconds".into(), ts_s: s }),
            _ => {
                let m = trace.marks.iter().find(|m| trace.str(m.name) == at).ok_or_else(|| {
                    format!("--at takes peak, end, oom, a mark's name or seconds; `{at}` is none of them (marks: {})", mark_names(trace))
                })?;
                m.ts_ns
            }
        },
    };
    Ok(LedgerMoment { what: at.to_owned(), ts_s: secs(ts) })
}

fn mark_names(trace: &Trace) -> String {
    let names: Vec<&str> = trace.marks.iter().map(|m| trace.str(m.name)).collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

/// The ledger of `device` (default: the trace's first CUDA device; a merged trace has one per
/// rank) at `at`; None for a trace without a ledger or a CUDA device.
pub fn ledger_at(trace: &Trace, at: LedgerMoment, device: Option<u8>) -> Option<LedgerAt> {
    if trace.ledger.is_empty() {
        return None;
    }
    let device = match device {
        Some(d) => d,
        None => trace.devices.iter().position(|d| d.kind == "cuda" && !d.is_pinned_host())? as u8,
    };
    let ts = trace.start_ns() + (at.ts_s * 1e9).round() as u64;
    // PyTorch's reserved bytes: the allocator's totals after the last event at or before `ts`.
    let (mut reserved, mut reserved_peak, mut allocated) = (0u64, 0u64, 0u64);
    // Bytes live in private pools (CUDA graphs', MemPools') at `ts`, by their blocks' addresses.
    let mut pooled: crate::hash::FastMap<u64, u64> = crate::hash::FastMap::default();
    let mut cursor = trace.events.cursor();
    for i in 0..trace.events.len() {
        let totals = cursor.advance();
        if trace.events.device[i] != device {
            continue;
        }
        reserved_peak = reserved_peak.max(totals.reserved_bytes);
        if trace.events.ts_ns[i] <= ts {
            reserved = totals.reserved_bytes;
            allocated = totals.allocated_bytes;
            match trace.events.event_type(i) {
                EventType::Alloc if trace.event_pool(i).is_some() => {
                    pooled.insert(trace.events.address[i], trace.events.size_bytes[i]);
                }
                EventType::Free => {
                    pooled.remove(&trace.events.address[i]);
                }
                _ => {}
            }
        }
    }
    let pooled: u64 = pooled.values().sum();
    let mut detail = format!(
        "the caching allocator's segments, from its own totals: {} allocated, {} cached",
        format_bytes(allocated.min(reserved)),
        format_bytes(reserved.saturating_sub(allocated))
    );
    if pooled > 0 {
        detail.push_str(&format!("; {} of the allocated in private pools (CUDA graphs', MemPools')", format_bytes(pooled)));
    }
    let (named, pytorch_segments_bytes) = driver_sources(trace, device, ts);
    let mut sources =
        vec![LedgerSource { source: "pytorch_reserved".into(), bytes: reserved, peak_bytes: reserved_peak, detail, parts: Vec::new() }];
    sources.extend(named);
    let samples: Vec<_> = trace.ledger.process.iter().filter(|p| p.device == device).collect();
    // The CUDA context: the least NVML counted for the process beyond every source live at
    // the same moment, over all its samples (a sample racing an allocation only counts more).
    if let Some((context, at_ns)) = context_estimate(trace, device, &samples) {
        sources.insert(
            1,
            LedgerSource {
                source: "cuda_context".into(),
                bytes: context,
                peak_bytes: context,
                detail: format!(
                    "the least NVML counted for the process beyond every source (at {:.3} s): the context, with what no call showed by then",
                    at_ns.saturating_sub(trace.start_ns()) as f64 / 1e9
                ),
                parts: Vec::new(),
            },
        );
    }
    let context = sources.iter().find(|s| s.source == "cuda_context").map_or(0, |s| s.bytes);
    let (nearest, unexplained_bytes) = nvml_reading(trace, device, ts, &samples, context).unzip();
    let nvml_used_bytes = nearest.map(|p| p.process_bytes);
    let nvml_at_s = nearest.map(|p| p.ts_ns.saturating_sub(trace.start_ns()) as f64 / 1e9);
    if let Some(p) = nearest {
        let peak = samples.iter().map(|p| p.other_processes_bytes).max().unwrap_or(0);
        if p.other_processes_bytes > 0 || peak > 0 {
            sources.push(LedgerSource {
                source: "other_processes".into(),
                bytes: p.other_processes_bytes,
                peak_bytes: peak,
                detail: "NVML's count for every other process on the device (not this process's)".into(),
                parts: Vec::new(),
            });
        }
    }
    let mut missing = trace.ledger.missing.clone();
    if samples.is_empty() {
        missing.push("no NVML figure for the process: the unexplained rest is unknown".into());
    }
    Some(LedgerAt {
        at,
        device: trace.devices[device as usize].to_string(),
        nvml_used_bytes,
        nvml_at_s,
        unexplained_bytes,
        sources,
        pytorch_segments_bytes,
        missing,
    })
}

/// The sources outside PyTorch over time, for the timeline's stacked bands.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LedgerBands {
    /// Each source outside PyTorch's caching allocator (the CUDA context first, then the others
    /// by their peaks), stacked in this order above PyTorch's reserved bytes: the most it held
    /// in each of the buckets asked for.
    pub sources: Vec<(String, Vec<u64>)>,
    /// NVML's count of the process's memory: (seconds from the start, bytes).
    pub nvml: Vec<(f64, u64)>,
}

/// `device`'s sources outside PyTorch over each of `buckets` (seconds from the start: (from,
/// to), in order): the most each held in it, and NVML's samples for the process from the first
/// bucket's start to the last one's end; empty for a trace without a ledger. The CUDA context
/// is [`ledger_at`]'s estimate, from the ledger's first sign of the device on.
pub fn ledger_bands(trace: &Trace, device: u8, buckets: &[(f64, f64)]) -> LedgerBands {
    if trace.ledger.is_empty() || buckets.is_empty() {
        return LedgerBands::default();
    }
    let start = trace.start_ns();
    let ns = |t: f64| start + (t.max(0.0) * 1e9).round() as u64;
    let events: Vec<_> = trace.ledger.events.iter().filter(|e| e.device == device && trace.str(e.source) != PYTORCH).collect();
    let samples: Vec<&ProcessSample> = trace.ledger.process.iter().filter(|p| p.device == device).collect();
    // Each event's source as an index into `names`, found once.
    let mut names: Vec<&str> = Vec::new();
    let column: Vec<usize> = events
        .iter()
        .map(|e| {
            let name = source_and_part(trace.str(e.source)).0;
            names.iter().position(|n| *n == name).unwrap_or_else(|| {
                names.push(name);
                names.len() - 1
            })
        })
        .collect();
    let mut columns: Vec<(String, Vec<u64>, i64)> = names.iter().map(|n| ((*n).to_owned(), Vec::with_capacity(buckets.len()), 0)).collect();
    let (mut now, mut k) = (vec![0i64; names.len()], 0usize);
    for &(from, to) in buckets {
        let (from, to) = (ns(from), ns(to));
        // What each held coming into the bucket, then its highest inside it.
        while k < events.len() && events[k].ts_ns < from {
            now[column[k]] += events[k].bytes;
            k += 1;
        }
        let mut most = now.clone();
        while k < events.len() && events[k].ts_ns <= to {
            let i = column[k];
            now[i] += events[k].bytes;
            most[i] = most[i].max(now[i]);
            k += 1;
        }
        for (c, &v) in columns.iter_mut().zip(&most) {
            c.1.push(v.max(0) as u64);
            c.2 = c.2.max(v);
        }
    }
    columns.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)));
    let mut sources: Vec<(String, Vec<u64>)> = columns.into_iter().map(|(n, v, _)| (n, v)).collect();
    if let Some((context, _)) = context_estimate(trace, device, &samples) {
        let from = events.first().map(|e| e.ts_ns).into_iter().chain(samples.first().map(|p| p.ts_ns)).min().unwrap_or(start);
        sources.insert(0, ("cuda_context".into(), buckets.iter().map(|&(_, to)| if ns(to) >= from { context } else { 0 }).collect()));
    }
    let (lo, hi) = (ns(buckets[0].0), ns(buckets[buckets.len() - 1].1));
    let nvml = samples
        .iter()
        .filter(|p| p.ts_ns >= lo && p.ts_ns <= hi)
        .map(|p| (p.ts_ns.saturating_sub(start) as f64 / 1e9, p.process_bytes))
        .collect();
    LedgerBands { sources, nvml }
}

/// The driver's allocations on `device` by source (PyTorch's own segments apart): live at
/// `ts` and the most each held, largest first; and PyTorch's segments' bytes at `ts`.
fn driver_sources(trace: &Trace, device: u8, ts: u64) -> (Vec<LedgerSource>, u64) {
    let mut by: BTreeMap<&str, Held> = BTreeMap::new();
    // A source's parts (NCCL's communicators), by name.
    let mut parts: BTreeMap<&str, BTreeMap<&str, Held>> = BTreeMap::new();
    // Bytes each source made from each line of the program's own code.
    let mut lines: BTreeMap<&str, BTreeMap<&str, u64>> = BTreeMap::new();
    for e in trace.ledger.events.iter().filter(|e| e.device == device) {
        let (source, part) = source_and_part(trace.str(e.source));
        if e.bytes > 0 && !e.frame.is_none() {
            *lines.entry(source).or_default().entry(trace.str(e.frame)).or_default() += e.bytes as u64;
        }
        by.entry(source).or_default().add(e.bytes, e.ts_ns <= ts);
        if source == NCCL {
            parts.entry(source).or_default().entry(part.unwrap_or(NOT_TOLD)).or_default().add(e.bytes, e.ts_ns <= ts);
        }
    }
    let pytorch_segments_bytes = by.get(PYTORCH).map_or(0, |s| s.now.max(0) as u64);
    let mut named: Vec<LedgerSource> = by
        .iter()
        .filter(|(name, _)| **name != PYTORCH)
        .map(|(name, h)| {
            let mut detail = source_detail(name, h.allocations);
            let mut split: Vec<LedgerPart> = parts
                .get(name)
                .filter(|p| p.keys().any(|k| *k != NOT_TOLD))
                .map(|p| {
                    p.iter().map(|(n, h)| LedgerPart { name: (*n).to_owned(), bytes: h.bytes(), peak_bytes: h.peak_bytes() }).collect()
                })
                .unwrap_or_default();
            split.sort_by(|a, b| b.peak_bytes.cmp(&a.peak_bytes).then(a.name.cmp(&b.name)));
            let communicators = split.iter().filter(|p| p.name != NOT_TOLD).count();
            if communicators > 0 {
                let each: Vec<String> =
                    split.iter().map(|p| format!("{} {} (peak {})", p.name, format_bytes(p.bytes), format_bytes(p.peak_bytes))).collect();
                detail =
                    format!("{communicators} communicator{}: {}; {detail}", if communicators == 1 { "" } else { "s" }, each.join(", "));
            } else if *name == NCCL {
                detail.push_str("; not split by communicator (NCCL older than 2.25, or the program's own NCCL_PROFILER_PLUGIN)");
            }
            if let Some((line, bytes)) = lines.get(name).and_then(|l| l.iter().max_by_key(|(_, b)| **b)) {
                detail.push_str(&format!("; {} of it made at {line}", format_bytes(*bytes)));
            }
            LedgerSource { source: (*name).to_owned(), bytes: h.bytes(), peak_bytes: h.peak_bytes(), detail, parts: split }
        })
        .collect();
    named.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(b.peak_bytes.cmp(&a.peak_bytes)).then(a.source.cmp(&b.source)));
    (named, pytorch_segments_bytes)
}

/// NCCL's bytes no communicator was named for (made before NCCL told the first one).
const NOT_TOLD: &str = "not told apart";

/// A source's (or part's) bytes over the events: at the moment, running, at most, allocations.
#[derive(Default)]
struct Held {
    now: i64,
    running: i64,
    peak: i64,
    allocations: usize,
}

impl Held {
    fn add(&mut self, bytes: i64, by_the_moment: bool) {
        self.running += bytes;
        self.peak = self.peak.max(self.running);
        if bytes > 0 {
            self.allocations += 1;
        }
        if by_the_moment {
            self.now = self.running;
        }
    }

    fn bytes(&self) -> u64 {
        self.now.max(0) as u64
    }

    fn peak_bytes(&self) -> u64 {
        self.peak.max(0) as u64
    }
}

/// What `n` events of `source` were.
fn source_detail(source: &str, n: usize) -> String {
    let s = if n == 1 { "" } else { "s" };
    if source.starts_with("kernels") {
        format!(
            "the driver's growth at {n} first launch{} or module load{s} (kernels loaded lazily, with what their first launch sets up)",
            if n == 1 { "" } else { "es" }
        )
    } else if source == "streams" {
        format!("the driver's growth at {n} stream creation{s}")
    } else if source == "cuda_graphs" {
        format!("the driver's growth at {n} CUDA graph instantiation{s} or upload{s}")
    } else {
        format!("{n} driver allocation{s}")
    }
}

/// The NVML sample read at `ts`: the nearest whose neighbourhood is quiet (no driver
/// allocation or release and no change of PyTorch's reserved bytes within QUIET_NS of it:
/// NVML's count and the sample's time may straddle one), else the nearest; and what it counts
/// beyond every source at its own time (samples are a tenth of a second apart: a peak between
/// two would be compared with the wrong moment).
fn nvml_reading<'t>(trace: &Trace, device: u8, ts: u64, samples: &[&'t ProcessSample], context: u64) -> Option<(&'t ProcessSample, i64)> {
    let quiet = |p: &&&ProcessSample| {
        let (lo, hi) = (p.ts_ns.saturating_sub(QUIET_NS), p.ts_ns + QUIET_NS);
        !trace.ledger.events.iter().any(|e| e.device == device && (lo..=hi).contains(&e.ts_ns))
            && reserved_at(trace, device, lo) == reserved_at(trace, device, hi)
    };
    let nearest = samples
        .iter()
        .filter(|p| p.ts_ns.abs_diff(ts) <= 1_000_000_000)
        .filter(quiet)
        .min_by_key(|p| p.ts_ns.abs_diff(ts))
        .or_else(|| samples.iter().min_by_key(|p| p.ts_ns.abs_diff(ts)))?;
    let named = reserved_at(trace, device, nearest.ts_ns) as i64
        + trace
            .ledger
            .events
            .iter()
            .filter(|e| e.device == device && e.ts_ns <= nearest.ts_ns && trace.str(e.source) != PYTORCH)
            .map(|e| e.bytes)
            .sum::<i64>();
    Some((*nearest, nearest.process_bytes as i64 - named - context as i64))
}

/// The least of (NVML's bytes for the process − PyTorch's reserved bytes − every other
/// source's driver bytes) over the samples, in one pass over the events, and when it was.
fn context_estimate(trace: &Trace, device: u8, samples: &[&ProcessSample]) -> Option<(u64, u64)> {
    let reserved = crate::model::reserved_at_samples(trace, device, samples);
    let ledger: Vec<_> = trace.ledger.events.iter().filter(|e| e.device == device && trace.str(e.source) != PYTORCH).collect();
    let (mut named, mut k) = (0i64, 0usize);
    let mut best: Option<(u64, u64)> = None;
    for (p, r) in samples.iter().zip(reserved) {
        while k < ledger.len() && ledger[k].ts_ns <= p.ts_ns {
            named += ledger[k].bytes;
            k += 1;
        }
        let rest = p.process_bytes.saturating_sub(r + named.max(0) as u64);
        if best.is_none_or(|(b, _)| rest < b) {
            best = Some((rest, p.ts_ns));
        }
    }
    best
}

/// PyTorch's reserved bytes on `device` after the last event at or before `ts`.
fn reserved_at(trace: &Trace, device: u8, ts: u64) -> u64 {
    // Events are in time order: the last at or before `ts` found by bisection, its totals from
    // the nearest checkpoint (the quiet-sample check asks this for every candidate sample).
    let end = trace.events.ts_ns.partition_point(|&t| t <= ts);
    (0..end).rev().find(|&i| trace.events.device[i] == device).map_or(0, |i| trace.events.totals_at(i).reserved_bytes)
}

impl LedgerAt {
    /// One line: `3.84 GiB = PyTorch 3.10 GiB + cuda_context 530 MiB + nccl 512 MiB + ... +
    /// unexplained 9 MiB (NVML 3.82 GiB at 12.100 s)`: this process's sources at the moment, the
    /// unexplained rest as NVML's nearest quiet sample left it.
    pub fn line(&self) -> String {
        let ours: Vec<&LedgerSource> = self.sources.iter().filter(|s| s.source != "other_processes").collect();
        let parts: Vec<String> = ours
            .iter()
            .filter(|s| s.bytes > 0 || s.source == "pytorch_reserved")
            .map(|s| format!("{} {}", if s.source == "pytorch_reserved" { "PyTorch" } else { &s.source }, format_bytes(s.bytes)))
            .collect();
        let sum: u64 = ours.iter().map(|s| s.bytes).sum();
        let unexplained = self.unexplained_bytes.unwrap_or(0).max(0) as u64;
        let mut line = format!("{} = {}", format_bytes(sum + unexplained), parts.join(" + "));
        match (self.unexplained_bytes, self.nvml_used_bytes, self.nvml_at_s) {
            (Some(u), Some(n), Some(t)) => {
                if u >= 0 {
                    line.push_str(&format!(" + unexplained {}", format_bytes(u as u64)));
                } else {
                    line.push_str(&format!(" ({} fewer by NVML)", format_bytes(u.unsigned_abs())));
                }
                line.push_str(&format!(" (NVML {} at {t:.3} s)", format_bytes(n)));
            }
            _ => line.push_str(" (no NVML figure: the unexplained rest is unknown)"),
        }
        line
    }
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::model::{Device, EventRecord, LedgerEvent, Phase, SourceFormat, StrId, Totals, TraceMeta};

    const MIB: u64 = 1 << 20;

    /// A CUDA run: PyTorch reserves 100 MiB, NCCL takes 40 MiB, a raw block 10 MiB (freed), then
    /// PyTorch asks for 1 GiB and fails. NVML: 80 MiB of context beyond everything, at every sample.
    pub(crate) fn run() -> Trace {
        let mut t = Trace::new(TraceMeta::new(SourceFormat::MemoryTracer));
        let d = t.device_index(Device { kind: "cuda".into(), index: 0, rank: None });
        let stream = t.stream_index("default");
        let push = |t: &mut Trace, ts: u64, event_type: EventType, size: u64, reserved: u64| {
            let totals = Some(Totals { allocated_bytes: if event_type == EventType::Alloc { size } else { 0 }, reserved_bytes: reserved });
            t.events.push(EventRecord {
                ts_ns: ts,
                event_type,
                phase: Phase::Forward,
                size_bytes: size,
                address: ts,
                layer: StrId::NONE,
                device: d,
                stream,
                totals,
            });
        };
        push(&mut t, 1_000, EventType::Alloc, 100 * MIB, 100 * MIB);
        push(&mut t, 900_000_000, EventType::Oom, 1 << 30, 100 * MIB);
        let (pt, nccl, raw) = (t.strings.intern(PYTORCH), t.strings.intern("nccl"), t.strings.intern("raw_cuda libx.so"));
        let kernels = t.strings.intern("kernels pytorch");
        let ev = |ts, source, bytes| LedgerEvent { ts_ns: ts, device: d, source, bytes, address: ts, frame: StrId::NONE };
        t.ledger.events = vec![
            ev(900, pt, (100 * MIB) as i64),
            ev(150_000_000, kernels, (30 * MIB) as i64),
            ev(200_000_000, nccl, (40 * MIB) as i64),
            LedgerEvent { frame: t.strings.intern("train.py:40 in main"), ..ev(300_000_000, raw, (10 * MIB) as i64) },
            ev(500_000_000, raw, -((10 * MIB) as i64)),
        ];
        let sample = |ts, named: u64| ProcessSample { ts_ns: ts, device: d, process_bytes: named + 80 * MIB, other_processes_bytes: 0 };
        t.ledger.process = vec![sample(100_000_000, 100 * MIB), sample(400_000_000, 180 * MIB), sample(700_000_000, 170 * MIB)];
        t.finish();
        t
    }

    #[test]
    fn nccls_bytes_are_split_by_communicator_where_nccl_named_it() {
        let mut t = run();
        let d = 0;
        let (plain, world, pair) = (
            t.strings.intern("nccl"),
            t.strings.intern("nccl default_pg (rank 0 of 2)"),
            t.strings.intern("nccl communicator 00000000000000ab (rank 1 of 2)"),
        );
        let ev = |ts, source, bytes| LedgerEvent { ts_ns: ts, device: d, source, bytes, address: ts, frame: StrId::NONE };
        t.ledger.events = vec![
            ev(100, plain, (2 * MIB) as i64),
            ev(200, world, (300 * MIB) as i64),
            ev(300, pair, (50 * MIB) as i64),
            ev(400, pair, (20 * MIB) as i64),
            ev(500, pair, -((20 * MIB) as i64)),
        ];
        let l = ledger_at(&t, moment(&t, "end").unwrap(), None).unwrap();
        let nccl = l.sources.iter().find(|s| s.source == "nccl").unwrap();
        assert_eq!((nccl.bytes, nccl.peak_bytes), (352 * MIB, 372 * MIB));
        let parts: Vec<(&str, u64, u64)> = nccl.parts.iter().map(|p| (p.name.as_str(), p.bytes, p.peak_bytes)).collect();
        assert_eq!(
            parts,
            [
                ("default_pg (rank 0 of 2)", 300 * MIB, 300 * MIB),
                ("communicator 00000000000000ab (rank 1 of 2)", 50 * MIB, 70 * MIB),
                ("not told apart", 2 * MIB, 2 * MIB)
            ]
        );
        assert!(nccl.detail.starts_with("2 communicators: default_pg (rank 0 of 2) 300.00 MiB (peak 300.00 MiB), "), "{}", nccl.detail);
        assert!(!l.sources.iter().any(|s| s.source.starts_with("nccl ")), "one nccl source");
        // The timeline's bands: one for NCCL.
        let bands = ledger_bands(&t, 0, &[(0.0, 1.0)]);
        assert_eq!(bands.sources.iter().filter(|(n, _)| n.starts_with("nccl")).count(), 1);
        // Without communicators (an older NCCL): said, no parts.
        let l = ledger_at(&run(), moment(&t, "end").unwrap(), None).unwrap();
        let nccl = l.sources.iter().find(|s| s.source == "nccl").unwrap();
        assert!(nccl.parts.is_empty() && nccl.detail.contains("not split by communicator"), "{}", nccl.detail);
    }

    #[test]
    fn the_ledger_at_a_moment_names_every_source_and_nvml_bounds_them() {
        let t = run();
        let at = moment(&t, "oom").unwrap();
        let l = ledger_at(&t, at, None).unwrap();
        let got: Vec<(&str, u64)> = l.sources.iter().map(|s| (s.source.as_str(), s.bytes)).collect();
        assert_eq!(
            got,
            [
                ("pytorch_reserved", 100 * MIB),
                ("cuda_context", 80 * MIB),
                ("nccl", 40 * MIB),
                ("kernels pytorch", 30 * MIB),
                ("raw_cuda libx.so", 0)
            ]
        );
        assert_eq!(l.sources[4].peak_bytes, 10 * MIB);
        assert!(l.sources[3].detail.contains("1 first launch or module load"), "{}", l.sources[3].detail);
        assert_eq!(l.sources[4].detail, "1 driver allocation; 10.00 MiB of it made at train.py:40 in main");
        assert_eq!(l.unexplained_bytes, Some(0));
        assert_eq!(l.pytorch_segments_bytes, 100 * MIB);
        assert!(l.sources[0].detail.ends_with(": 0 B allocated, 100.00 MiB cached"), "{}", l.sources[0].detail);
        assert_eq!(outside_pytorch_peak(&t, 0), Some(160 * MIB));
        assert!(
            l.line().starts_with(
                "250.00 MiB = PyTorch 100.00 MiB + cuda_context 80.00 MiB + nccl 40.00 MiB + kernels pytorch 30.00 MiB + unexplained 0 B"
            ),
            "{}",
            l.line()
        );
        assert!(moment(&t, "lunch").unwrap_err().contains("`lunch` is none of them (marks: none)"));
    }

    #[test]
    fn the_bands_stack_each_source_at_each_moment_with_the_context_first() {
        let t = run();
        let b = ledger_bands(&t, 0, &[(0.0, 0.0), (0.0, 0.25), (0.25, 0.4), (0.4, 0.6), (0.6, 0.9)]);
        let got: Vec<(&str, &[u64])> = b.sources.iter().map(|(n, v)| (n.as_str(), v.as_slice())).collect();
        let m = MIB;
        assert_eq!(
            got,
            [
                ("cuda_context", &[0, 80 * m, 80 * m, 80 * m, 80 * m][..]),
                ("nccl", &[0, 40 * m, 40 * m, 40 * m, 40 * m][..]),
                ("kernels pytorch", &[0, 30 * m, 30 * m, 30 * m, 30 * m][..]),
                // Freed at 0.5 s: still its most in the bucket from 0.4 s to 0.6 s.
                ("raw_cuda libx.so", &[0, 0, 10 * m, 10 * m, 0][..]),
            ]
        );
        assert_eq!(b.nvml.len(), 3);
        assert_eq!(b.nvml[1].1, 260 * m);
        assert!((b.nvml[1].0 - 0.4).abs() < 1e-5, "{:?}", b.nvml);
        assert_eq!(ledger_bands(&run_without_ledger(), 0, &[(0.0, 0.5)]), LedgerBands::default());
    }

    fn run_without_ledger() -> Trace {
        let mut t = run();
        t.ledger = Default::default();
        t
    }
}
