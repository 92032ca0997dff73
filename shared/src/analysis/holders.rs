//! Who holds each live byte (`collector why`): at a moment (the peak, the out-of-memory, a
//! mark, a time), the live allocations of one device grouped by what keeps them alive: a
//! parameter, a gradient, an optimizer's state, a tensor saved for backward, a buffer, a
//! Python variable, a free another stream still uses, or the allocator's cache.
//!
//! A block's holder is the one the capture recorded (`Trace::event_holders`, `collector trace
//! --holders`) holding it at that moment; where several do, the one that outlives the step
//! ([`HolderKind::rank`]: the parameter over the Python variable pointing at it). A block no
//! recorded holder holds at that moment (an operator's output an instant before autograd saves
//! it, a gradient before it lands in `.grad`) gets a holder inferred from its category
//! ([`crate::analysis::categories`]), marked `inferred` and counted apart from the recorded
//! ones; what neither names is `unknown`.
//!
//! Groups are by kind, name and module. For a reader, the indices of repeated layers fold
//! (`layers.{0..11}.mlp`: one line per operator and layer shape, not one per layer); what
//! programs read (`--json`, the summary's report) names every module by its full path.

use super::categories::{categorize, workspace_allocations, Category};
use crate::hash::FastMap;
use crate::model::{EventHolder, EventType, HolderKind, Phase, StrId, Trace};
use serde::{Deserialize, Serialize};

/// When to look.
#[derive(Clone, Debug, PartialEq)]
pub enum Moment {
    /// The device's allocated peak (its first moment at that height).
    Peak,
    /// The last out-of-memory.
    Oom,
    /// The `nth` (from 1) mark of that name.
    Mark { name: String, nth: usize },
    /// Seconds since the trace's start.
    Seconds(f64),
}

impl Moment {
    /// `peak`, `oom`, seconds (`12.5`, `12.5s`), a mark's name, or `NAME#K` for its K-th
    /// occurrence (from 1).
    pub fn parse(s: &str) -> Result<Moment, String> {
        let s = s.trim();
        match s {
            "" => return Err("expected peak, oom, a mark's name or seconds since the start; found nothing".into()),
            "peak" => return Ok(Moment::Peak),
            "oom" => return Ok(Moment::Oom),
            _ => {}
        }
        let number = s.strip_suffix('s').unwrap_or(s);
        if let Ok(v) = number.parse::<f64>() {
            return if v.is_finite() && v >= 0.0 {
                Ok(Moment::Seconds(v))
            } else {
                Err(format!("expected seconds of 0 or more, found {s}"))
            };
        }
        if let Some((name, k)) = s.rsplit_once('#') {
            if let Ok(nth) = k.parse::<usize>() {
                if nth == 0 {
                    return Err(format!("{s}: marks count from 1 (`{name}#1` is the first)"));
                }
                return Ok(Moment::Mark { name: name.to_owned(), nth });
            }
        }
        Ok(Moment::Mark { name: s.to_owned(), nth: 1 })
    }
}

/// The moment looked at.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WhyAt {
    /// `peak`, `oom`, `mark` or `time`.
    pub kind: String,
    /// The mark's name (with `#K` past its first occurrence).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Seconds since the trace's start.
    pub time_s: f64,
    /// The device (`cuda:0`).
    pub device: String,
    /// The last event at or before the moment (index into the trace's events).
    pub event: Option<u64>,
}

/// Live bytes of one holder (or of a folded group of alike holders: one operator's saved
/// tensors in each of twelve layers).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HolderGroup {
    pub kind: HolderKind,
    /// The parameter or buffer name, the optimizer's state key, the operator that saved it,
    /// the Python variable; empty where nothing names it.
    pub name: String,
    /// The module path (repeated layers folded: `layers.{0..11}.mlp`); empty where none.
    pub module: String,
    pub bytes: u64,
    /// What its tensors asked for, where the trace knows (a CUDA trace of torch 2.9 or newer):
    /// the caching allocator rounds each request up to its block, and `bytes` counts blocks,
    /// as `memory_allocated()` does. Else equal to `bytes`.
    #[serde(default)]
    pub requested_bytes: u64,
    pub blocks: u64,
    /// When the last of its blocks is released (seconds since the start): its holder lets go or
    /// the block is freed. `None`: some are held to the end of the trace.
    pub released_at_s: Option<f64>,
    /// Named from the allocation's category, not recorded.
    #[serde(default)]
    pub inferred: bool,
}

/// Who holds what at one moment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Why {
    pub at: WhyAt,
    /// Allocated bytes of the device at the moment.
    pub live_bytes: u64,
    /// Reserved bytes of the device at the moment (0 where the trace does not know them).
    pub reserved_bytes: u64,
    /// Largest first; the allocator's cache is one of them.
    pub holders: Vec<HolderGroup>,
    /// Whether the capture recorded holders (`collector trace --holders`); else every holder
    /// is inferred.
    pub recorded: bool,
    /// Of `live_bytes`, those with a holder other than `unknown`.
    pub named_bytes: u64,
    /// Of `named_bytes`, those a recorded holder held at the moment.
    #[serde(default)]
    pub recorded_bytes: u64,
    /// Of `named_bytes`, those whose holder was inferred from what the allocation is for.
    #[serde(default)]
    pub inferred_bytes: u64,
}

impl Why {
    /// "96.3 % of the live bytes have one: 90.1 % recorded, 6.2 % inferred".
    pub fn shares(&self) -> String {
        let pct = |b: u64| if self.live_bytes == 0 { 100.0 } else { 100.0 * b as f64 / self.live_bytes as f64 };
        format!(
            "{:.1} % of the live bytes have one: {:.1} % recorded, {:.1} % inferred",
            100.0 * self.coverage(),
            pct(self.recorded_bytes),
            pct(self.inferred_bytes)
        )
    }

    /// The share of live bytes whose holder is known, 0 to 1 (1 with nothing live).
    pub fn coverage(&self) -> f64 {
        if self.live_bytes == 0 {
            1.0
        } else {
            self.named_bytes as f64 / self.live_bytes as f64
        }
    }
}

