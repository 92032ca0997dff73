//! Joins the traces of one job's processes (torchrun ranks, one snapshot per rank) into one
//! trace: each input's devices become their own devices tagged with its rank, strings,
//! streams, stacks, tensors and threads are renumbered, and clocks are aligned on the inputs'
//! wall-clock starts (`TraceMeta::start_unix_ns`) when every input has one, else on each
//! rank's first iteration. [`super::rank_trace`] takes one rank back out.
//!
//! Totals stay each device's own (every event carries its device's allocated and reserved
//! bytes as its source reported them), so each rank's peak in the merged trace is its peak
//! in its own trace, to the byte.

use super::carry::{carry_event_extras, pool_map, thread_of, IdMap};
use super::{rank_of, rank_trace, ranks};
use crate::model::{Device, EventRecord, Frame, IterationSpan, Mark, RankVar, StrId, Totals, Trace, TraceMeta};
use std::collections::BTreeMap;

/// One process's trace and its rank.
#[derive(Debug)]
pub struct MergeInput {
    pub trace: Trace,
    pub rank: u32,
    /// What to call it in warnings (a file name).
    pub label: String,
}

/// Which rank a trace of one process is when merged (a merged trace brings its own ranks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InputRank {
    /// This rank: `collector merge --ranks`, or the rank a traced process ran as.
    Given(u32),
    /// The rank the trace recorded or its label names ([`rank_of`]), else this one (the
    /// input's position among those given).
    NamedOr(u32),
    /// The rank the trace recorded or its label names; a trace with neither is refused
    /// ([`MergeError::NoRank`]).
    Named,
}

impl MergeInput {
    /// What `trace`, read from `label` (a file name, a node), brings to a merge: each rank of
    /// a merged trace taken back out (labelled `LABEL rank N`), else the whole trace as the rank
    /// `rank` says. Every merge of ranks (`collector merge`, a torchrun job's ranks, a
    /// multi-node job's parts) takes its inputs through here, so a merged trace can be merged
    /// again.
    pub fn of(trace: Trace, label: &str, rank: InputRank) -> Result<Vec<MergeInput>, MergeError> {
        let held = ranks(&trace);
        if !held.is_empty() {
            return Ok(held
                .into_iter()
                .filter_map(|r| Some(MergeInput { trace: rank_trace(&trace, r)?, rank: r, label: format!("{label} rank {r}") }))
                .collect());
        }
        let rank = match rank {
            InputRank::Given(r) => r,
            InputRank::NamedOr(k) => rank_of(&trace, label).unwrap_or(k),
            InputRank::Named => rank_of(&trace, label).ok_or_else(|| MergeError::NoRank { label: label.to_owned() })?,
        };
        Ok(vec![MergeInput { trace, rank, label: label.to_owned() }])
    }
}

/// The ranks below `world` that none of `inputs` is, each with `why(rank)`: what
/// [`MergeOptions::missing_reasons`] takes.
pub fn absent_ranks(inputs: &[MergeInput], world: u32, why: impl Fn(u32) -> String) -> BTreeMap<u32, String> {
    (0..world).filter(|r| !inputs.iter().any(|i| i.rank == *r)).map(|r| (r, why(r))).collect()
}

/// How to merge.
#[derive(Clone, Debug, Default)]
pub struct MergeOptions {
    /// Why a rank of the job has no trace (a rank that never connected), by rank.
    pub missing_reasons: BTreeMap<u32, String>,
    /// Merge inputs whose recorded times do not overlap (said in a warning) instead of
    /// refusing them as traces of different runs.
    pub allow_disjoint: bool,
}

/// Why traces cannot be merged.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error("nothing to merge: expected at least one trace")]
    Empty,
    /// A part of a job that must name its rank ([`InputRank::Named`]: a node's part) names none.
    #[error("{label}'s part names no rank (RANK)")]
    NoRank { label: String },
    #[error("rank {0} is given twice ({1} and {2}); expected one trace per rank")]
    DuplicateRank(u32, String, String),
    #[error("the merged trace would have {0} devices; at most 256 fit")]
    TooManyDevices(usize),
    #[error("{a} and {b} come from different jobs ({why}); expected the ranks of one job")]
    DifferentJobs { a: String, b: String, why: String },
    #[error("{label} is rank {rank} but its job has {world} ranks (WORLD_SIZE); expected ranks 0 to {last}", last = world - 1)]
    RankOutOfRange { label: String, rank: u32, world: u64 },
    #[error(
        "{a} ({a_span}) and {b} ({b_span}) were recorded at different times, so they are not ranks of one run; \
         pass --allow-disjoint to merge them anyway"
    )]
    Disjoint { a: String, a_span: String, b: String, b_span: String },
}

/// Times at or past this (1973 in Unix nanoseconds) are wall-clock times, not times since the
/// trace's start.
const WALL_CLOCK_NS: i128 = 100_000_000_000_000_000;

/// Inputs whose recordings are further apart than this (and than the longest of them) are
/// not ranks of one run.
const DISJOINT_AFTER_NS: i128 = 60_000_000_000;

/// Where a trace's time 0 lies on the wall clock and where its first event lies on it:
/// (start, start) for traces timed from their start (native capture), (0, first event) for
/// traces timed on the wall clock already (snapshots).
fn wall_origin(t: &Trace) -> Option<(i128, i128)> {
    let start = i128::from(t.meta.start_unix_ns?);
    let first = t.events.ts_ns.first().map_or(0, |&f| i128::from(f));
    Some(if first >= WALL_CLOCK_NS { (0, first) } else { (start, start) })
}

/// Refuses inputs that cannot be ranks of one job: different job ids or world sizes, ranks
/// past the world size.
fn check_same_job(inputs: &[MergeInput]) -> Result<Option<u64>, MergeError> {
    let world = |i: &MergeInput| i.trace.meta.rank_var(RankVar::WorldSize);
    let mut job: Option<(&MergeInput, &str)> = None;
    let mut size: Option<(&MergeInput, u64)> = None;
    for i in inputs {
        if let Some(j) = i.trace.meta.job.as_deref() {
            match job {
                Some((first, fj)) if fj != j => {
                    return Err(MergeError::DifferentJobs {
                        a: first.label.clone(),
                        b: i.label.clone(),
                        why: format!("job {fj} and job {j}"),
                    })
                }
                None => job = Some((i, j)),
                _ => {}
            }
        }
        if let Some(w) = world(i) {
            match size {
                Some((first, fw)) if fw != w => {
                    return Err(MergeError::DifferentJobs {
                        a: first.label.clone(),
                        b: i.label.clone(),
                        why: format!("world sizes {fw} and {w}"),
                    })
                }
                None => size = Some((i, w)),
                _ => {}
            }
            if u64::from(i.rank) >= w {
                return Err(MergeError::RankOutOfRange { label: i.label.clone(), rank: i.rank, world: w });
            }
        }
    }
    Ok(size.map(|(_, w)| w))
}

/// A span of wall-clock time, for messages.
fn wall_span(from_ns: i128, to_ns: i128) -> String {
    let secs = |ns: i128| ns.div_euclid(1_000_000_000);
    let clock = |ns: i128| {
        let s = secs(ns).rem_euclid(86_400);
        format!("{:02}:{:02}:{:02} UTC", s / 3600, s / 60 % 60, s % 60)
    };
    let days = secs(to_ns).div_euclid(86_400) - secs(from_ns).div_euclid(86_400);
    let later = if days > 0 { format!(" {days} day(s) later") } else { String::new() };
    format!("{} to {}{later}", clock(from_ns), clock(to_ns))
}