/// Why a moment cannot be looked at.
#[derive(Clone, Debug, PartialEq)]
pub enum WhyError {
    NoEvents,
    NoDevice { asked: String, devices: Vec<String> },
    NoOom,
    NoMark { name: String, nth: usize, marks: Vec<(String, usize)> },
    PastEnd { seconds: f64, duration_s: f64 },
}

impl std::fmt::Display for WhyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WhyError::NoEvents => write!(f, "the trace has no memory events"),
            WhyError::NoDevice { asked, devices } => write!(f, "no device {asked} in the trace; it has {}", devices.join(", ")),
            WhyError::NoOom => write!(f, "the trace records no out-of-memory; use --at peak, a mark or seconds"),
            WhyError::NoMark { name, nth, marks } => {
                let have = if marks.is_empty() {
                    "it has no marks (memory_tracer.mark(\"name\") makes one)".to_owned()
                } else {
                    let list: Vec<String> = marks.iter().map(|(m, k)| if *k > 1 { format!("{m} (×{k})") } else { m.clone() }).collect();
                    format!("its marks are: {}", list.join(", "))
                };
                if *nth > 1 {
                    write!(f, "the trace has no mark `{name}#{nth}`; {have}")
                } else {
                    write!(f, "`{name}` is not peak, oom, seconds or a mark of the trace; {have}")
                }
            }
            WhyError::PastEnd { seconds, duration_s } => write!(f, "{seconds} s is past the trace's end ({duration_s:.3} s)"),
        }
    }
}

impl std::error::Error for WhyError {}

/// Each mark name with how often it occurs, in order of first occurrence.
pub fn mark_names(trace: &Trace) -> Vec<(String, usize)> {
    let mut out: Vec<(String, usize)> = Vec::new();
    for m in &trace.marks {
        let name = trace.str(m.name);
        match out.iter_mut().find(|(n, _)| n == name) {
            Some((_, k)) => *k += 1,
            None => out.push((name.to_owned(), 1)),
        }
    }
    out
}

/// Parses a device as the trace names it (`cuda:0`, `0` for `cuda:0`, `cpu`).
pub fn device_named(trace: &Trace, name: &str) -> Result<u8, WhyError> {
    let names: Vec<String> = trace.devices.iter().map(|d| d.to_string()).collect();
    let found = names.iter().position(|n| n == name).or_else(|| {
        let index: i32 = name.parse().ok()?;
        trace.devices.iter().position(|d| d.kind == "cuda" && d.index == index && d.rank.is_none())
    });
    found.map(|k| k as u8).ok_or(WhyError::NoDevice { asked: name.to_owned(), devices: names })
}

/// The holders of `device`'s live bytes (default: the device the moment is on, else the one
/// whose allocated memory peaks highest) at `moment`, repeated layers folded.
pub fn why(trace: &Trace, moment: &Moment, device: Option<u8>) -> Result<Why, WhyError> {
    why_with(trace, moment, device, true)
}

/// [`why`], with repeated layers folded (`layers.{0..11}.mlp`) or each module on its own.
pub fn why_with(trace: &Trace, moment: &Moment, device: Option<u8>, fold_layers: bool) -> Result<Why, WhyError> {
    let ev = &trace.events;
    if ev.is_empty() {
        return Err(WhyError::NoEvents);
    }
    let start = trace.start_ns();
    let (at, t_ns, d) = locate(trace, moment, device)?;
    let event = match moment {
        Moment::Peak | Moment::Oom => at,
        _ => ev.ts_ns.partition_point(|&ts| ts <= t_ns).checked_sub(1),
    };
    let live = Live::after(trace, d, event.map_or(0, |i| i + 1), t_ns);
    let totals = live.totals;
    let mut groups = Groups { fold: fold_layers, ..Groups::default() };
    let window = match moment {
        Moment::Peak | Moment::Oom => event.and_then(|m| phase_window(trace, m, true)),
        _ => event.and_then(|m| phase_window(trace, m, false)),
    };
    let (block_bytes, named_bytes, recorded_bytes) = group_blocks(trace, &live, t_ns, window, &mut groups);
    let mut pending_bytes = 0u64;
    for (&_, &i) in &live.pending {
        let bytes = ev.size_bytes[i];
        pending_bytes += bytes;
        groups.add(trace, HolderKind::PendingFree, StrId::NONE, ev.layer[i], (bytes, bytes), live.completed_at.get(&i).copied(), false);
    }
    // Memory from before the trace's first event: live, but no event says what it is.
    let before = totals.allocated_bytes.saturating_sub(block_bytes);
    if before > 0 {
        groups.add_named(HolderKind::Unknown, "allocated before the trace began", "", (before, before), 0, None, false);
    }
    let cache = totals.reserved_bytes.saturating_sub(totals.allocated_bytes).saturating_sub(pending_bytes);
    if cache > 0 {
        groups.add_named(HolderKind::Cache, "reserved, allocated to nothing", "", (cache, cache), 0, None, false);
    }
    let mut holders = groups.finish(start);
    holders.retain(|g| g.bytes > 0);
    holders.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.kind.cmp(&b.kind)).then(a.module.cmp(&b.module)).then(a.name.cmp(&b.name)));
    let named_bytes = named_bytes.min(totals.allocated_bytes);
    let recorded_bytes = recorded_bytes.min(named_bytes);
    let at = WhyAt {
        time_s: t_ns.saturating_sub(start) as f64 / 1e9,
        device: trace.devices.get(d as usize).map(|x| x.to_string()).unwrap_or_default(),
        event: event.map(|i| i as u64),
        ..at_kind(moment)
    };
    let recorded = !trace.event_holders.is_empty();
    Ok(Why {
        at,
        live_bytes: totals.allocated_bytes,
        reserved_bytes: totals.reserved_bytes,
        holders,
        recorded,
        named_bytes,
        recorded_bytes,
        inferred_bytes: named_bytes - recorded_bytes,
    })
}