/// Ranks of one run overlap in time (give or take their start-up); inputs far apart were
/// recorded by different runs.
fn check_overlap(inputs: &[MergeInput], opts: &MergeOptions, meta: &mut TraceMeta) -> Result<(), MergeError> {
    // Each input's first and last moment on the wall clock.
    let spans: Vec<(i128, i128)> = inputs
        .iter()
        .filter_map(|i| {
            let (origin, _) = wall_origin(&i.trace)?;
            Some((origin + i128::from(i.trace.start_ns()), origin + i128::from(i.trace.end_ns())))
        })
        .collect();
    // Ranks start seconds apart (imports, rendezvous); a gap longer than a minute and than
    // the longest rank's run is another run.
    let longest = spans.iter().map(|s| s.1 - s.0).max().unwrap_or(0);
    let tolerance = longest.max(DISJOINT_AFTER_NS);
    for (a, sa) in spans.iter().enumerate() {
        for (b, sb) in spans.iter().enumerate().skip(a + 1) {
            if sb.0 - sa.1 > tolerance || sa.0 - sb.1 > tolerance {
                let (la, lb) = (&inputs[a].label, &inputs[b].label);
                let (spa, spb) = (wall_span(sa.0, sa.1), wall_span(sb.0, sb.1));
                if !opts.allow_disjoint {
                    return Err(MergeError::Disjoint { a: la.clone(), a_span: spa, b: lb.clone(), b_span: spb });
                }
                meta.warnings.push(format!("{la} ({spa}) and {lb} ({spb}) were recorded far apart in time; merged as asked"));
            }
        }
    }
    Ok(())
}

/// Merges `inputs` (in any order) into one trace, ranks ascending.
pub fn merge(inputs: Vec<MergeInput>) -> Result<Trace, MergeError> {
    merge_with(inputs, &MergeOptions::default())
}

/// [`merge`] with options.
pub fn merge_with(mut inputs: Vec<MergeInput>, opts: &MergeOptions) -> Result<Trace, MergeError> {
    let world = check_inputs(&mut inputs)?;
    let clocks = Clocks::of(&inputs);
    let meta = merged_meta(&inputs, opts, world, &clocks)?;
    let mut out = Trace::new(meta);
    let maps: Vec<InputMap> = inputs.iter().enumerate().map(|(k, input)| InputMap::build(&mut out, input, k, &clocks)).collect();
    merge_events(&inputs, &maps, &mut out);
    for (k, (input, m)) in inputs.iter().zip(&maps).enumerate() {
        append_records(&mut out, input, m);
        // The job's iterations are those of the lowest rank.
        if k == 0 {
            let t = &input.trace;
            out.iterations = t
                .iterations
                .iter()
                .map(|it| IterationSpan { index: it.index, start_ns: m.at(it.start_ns), end_ns: m.at(it.end_ns) })
                .collect();
        }
    }
    out.ops.sort_by_key(|o| o.start_ns);
    out.scopes.sort_by_key(|x| (x.start_ns, x.depth));
    out.marks.sort_by_key(|x| x.ts_ns);
    out.device_samples.sort_by_key(|x| x.ts_ns);
    out.ledger.events.sort_by_key(|x| x.ts_ns);
    out.ledger.process.sort_by_key(|x| x.ts_ns);
    out.finish();
    Ok(out)
}

/// Takes the inputs; sorts them by rank and refuses what cannot be merged (none, a rank twice,
/// too many devices, different jobs); gives the job's world size where the inputs report one.
fn check_inputs(inputs: &mut [MergeInput]) -> Result<Option<u64>, MergeError> {
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
    check_same_job(inputs)
}

/// How the inputs' clocks line up.
struct Clocks {
    /// Every input has a wall-clock start: times are aligned on the wall clock.
    aligned: bool,
    /// Earliest first event on the wall clock (0 when no input has a wall clock).
    start: i128,
    /// Start of each input's first iteration.
    first_iteration: Vec<Option<u64>>,
    /// Not aligned, but every rank has an iteration: ranks line up on their first iteration.
    on_iterations: bool,
}