/// One device's live blocks and pending frees after the first `end` events (at `now`, on the
/// trace's clock), its totals then, and when each of them goes.
struct Live {
    totals: crate::model::Totals,
    /// Address → its `Alloc` event.
    blocks: FastMap<u64, usize>,
    /// Address → the `Free` event of a free not yet completed (a snapshot's `free_requested`
    /// before its `free_completed`).
    pending: FastMap<u64, usize>,
    /// `Alloc` event → when it is freed; pending `Free` event → when it completes.
    freed_at: FastMap<usize, u64>,
    completed_at: FastMap<usize, u64>,
    /// Pending `Free` event → its block's `Alloc` event.
    pending_block: FastMap<usize, usize>,
}

impl Live {
    fn after(trace: &Trace, d: u8, end: usize, now: u64) -> Live {
        let ev = &trace.events;
        let mut live = Live {
            totals: ev.base_totals.get(d as usize).copied().unwrap_or_default(),
            blocks: FastMap::default(),
            pending: FastMap::default(),
            freed_at: FastMap::default(),
            completed_at: FastMap::default(),
            pending_block: FastMap::default(),
        };
        let completions = (0..ev.len()).any(|i| ev.event_type(i) == EventType::FreeCompleted);
        // Frees the capture saw waiting for another stream (the allocator's own state read at
        // a mark or an out-of-memory error): block → (seen pending at, let go of at).
        let recorded: FastMap<usize, (u64, Option<u64>)> = trace
            .event_holders
            .iter()
            .filter(|h| h.kind == HolderKind::PendingFree)
            .map(|h| (h.event as usize, (h.taken_ns, h.released_ns)))
            .collect();
        let mut cursor = ev.cursor();
        for i in 0..end {
            let t = cursor.advance();
            if ev.device[i] != d {
                continue;
            }
            live.totals = t;
            let a = ev.address[i];
            match ev.event_type(i) {
                EventType::Alloc => {
                    live.pending.remove(&a);
                    live.blocks.insert(a, i);
                }
                // Where frees complete later, a free is pending until its completion; a free seen
                // pending is so from its request until it was seen done (or its space reused).
                EventType::Free => {
                    if let Some(block) = live.blocks.remove(&a) {
                        if completions || recorded.contains_key(&block) {
                            live.pending.insert(a, i);
                            live.pending_block.insert(i, block);
                        }
                    }
                }
                EventType::FreeCompleted => {
                    live.pending.remove(&a);
                }
                _ => {}
            }
        }
        live.pending.retain(|_, free| {
            let Some(&(_, done)) = live.pending_block.get(free).and_then(|b| recorded.get(b)) else { return true };
            match done {
                Some(done) if done <= now => false,
                Some(done) => {
                    live.completed_at.insert(*free, done);
                    true
                }
                None => true,
            }
        });
        for i in end..ev.len() {
            if ev.device[i] != d {
                continue;
            }
            let a = ev.address[i];
            match ev.event_type(i) {
                EventType::Free | EventType::Alloc => {
                    if let Some(&k) = live.blocks.get(&a) {
                        live.freed_at.entry(k).or_insert(ev.ts_ns[i]);
                    }
                }
                EventType::FreeCompleted => {
                    if let Some(&k) = live.pending.get(&a) {
                        live.completed_at.entry(k).or_insert(ev.ts_ns[i]);
                    }
                }
                _ => {}
            }
            // A pending free's space taken again: it had completed by then.
            if ev.event_type(i) == EventType::Alloc {
                if let Some(&k) = live.pending.get(&a) {
                    live.completed_at.entry(k).or_insert(ev.ts_ns[i]);
                }
            }
        }
        live
    }
}

/// Each live block into its holder's group (recorded at `t_ns`, else inferred from its
/// category or its stack); returns the blocks' bytes, those of them with a holder, and those
/// of these whose holder was recorded.
fn group_blocks(trace: &Trace, live: &Live, t_ns: u64, window: Option<(Phase, usize)>, groups: &mut Groups) -> (u64, u64, u64) {
    let ev = &trace.events;
    let mut blocks: Vec<usize> = live.blocks.values().copied().collect();
    blocks.sort_unstable();
    // Where the capture recorded holders it read every module's parameters and buffers: a
    // block it never saw held is none of them, whatever its lifetime suggests (an input batch
    // the program keeps reads as a parameter by lifetime alone).
    let recorded = !trace.event_holders.is_empty();
    // What the phase under way made and no holder took yet, by the operator that made it.
    let in_flight = match window {
        Some((phase, since)) if recorded => {
            let mut made: Vec<usize> = blocks
                .iter()
                .copied()
                .filter(|&e| e >= since && ev.phase(e) == phase && holder_at(trace.holders_of(e), t_ns).is_none())
                .collect();
            made.sort_by_key(|&e| ev.ts_ns[e]);
            let mut ops = FastMap::default();
            super::flame::innermost_op_at(trace, made, |e, op| {
                ops.insert(e, op);
            });
            ops
        }
        _ => FastMap::default(),
    };
    let needs_inference = blocks.iter().any(|&e| holder_at(trace.holders_of(e), t_ns).is_none() && !in_flight.contains_key(&e));
    let (categories, workspaces): (FastMap<u32, Category>, _) = if needs_inference {
        (categorize(trace).into_iter().map(|c| (c.event, c.category)).collect(), workspace_allocations(trace))
    } else {
        Default::default()
    };
    let (mut block_bytes, mut named_bytes, mut recorded_bytes) = (0u64, 0u64, 0u64);
    for &e in &blocks {
        let bytes = (ev.size_bytes[e], trace.requested_of(e).unwrap_or(ev.size_bytes[e]));
        block_bytes += bytes.0;
        let freed = live.freed_at.get(&e).copied();
        if let Some(h) = holder_at(trace.holders_of(e), t_ns) {
            let released = match (h.released_ns.filter(|&r| r > t_ns), freed) {
                (Some(r), Some(f)) => Some(r.min(f)),
                (r, f) => r.or(f),
            };
            groups.add(trace, h.kind, h.name, h.module, bytes, released, false);
            if h.kind != HolderKind::Unknown {
                named_bytes += bytes.0;
                recorded_bytes += bytes.0;
            }
            continue;
        }
        if let Some(&op) = in_flight.get(&e) {
            let name = match op.map(|o| &trace.ops[o]) {
                Some(o) if o.end_ns >= t_ns => format!("{} (running)", trace.str(o.name)),
                Some(o) => format!("made by {}", trace.str(o.name)),
                None => phase_made(ev.phase(e)).to_owned(),
            };
            groups.add_named(HolderKind::Temporary, &name, trace.str(ev.layer[e]), bytes, 1, freed, false);
            named_bytes += bytes.0;
            recorded_bytes += bytes.0;
            continue;
        }
        if workspaces.contains(&(e as u32)) {
            groups.add_named(HolderKind::Cache, WORKSPACE, "", bytes, 1, freed, true);
            named_bytes += bytes.0;
            continue;
        }
        let kind = match categories.get(&(e as u32)) {
            Some(Category::Parameter) if !recorded => HolderKind::Parameter,
            Some(Category::Buffer) if !recorded => HolderKind::Buffer,
            Some(Category::Gradient) => HolderKind::Gradient,
            Some(Category::OptimizerState) => HolderKind::OptimizerState,
            Some(Category::Activation) => HolderKind::SavedForBackward,
            _ => HolderKind::Unknown,
        };
        if kind == HolderKind::Unknown {
            groups.add_named(kind, unknown_name(ev.phase(e)), trace.str(ev.layer[e]), bytes, 1, freed, false);
        } else {
            groups.add(trace, kind, StrId::NONE, ev.layer[e], bytes, freed, true);
            named_bytes += bytes.0;
        }
    }
    (block_bytes, named_bytes, recorded_bytes)
}

/// The phase under way at event `m` (the moment's own event; else the last event before the
/// moment, whose next event must be of the same phase) and the first event of its run: what
/// the forward, backward or optimizer step that the moment falls in made. `None` between
/// phases and outside them.
fn phase_window(trace: &Trace, m: usize, at_event: bool) -> Option<(Phase, usize)> {
    let ev = &trace.events;
    let phase = ev.phase(m);
    if phase == Phase::Other || (!at_event && (m + 1 >= ev.len() || ev.phase(m + 1) != phase)) {
        return None;
    }
    let mut since = m;
    while since > 0 && ev.phase(since - 1) == phase {
        since -= 1;
    }
    // Two forwards (or steps) with no allocation between them are one run of events: the
    // outermost module call (or step) the moment is in begins this one.
    let t_ns = ev.ts_ns[m];
    let call = trace
        .scopes
        .iter()
        .filter(|s| s.depth == 0 && s.phase == phase && s.start_ns <= t_ns && t_ns <= s.end_ns)
        .map(|s| s.start_ns)
        .max();
    if let Some(start) = call {
        since = since.max(ev.ts_ns.partition_point(|&ts| ts < start));
    }
    Some((phase, since))
}

fn phase_made(phase: Phase) -> &'static str {
    match phase {
        Phase::Forward => "made in this forward",
        Phase::Backward => "made in this backward",
        Phase::Optimizer => "made in this optimizer step",
        Phase::Other => "made outside forward, backward and the optimizer step",
    }
}

/// The name of a block a cuBLAS handle keeps for its next matmul, known from the allocation's
/// stack (a snapshot's frames); the capture names the ones it sees (`mt_name_workspaces`).
const WORKSPACE: &str = "cuBLAS workspace";

fn at_kind(moment: &Moment) -> WhyAt {
    let (kind, name) = match moment {
        Moment::Peak => ("peak", None),
        Moment::Oom => ("oom", None),
        Moment::Mark { name, nth: 1 } => ("mark", Some(name.clone())),
        Moment::Mark { name, nth } => ("mark", Some(format!("{name}#{nth}"))),
        Moment::Seconds(_) => ("time", None),
    };
    WhyAt { kind: kind.into(), name, time_s: 0.0, device: String::new(), event: None }
}

/// The moment's event (peak, oom), its time and its device.
fn locate(trace: &Trace, moment: &Moment, device: Option<u8>) -> Result<(Option<usize>, u64, u8), WhyError> {
    let ev = &trace.events;
    let start = trace.start_ns();
    let default_device = || device.unwrap_or_else(|| super::peak_device(trace));
    match moment {
        Moment::Peak => {
            let d = default_device();
            let mut best = ev.base_totals.get(d as usize).map_or(0, |t| t.allocated_bytes);
            let mut at = None;
            let mut cursor = ev.cursor();
            for i in 0..ev.len() {
                let t = cursor.advance();
                if ev.device[i] == d && t.allocated_bytes > best {
                    best = t.allocated_bytes;
                    at = Some(i);
                }
            }
            let t_ns = at.map_or(ev.ts_ns[0], |i| ev.ts_ns[i]);
            Ok((at, t_ns, d))
        }
        Moment::Oom => {
            let i = (0..ev.len())
                .rev()
                .find(|&i| ev.event_type(i) == EventType::Oom && device.is_none_or(|d| ev.device[i] == d))
                .ok_or(WhyError::NoOom)?;
            Ok((Some(i), ev.ts_ns[i], ev.device[i]))
        }
        Moment::Mark { name, nth } => {
            let m = trace.marks.iter().filter(|m| trace.str(m.name) == name).nth(nth - 1).ok_or_else(|| WhyError::NoMark {
                name: name.clone(),
                nth: *nth,
                marks: mark_names(trace),
            })?;
            Ok((None, m.ts_ns, default_device()))
        }
        Moment::Seconds(s) => {
            let end = trace.end_ns().max(start);
            let t_ns = start.saturating_add((s * 1e9).round() as u64);
            if t_ns > end {
                return Err(WhyError::PastEnd { seconds: *s, duration_s: (end - start) as f64 / 1e9 });
            }
            Ok((None, t_ns, default_device()))
        }
    }
}