impl Clocks {
    /// Takes the inputs (sorted by rank); gives how their clocks line up.
    fn of(inputs: &[MergeInput]) -> Self {
        let aligned = inputs.iter().all(|i| wall_origin(&i.trace).is_some());
        let start = inputs.iter().filter_map(|i| wall_origin(&i.trace)).map(|(_, s)| s).min().unwrap_or(0);
        // Without wall clocks, ranks line up on their first iteration when every rank has one.
        let first_iteration: Vec<Option<u64>> =
            inputs.iter().map(|i| crate::analysis::iterations::spans(&i.trace).spans.first().map(|s| s.start_ns)).collect();
        let on_iterations = !aligned && first_iteration.iter().all(Option::is_some);
        Clocks { aligned, start, first_iteration, on_iterations }
    }
}

/// Takes the checked inputs and their clocks; gives the merged trace's metadata (refusing
/// inputs recorded far apart unless allowed), with warnings for unaligned clocks and missing
/// ranks.
fn merged_meta(inputs: &[MergeInput], opts: &MergeOptions, world: Option<u64>, clocks: &Clocks) -> Result<TraceMeta, MergeError> {
    let first = &inputs[0].trace.meta;
    let mut meta = TraceMeta::new(first.source_format);
    meta.model = first.model.clone();
    meta.pytorch_version = first.pytorch_version.clone();
    meta.input_shape = first.input_shape.clone();
    meta.batch_size = first.batch_size;
    meta.fragmentation_tracked = inputs.iter().all(|i| i.trace.meta.fragmentation_tracked);
    meta.job = inputs.iter().find_map(|i| i.trace.meta.job.clone());
    if clocks.aligned {
        check_overlap(inputs, opts, &mut meta)?;
    }
    meta.start_unix_ns = clocks.aligned.then_some(clocks.start.max(0) as u64);
    let names: Vec<String> = inputs.iter().map(|i| i.trace.meta.device_name.clone().unwrap_or_default()).collect();
    if names.windows(2).all(|w| w[0] == w[1]) {
        meta.device_name = first.device_name.clone();
        meta.device_total_memory_bytes = first.device_total_memory_bytes;
    }
    if !clocks.aligned {
        let missing: Vec<&str> = inputs.iter().filter(|i| i.trace.meta.start_unix_ns.is_none()).map(|i| i.label.as_str()).collect();
        meta.warnings.push(if clocks.on_iterations {
            format!(
                "clocks not aligned: {} record no wall-clock start, so the ranks are aligned on their first iteration",
                missing.join(", ")
            )
        } else {
            format!(
                "clocks not aligned: {} record no wall-clock start and not every rank has iterations, so every rank keeps its own clock",
                missing.join(", ")
            )
        });
    }
    if let Some(w) = world {
        let given: Vec<u32> = inputs.iter().map(|i| i.rank).collect();
        meta.missing_ranks = (0..w).filter_map(|r| u32::try_from(r).ok()).filter(|r| !given.contains(r)).collect();
        for r in &meta.missing_ranks {
            let why = opts.missing_reasons.get(r).map_or("no trace of it was given", String::as_str);
            meta.warnings.push(format!("rank {r} of {w} is missing: {why}"));
        }
    }
    Ok(meta)
}

/// Where one input's devices, streams and strings went in the merged trace, and its time
/// offset.
struct InputMap {
    /// `u8::MAX` for a device the input never used.
    devices: Vec<u8>,
    streams: Vec<u16>,
    strings: Vec<StrId>,
    /// Added to the input's times (may be negative for wall-clock-timed inputs).
    shift_ns: i128,
}

impl InputMap {
    /// Takes input `k`; adds its strings, used devices (with their base totals) and streams to
    /// `out`, and its reported values, warnings and dropped-event count; gives where they went.
    fn build(out: &mut Trace, input: &MergeInput, k: usize, clocks: &Clocks) -> Self {
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
        let shift_ns = match (clocks.aligned, wall_origin(t), clocks.first_iteration[k]) {
            (true, Some((o, _)), _) => o - clocks.start,
            (false, _, Some(it)) if clocks.on_iterations => i128::from(clocks.first_iteration[0].unwrap_or(0)) - i128::from(it),
            _ => 0,
        };
        for (k, v) in &t.meta.reported {
            out.meta.reported.insert(format!("rank{}.{k}", input.rank), *v);
        }
        for w in &t.meta.warnings {
            out.meta.warnings.push(format!("rank {}: {w}", input.rank));
        }
        if let Some(c) = &t.meta.compiled {
            out.meta.compiled.get_or_insert_with(Default::default).absorb(c);
        }
        out.dropped_events += t.dropped_events;
        InputMap { devices, streams, strings, shift_ns }
    }

    /// An input time on the merged clock.
    fn at(&self, ts: u64) -> u64 {
        (i128::from(ts) + self.shift_ns).clamp(0, i128::from(u64::MAX)) as u64
    }

    /// An input string id in the merged table.
    fn str(&self, id: StrId) -> StrId {
        if id == StrId::NONE {
            StrId::NONE
        } else {
            self.strings.get(id.0 as usize).copied().unwrap_or(StrId::NONE)
        }
    }
}

/// An event of one input, placed on the merged clock.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct MergedEvent {
    ts_ns: u64,
    input: usize,
    /// Index in the input's events.
    index: usize,
}

/// Takes the inputs and their maps; appends the events of all inputs to `out` in time order,
/// each with its totals as its source had them, and their stacks.
fn merge_events(inputs: &[MergeInput], maps: &[InputMap], out: &mut Trace) {
    let mut order: Vec<MergedEvent> = Vec::new();
    let mut totals: Vec<Vec<Totals>> = Vec::with_capacity(inputs.len());
    for (k, input) in inputs.iter().enumerate() {
        let ev = &input.trace.events;
        let mut cur = ev.cursor();
        totals.push((0..ev.len()).map(|_| cur.advance()).collect());
        order.extend((0..ev.len()).map(|i| MergedEvent { ts_ns: maps[k].at(ev.ts_ns[i]), input: k, index: i }));
    }
    order.sort_unstable();
    // Where each event went, for inputs whose pools and notes name events.
    let mut new_of: Vec<Vec<u32>> =
        inputs.iter().map(|x| if x.trace.has_event_extras() { vec![u32::MAX; x.trace.events.len()] } else { Vec::new() }).collect();
    for MergedEvent { ts_ns, input: k, index: i } in order {
        let (t, m) = (&inputs[k].trace, &maps[k]);
        let rec = t.events.record(i);
        let new_index = out.events.len() as u32;
        if let Some(slot) = new_of[k].get_mut(i) {
            *slot = new_index;
        }
        out.events.push(EventRecord {
            ts_ns,
            layer: m.str(rec.layer),
            device: m.devices[rec.device as usize],
            stream: m.streams.get(rec.stream as usize).copied().unwrap_or(0),
            totals: Some(totals[k][i]),
            ..rec
        });
        if let Some(stack) = t.stacks.stack_of_event(i) {
            let ns = copy_stack(out, t, m, stack);
            out.stacks.event_stacks.push((new_index, ns));
        }
    }
    for (k, input) in inputs.iter().enumerate() {
        let new_of = &new_of[k];
        let new_index = |i: u32| new_of.get(i as usize).copied().filter(|&n| n != u32::MAX);
        carry_event_extras(out, &input.trace, &new_index, &mut MergedIds(&input.trace, &maps[k]));
    }
    out.event_pools.sort_by_key(|&(e, _)| e);
    out.event_requested.sort_unstable_by_key(|&(e, _)| e);
    out.event_notes.sort_by_key(|n| (n.event, n.ts_ns));
    out.event_holders.sort_by_key(|h| (h.event, h.taken_ns));
}