/// The holder of a block at `t_ns`: of those holding it then, the one that ranks first. A holder
/// that takes the block only later does not hold it now (the block is then inferred, and said so).
pub fn holder_at(holders: &[EventHolder], t_ns: u64) -> Option<&EventHolder> {
    // A pending free holds a block the program freed already: never a live block's holder.
    holders
        .iter()
        .filter(|h| h.kind != HolderKind::PendingFree && h.taken_ns <= t_ns && h.released_ns.is_none_or(|r| r > t_ns))
        .min_by_key(|h| h.kind.rank())
}

/// What a block nothing holds most likely is, by the phase that allocated it.
fn unknown_name(phase: Phase) -> &'static str {
    match phase {
        Phase::Forward => "made in forward, not saved for backward (an output, a temporary)",
        Phase::Backward => "made in backward (a gradient on its way, a temporary)",
        Phase::Optimizer => "made in the optimizer step (a temporary)",
        Phase::Other => "made outside forward, backward and the optimizer step (an input, a tensor the program keeps)",
    }
}

/// Groups by kind, name and folded module.
#[derive(Default)]
struct Groups {
    by_key: FastMap<(HolderKind, String, String, bool), Group>,
    fold: bool,
}

#[derive(Default)]
struct Group {
    /// The numbers of each folded index of the module path and of the name, by position.
    numbers: Vec<Vec<u64>>,
    name_numbers: Vec<Vec<u64>>,
    bytes: u64,
    requested_bytes: u64,
    blocks: u64,
    released: Option<u64>,
    held_to_end: bool,
}

impl Groups {
    /// `bytes`: the block's and what it was asked for.
    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        trace: &Trace,
        kind: HolderKind,
        name: StrId,
        module: StrId,
        bytes: (u64, u64),
        released: Option<u64>,
        inferred: bool,
    ) {
        let (name, module) = (trace.str(name), trace.str(module));
        self.add_named(kind, name, module, bytes, 1, released, inferred);
    }

    #[allow(clippy::too_many_arguments)]
    fn add_named(
        &mut self,
        kind: HolderKind,
        name: &str,
        module: &str,
        bytes: (u64, u64),
        blocks: u64,
        released: Option<u64>,
        inferred: bool,
    ) {
        let unfolded = |s: &str| (s.to_owned(), Vec::new());
        let (pattern, numbers) = if self.fold { fold(module) } else { unfolded(module) };
        let (name_pattern, name_numbers) = if self.fold { fold(name) } else { unfolded(name) };
        let g = self.by_key.entry((kind, name_pattern, pattern, inferred)).or_default();
        for (list, numbers) in [(&mut g.numbers, numbers), (&mut g.name_numbers, name_numbers)] {
            if list.len() < numbers.len() {
                list.resize(numbers.len(), Vec::new());
            }
            for (k, n) in numbers.into_iter().enumerate() {
                list[k].push(n);
            }
        }
        g.bytes += bytes.0;
        g.requested_bytes += bytes.1;
        g.blocks += blocks;
        match released {
            Some(r) => g.released = Some(g.released.map_or(r, |x| x.max(r))),
            None => g.held_to_end = true,
        }
    }

    fn finish(self, start: u64) -> Vec<HolderGroup> {
        self.by_key
            .into_iter()
            .map(|((kind, name, pattern, inferred), g)| HolderGroup {
                kind,
                name: unfold(&name, g.name_numbers),
                module: unfold(&pattern, g.numbers),
                bytes: g.bytes,
                requested_bytes: g.requested_bytes,
                blocks: g.blocks,
                released_at_s: if g.held_to_end { None } else { g.released.map(|r| r.saturating_sub(start) as f64 / 1e9) },
                inferred,
            })
            .collect()
    }
}

/// A path with its indices taken out: all-digit components (`layers.3.mlp`) and subscripts
/// (`history[3]`) become `{}` → (`layers.{}.mlp`, [3]).
fn fold(path: &str) -> (String, Vec<u64>) {
    let b = path.as_bytes();
    let (mut out, mut numbers, mut i) = (String::with_capacity(path.len()), Vec::new(), 0);
    while i < b.len() {
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i > start {
            let before = start.checked_sub(1).map(|k| b[k]);
            let after = b.get(i).copied();
            let whole = matches!((before, after), (None | Some(b'.'), None | Some(b'.')) | (Some(b'['), Some(b']')));
            match path[start..i].parse::<u64>() {
                Ok(n) if whole => {
                    numbers.push(n);
                    out.push_str("{}");
                }
                _ => out.push_str(&path[start..i]),
            }
            continue;
        }
        let next = path[i..].char_indices().nth(1).map_or(path.len(), |(k, _)| i + k);
        out.push_str(&path[i..next]);
        i = next;
    }
    (out, numbers)
}

/// The folded path with each index's numbers: one (`layers.3.mlp`), a run
/// (`layers.{0..11}.mlp`) or a list (`layers.{0,2,5}.mlp`).
fn unfold(pattern: &str, mut numbers: Vec<Vec<u64>>) -> String {
    let mut out = String::with_capacity(pattern.len());
    for (k, part) in pattern.split("{}").enumerate() {
        if k > 0 {
            let mut v = numbers.get_mut(k - 1).map(std::mem::take).unwrap_or_default();
            v.sort_unstable();
            v.dedup();
            match v.as_slice() {
                [one] => out.push_str(&one.to_string()),
                [first, .., last] if (last - first) as usize + 1 == v.len() => out.push_str(&format!("{{{first}..{last}}}")),
                _ => {
                    let list: Vec<String> = v.iter().map(u64::to_string).collect();
                    out.push_str(&format!("{{{}}}", list.join(",")));
                }
            }
        }
        out.push_str(part);
    }
    out
}

/// The largest holders at the allocated peak, for summaries: at most `n`, inferred ones
/// included. `None` for a trace without memory events.
pub fn top_at_peak(trace: &Trace, n: usize) -> Option<Why> {
    let mut w = why_with(trace, &Moment::Peak, None, false).ok()?;
    w.holders.truncate(n);
    Some(w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Device, EventRecord, Phase, TraceMeta};

    fn ev(trace: &mut Trace, ts_ns: u64, event_type: EventType, address: u64, size: u64, layer: &str) {
        ev_in(trace, ts_ns, event_type, address, size, layer, Phase::Forward);
    }

    fn ev_in(trace: &mut Trace, ts_ns: u64, event_type: EventType, address: u64, size: u64, layer: &str, phase: Phase) {
        let layer = trace.strings.intern(layer);
        let stream = trace.stream_index("default");
        trace.events.push(EventRecord { ts_ns, event_type, phase, size_bytes: size, address, layer, device: 0, stream, totals: None });
    }

    fn holder(trace: &mut Trace, event: u32, kind: HolderKind, name: &str, module: &str, taken_ns: u64, released_ns: Option<u64>) {
        let (name, module) = (trace.strings.intern(name), trace.strings.intern(module));
        trace.event_holders.push(EventHolder { event, kind, name, module, taken_ns, released_ns });
    }

    /// Two layers' weights, their saved activations, a gradient on its way, a temporary.
    fn sample() -> Trace {
        sample_after(0)
    }

    /// The same, with `before` bytes allocated before the first event.
    fn sample_after(before: u64) -> Trace {
        let mut t = Trace::new(TraceMeta::new(crate::model::SourceFormat::MemoryTracer));
        t.device_index(Device { kind: "cuda".into(), index: 0, rank: None });
        t.events.set_base_totals(0, crate::model::Totals { allocated_bytes: before, reserved_bytes: 0 });
        ev(&mut t, 10, EventType::Alloc, 0x1000, 400, "layers.0.fc"); // 0 weight
        ev(&mut t, 11, EventType::Alloc, 0x2000, 400, "layers.1.fc"); // 1 weight
        ev(&mut t, 20, EventType::Alloc, 0x3000, 1000, "layers.0.fc"); // 2 saved by layer 0
        ev(&mut t, 21, EventType::Alloc, 0x4000, 1000, "layers.1.fc"); // 3 saved by layer 1
        ev(&mut t, 22, EventType::Alloc, 0x5000, 50, "loss"); // 4 temporary
        ev_in(&mut t, 30, EventType::Alloc, 0x6000, 400, "layers.1.fc", Phase::Backward); // 5 the gradient, before .grad
        ev(&mut t, 31, EventType::Free, 0x4000, 1000, "layers.1.fc"); // layer 1's backward ran
        ev(&mut t, 40, EventType::Free, 0x3000, 1000, "layers.0.fc");
        ev(&mut t, 41, EventType::Free, 0x5000, 50, "loss");
        holder(&mut t, 0, HolderKind::Parameter, "weight", "layers.0.fc", 10, None);
        holder(&mut t, 1, HolderKind::Parameter, "weight", "layers.1.fc", 11, None);
        holder(&mut t, 2, HolderKind::SavedForBackward, "aten::relu", "layers.0.fc", 20, Some(39));
        holder(&mut t, 3, HolderKind::SavedForBackward, "aten::relu", "layers.1.fc", 21, Some(31));
        holder(&mut t, 5, HolderKind::Gradient, "weight", "layers.1.fc", 32, None);
        t.marks.push(crate::model::Mark { ts_ns: 25, name: t.strings.intern("after_forward"), value: 0, rank: None });
        t.finish();
        t
    }

    #[test]
    fn the_peak_is_held_by_weights_and_saved_activations_and_a_gradient_not_yet_landed_is_not_its_holders() {
        let t = sample();
        let w = why(&t, &Moment::Peak, None).unwrap();
        assert_eq!(w.at.kind, "peak");
        assert_eq!(w.at.event, Some(5));
        assert_eq!(w.live_bytes, 400 + 400 + 1000 + 1000 + 50 + 400);
        let find = |kind: HolderKind| w.holders.iter().find(|g| g.kind == kind).unwrap();
        let saved = find(HolderKind::SavedForBackward);
        assert_eq!((saved.name.as_str(), saved.module.as_str(), saved.bytes, saved.blocks), ("aten::relu", "layers.{0..1}.fc", 2000, 2));
        // Layer 0's is released last: its holder lets go at 39, before the block's free at 40.
        assert_eq!(saved.released_at_s, Some((39 - 10) as f64 / 1e9));
        let params = find(HolderKind::Parameter);
        assert_eq!(
            (params.name.as_str(), params.module.as_str(), params.bytes, params.released_at_s),
            ("weight", "layers.{0..1}.fc", 800, None)
        );
        // Taken at 32, after the peak at 30: no recorded holder holds it at the peak; the
        // backward under way made it, so it is that backward's temporary (no operator was
        // recorded to name it by).
        assert!(!w.holders.iter().any(|g| g.kind == HolderKind::Gradient), "{:?}", w.holders);
        let on_its_way = find(HolderKind::Temporary);
        assert_eq!((on_its_way.name.as_str(), on_its_way.module.as_str(), on_its_way.bytes), ("made in this backward", "layers.1.fc", 400));
        assert_eq!(w.holders[0].kind, HolderKind::SavedForBackward, "largest first");
        assert_eq!(w.recorded_bytes, 2000 + 800 + 400);
        assert_eq!(w.recorded_bytes + w.inferred_bytes, w.named_bytes);
        assert_eq!(w.named_bytes, w.live_bytes - 50, "the forward's temporary is unknown");
        // The temporary nothing holds says what it likely is.
        let unknown = w.holders.iter().find(|g| g.kind == HolderKind::Unknown && g.module == "loss").unwrap();
        assert_eq!((unknown.name.as_str(), unknown.bytes), (unknown_name(Phase::Forward), 50));
        assert!(w.recorded);
    }

    #[test]
    fn a_workspace_a_library_keeps_is_named_apart_from_the_allocators_cache() {
        let mut t = Trace::new(TraceMeta::new(crate::model::SourceFormat::MemoryTracer));
        t.device_index(Device { kind: "cuda".into(), index: 0, rank: None });
        ev(&mut t, 10, EventType::SegmentAlloc, 0x1000, 4096, "");
        ev(&mut t, 11, EventType::Alloc, 0x1000, 400, "fc"); // 1 a weight
        ev(&mut t, 12, EventType::Alloc, 0x2000, 256, "fc"); // 2 a cuBLAS workspace
        ev(&mut t, 13, EventType::Alloc, 0x3000, 512, ""); // 3 nothing holds it
        holder(&mut t, 1, HolderKind::Parameter, "weight", "fc", 11, None);
        holder(&mut t, 2, HolderKind::Cache, "cuBLAS workspace", "", 12, None);
        t.finish();
        let w = why(&t, &Moment::Seconds(3e-9), None).unwrap();
        let caches: Vec<(&str, u64, u64)> =
            w.holders.iter().filter(|g| g.kind == HolderKind::Cache).map(|g| (g.name.as_str(), g.bytes, g.blocks)).collect();
        assert_eq!(caches, [("reserved, allocated to nothing", 4096 - 1168, 0), ("cuBLAS workspace", 256, 1)]);
        // The workspace is allocated and held: named; the allocator's cache is not allocated.
        assert_eq!((w.live_bytes, w.named_bytes), (1168, 656));
        // Where holders were recorded, a block none took is no parameter, whatever its lifetime.
        let unknown = w.holders.iter().find(|g| g.kind == HolderKind::Unknown).unwrap();
        assert_eq!((unknown.bytes, unknown.inferred), (512, false));
    }

    /// What a backward under way made and nothing holds yet is named by the node that made
    /// it: running still, or done (its output on its way); once the backward is over, no
    /// longer.
    #[test]
    fn the_backward_under_way_names_its_gradients_on_their_way_by_the_node_that_made_them() {
        let mut t = Trace::new(TraceMeta::new(crate::model::SourceFormat::MemoryTracer));
        t.device_index(Device { kind: "cuda".into(), index: 0, rank: None });
        ev(&mut t, 10, EventType::Alloc, 0x1000, 400, "fc"); // 0 the weight
        ev_in(&mut t, 30, EventType::Alloc, 0x2000, 100, "fc", Phase::Backward); // 1 MmBackward0's output
        ev_in(&mut t, 33, EventType::Alloc, 0x3000, 200, "fc", Phase::Backward); // 2 AddBackward0's, running
        ev_in(&mut t, 37, EventType::Alloc, 0x4000, 300, "fc", Phase::Backward); // 3 the peak
        ev_in(&mut t, 45, EventType::Free, 0x2000, 100, "fc", Phase::Backward);
        ev_in(&mut t, 46, EventType::Free, 0x3000, 200, "fc", Phase::Backward);
        ev_in(&mut t, 50, EventType::Alloc, 0x5000, 10, "", Phase::Other);
        ev_in(&mut t, 60, EventType::Free, 0x4000, 300, "fc", Phase::Other);
        holder(&mut t, 0, HolderKind::Parameter, "weight", "fc", 10, None);
        for (name, start_ns, end_ns) in [("MmBackward0", 29, 31), ("AddBackward0", 32, 40)] {
            let name = t.strings.intern(name);
            let layer = t.strings.intern("fc");
            t.ops.push(crate::model::OperatorEvent {
                name,
                phase: Phase::Backward,
                seq_nr: -1,
                start_ns,
                end_ns,
                thread: 1,
                fwd_thread: 0,
                layer,
                inputs: (0, 0),
                outputs: (0, 0),
            });
        }
        t.marks.push(crate::model::Mark { ts_ns: 48, name: t.strings.intern("after_backward"), value: 0, rank: None });
        t.finish();
        let w = why(&t, &Moment::Peak, None).unwrap();
        assert_eq!(w.at.event, Some(3));
        let temporaries: Vec<(&str, u64, u64)> =
            w.holders.iter().filter(|g| g.kind == HolderKind::Temporary).map(|g| (g.name.as_str(), g.bytes, g.blocks)).collect();
        assert_eq!(temporaries, [("AddBackward0 (running)", 500, 2), ("made by MmBackward0", 100, 1)]);
        assert_eq!((w.named_bytes, w.recorded_bytes, w.live_bytes), (1000, 1000, 1000));
        // After the backward: what it left no recorded holder holds is no longer its
        // temporary; its holder, if any, is inferred.
        let w = why(&t, &Moment::parse("after_backward").unwrap(), None).unwrap();
        assert!(!w.holders.iter().any(|g| g.kind == HolderKind::Temporary), "{:?}", w.holders);
        assert_eq!((w.live_bytes, w.recorded_bytes), (700, 400), "{:?}", w.holders);
    }

    /// A cache made by the last forward call is not this one's temporary, though no
    /// allocation came between the two calls.
    #[test]
    fn what_an_earlier_forward_call_left_is_not_this_ones_temporary() {
        let mut t = Trace::new(TraceMeta::new(crate::model::SourceFormat::MemoryTracer));
        t.device_index(Device { kind: "cuda".into(), index: 0, rank: None });
        ev_in(&mut t, 1, EventType::Alloc, 0x3000, 800, "", Phase::Other); // 0 the weight
        ev(&mut t, 10, EventType::Alloc, 0x1000, 400, "model"); // 1 a cache the first call keeps
        ev(&mut t, 25, EventType::Alloc, 0x2000, 100, "model"); // 2 the second call's output
        holder(&mut t, 0, HolderKind::Parameter, "weight", "model", 1, None);
        let name = t.strings.intern("model");
        for (start_ns, end_ns) in [(5, 20), (21, 40)] {
            t.scopes.push(crate::model::LayerScope { name, start_ns, end_ns, depth: 0, phase: Phase::Forward, thread: 1 });
        }
        t.finish();
        let w = why(&t, &Moment::Peak, None).unwrap();
        let temporaries: Vec<u64> = w.holders.iter().filter(|g| g.kind == HolderKind::Temporary).map(|g| g.bytes).collect();
        assert_eq!(temporaries, [100], "{:?}", w.holders);
    }

    #[test]
    fn a_mark_a_time_and_released_holders() {
        let t = sample();
        let w = why(&t, &Moment::parse("after_forward").unwrap(), None).unwrap();
        assert_eq!((w.at.kind.as_str(), w.at.name.as_deref(), w.at.event), ("mark", Some("after_forward"), Some(4)));
        assert_eq!(w.live_bytes, 2850);
        // After layer 1's backward (31) and before the free of the temporary: the saved block
        // of layer 1 is gone, layer 0's still held.
        let w = why(&t, &Moment::Seconds(25e-9), None).unwrap();
        let saved: u64 = w.holders.iter().filter(|g| g.kind == HolderKind::SavedForBackward).map(|g| g.bytes).sum();
        assert_eq!((w.at.event, saved, w.live_bytes), (Some(6), 1000, 400 + 400 + 1000 + 50 + 400));
    }

    #[test]
    fn moments_that_do_not_exist_say_what_does() {
        let t = sample();
        let e = why(&t, &Moment::parse("after_backward").unwrap(), None).unwrap_err();
        assert_eq!(e.to_string(), "`after_backward` is not peak, oom, seconds or a mark of the trace; its marks are: after_forward");
        let e = why(&t, &Moment::parse("after_forward#2").unwrap(), None).unwrap_err();
        assert!(e.to_string().starts_with("the trace has no mark `after_forward#2`"), "{e}");
        assert_eq!(why(&t, &Moment::Oom, None).unwrap_err(), WhyError::NoOom);
        assert!(matches!(why(&t, &Moment::Seconds(5.0), None), Err(WhyError::PastEnd { .. })));
        assert!(Moment::parse("x#0").is_err());
        assert!(Moment::parse("-1").is_err());
        assert_eq!(Moment::parse("1.5s"), Ok(Moment::Seconds(1.5)));
        assert_eq!(device_named(&t, "0"), Ok(0));
        assert!(matches!(device_named(&t, "cuda:3"), Err(WhyError::NoDevice { .. })));
    }

    #[test]
    fn without_recorded_holders_they_are_inferred_and_memory_from_before_is_unknown() {
        let mut t = sample_after(64);
        t.event_holders.clear();
        let w = why(&t, &Moment::Peak, None).unwrap();
        assert!(!w.recorded);
        assert!(w.holders.iter().filter(|g| g.kind != HolderKind::Unknown).all(|g| g.inferred));
        let before = w.holders.iter().find(|g| g.name == "allocated before the trace began").unwrap();
        assert_eq!(before.bytes, 64);
        assert_eq!(w.holders.iter().map(|g| g.bytes).sum::<u64>(), w.live_bytes);
    }

    #[test]
    fn folding_keeps_names_and_lists_gaps() {
        let (p, n) = fold("encoder.layers.11.mlp");
        assert_eq!((p.as_str(), n.as_slice()), ("encoder.layers.{}.mlp", &[11][..]));
        assert_eq!(unfold(&p, vec![vec![0, 2, 5]]), "encoder.layers.{0,2,5}.mlp");
        assert_eq!(unfold("a.{}.b.{}", vec![vec![1, 0, 1], vec![3]]), "a.{0..1}.b.3");
        assert_eq!(fold("layer1.conv").0, "layer1.conv");
        assert_eq!(fold("").0, "");
        // Python variables' subscripts fold too; other digits stay.
        let (p, n) = fold("train:history[12]");
        assert_eq!((p.as_str(), n.as_slice()), ("train:history[{}]", &[12][..]));
        assert_eq!(unfold(&p, vec![vec![3, 0, 1, 2]]), "train:history[{0..3}]");
        assert_eq!(fold("x2.h[a1].7").0, "x2.h[a1].{}");
        assert_eq!(fold("naïve.3").0, "naïve.{}");
    }

    /// A free the capture saw waiting for another stream (at a mark, 35): pending from its
    /// request (31) until the look that found it done (38), or until its space is taken again.
    #[test]
    fn a_free_seen_waiting_for_another_stream_is_pending_until_seen_done_or_reused() {
        let mut t = sample();
        t.event_holders.clear();
        holder(&mut t, 3, HolderKind::PendingFree, "", "", 35, Some(38));
        t.event_holders.sort_by_key(|h| (h.event, h.taken_ns));
        let pending = |t: &Trace, at_ns: u64| -> Vec<(u64, Option<f64>)> {
            let w = why(t, &Moment::Seconds((at_ns - 10) as f64 / 1e9), None).unwrap();
            w.holders.iter().filter(|g| g.kind == HolderKind::PendingFree).map(|g| (g.bytes, g.released_at_s)).collect()
        };
        assert_eq!(pending(&t, 30), []);
        assert_eq!(pending(&t, 31), [(1000, Some(28e-9))]);
        assert_eq!(pending(&t, 37), [(1000, Some(28e-9))]);
        assert_eq!(pending(&t, 38), []);
        // Never seen done, but its space taken again at 42: done by then.
        t.event_holders[0].released_ns = None;
        ev(&mut t, 42, EventType::Alloc, 0x4000, 200, "layers.1.fc");
        t.finish();
        assert_eq!(pending(&t, 41), [(1000, Some(32e-9))]);
        assert_eq!(pending(&t, 42), []);
        // Other frees stay done at once.
        assert!(why(&t, &Moment::Seconds(31e-9), None)
            .unwrap()
            .holders
            .iter()
            .all(|g| g.kind != HolderKind::PendingFree || g.bytes == 1000));
    }
}