/// Stack `stack` of `t` in `out`'s tables.
fn copy_stack(out: &mut Trace, t: &Trace, m: &InputMap, stack: u32) -> u32 {
    let frames: Vec<u32> = t
        .stacks
        .stack(stack)
        .map(|f| out.stacks.intern_frame(Frame { name: m.str(f.name), filename: m.str(f.filename), line: f.line }))
        .collect();
    out.stacks.intern_stack(frames)
}

/// An input's ids in the merged trace.
struct MergedIds<'a>(&'a Trace, &'a InputMap);

impl IdMap for MergedIds<'_> {
    fn text(&mut self, _: &mut Trace, id: StrId) -> StrId {
        self.1.str(id)
    }
    fn stack(&mut self, out: &mut Trace, stack: u32) -> u32 {
        copy_stack(out, self.0, self.1, stack)
    }
    fn time(&self, ts_ns: u64) -> u64 {
        self.1.at(ts_ns)
    }
}

/// Takes one input and its map; appends its shapes, tensors, operators, scopes, initial
/// segments, device samples and marks to `out`, renumbered and on the merged clock.
fn append_records(out: &mut Trace, input: &MergeInput, m: &InputMap) {
    let t = &input.trace;
    let tensors = out.tensors.len() as u32;
    let shapes = out.shapes.len() as u32;
    out.shapes.extend(t.shapes.iter().cloned());
    out.tensors.extend(t.tensors.iter().map(|x| {
        let mut x = *x;
        if x.shape != u32::MAX {
            x.shape += shapes;
        }
        x
    }));
    for o in &t.ops {
        let mut o = o.clone();
        o.name = m.str(o.name);
        o.layer = m.str(o.layer);
        o.start_ns = m.at(o.start_ns);
        o.end_ns = m.at(o.end_ns);
        o.thread = thread_of(input.rank, o.thread);
        if o.fwd_thread != 0 {
            o.fwd_thread = thread_of(input.rank, o.fwd_thread);
        }
        o.inputs = (o.inputs.0 + tensors, o.inputs.1 + tensors);
        o.outputs = (o.outputs.0 + tensors, o.outputs.1 + tensors);
        out.ops.push(o);
    }
    for sc in &t.scopes {
        let mut sc = sc.clone();
        sc.name = m.str(sc.name);
        sc.start_ns = m.at(sc.start_ns);
        sc.end_ns = m.at(sc.end_ns);
        sc.thread = thread_of(input.rank, sc.thread);
        out.scopes.push(sc);
    }
    let pools = pool_map(out, t);
    for seg in &t.initial_segments {
        let mut seg = seg.clone();
        seg.device = m.devices[seg.device as usize];
        seg.stream = m.streams.get(seg.stream as usize).copied().unwrap_or(0);
        seg.private_pool = seg.private_pool.and_then(|p| pools.get(p as usize).copied());
        out.initial_segments.push(seg);
    }
    for d in &t.device_samples {
        let mut d = *d;
        d.device = m.devices[d.device as usize];
        d.ts_ns = m.at(d.ts_ns);
        out.device_samples.push(d);
    }
    for mk in &t.marks {
        out.marks.push(Mark { ts_ns: m.at(mk.ts_ns), name: m.str(mk.name), value: mk.value, rank: Some(input.rank) });
    }
    // Each rank's device ledger, on its own device.
    for e in &t.ledger.events {
        let mut e = *e;
        e.device = m.devices[e.device as usize];
        e.ts_ns = m.at(e.ts_ns);
        e.source = m.str(e.source);
        e.frame = m.str(e.frame);
        out.ledger.events.push(e);
    }
    for p in &t.ledger.process {
        let mut p = *p;
        p.device = m.devices[p.device as usize];
        p.ts_ns = m.at(p.ts_ns);
        out.ledger.process.push(p);
    }
    out.ledger.missing.extend(t.ledger.missing.iter().map(|w| format!("rank {}: {w}", input.rank)));
}
