//! What an iteration is, for every analysis: the spans of a trace's iterations and where they
//! came from ([`spans`]), the scopes that stand for iterations ([`is_iteration_scope`]), and
//! memory per iteration ([`per_iteration`], `memory.rs`).
//!
//! Spans come from, in order: the trace's iteration marks (native capture: optimizer steps or
//! `--iteration-marker`; snapshots' annotations), else the profiler's `ProfilerStep#N` scopes,
//! else `Optimizer.step` / `optimizer.step` scopes (each iteration ends when a step ends), else
//! the period of the sequence of allocation sizes any training or inference loop produces
//! ([`repeating_spans`]).

mod memory;
mod repeating;

pub use memory::{per_iteration, IterationMemory, IterationsReport};
pub use repeating::repeating_spans;

use crate::model::{IterationSpan, Trace};

/// Where a trace's iteration spans came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpansFrom {
    /// The trace's own iteration marks.
    Marks,
    /// The profiler's `ProfilerStep#N` scopes.
    ProfilerSteps,
    /// Optimizer step scopes: each iteration ends where a step ends.
    OptimizerSteps,
    /// The period of the allocation sizes.
    RepeatingAllocations,
    /// Nothing marks or repeats: no spans.
    Nothing,
}

impl SpansFrom {
    /// How reports say it (`iterations_from`).
    pub fn describe(self) -> &'static str {
        match self {
            SpansFrom::Marks => "iteration marks",
            SpansFrom::ProfilerSteps => "profiler steps",
            SpansFrom::OptimizerSteps => "optimizer steps",
            SpansFrom::RepeatingAllocations => "repeating allocation sizes",
            SpansFrom::Nothing => "none (no iteration marks, profiler or optimizer steps, or repeating allocations)",
        }
    }

    /// Whether the trace itself said where its iterations are (marks, profiler steps), rather
    /// than its optimizer's scopes or its allocations suggesting it.
    pub fn is_recorded(self) -> bool {
        matches!(self, SpansFrom::Marks | SpansFrom::ProfilerSteps)
    }
}

/// A trace's iterations, in time order, and where they came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Spans {
    pub spans: Vec<IterationSpan>,
    pub from: SpansFrom,
}

impl Spans {
    /// Each span as (start, end) in trace time.
    pub fn bounds(&self) -> Vec<(u64, u64)> {
        self.spans.iter().map(|s| (s.start_ns, s.end_ns)).collect()
    }
}

/// The iterations of `trace` (see the module's order of sources).
pub fn spans(trace: &Trace) -> Spans {
    if !trace.iterations.is_empty() {
        let mut spans = trace.iterations.clone();
        spans.sort_by_key(|s| (s.start_ns, s.end_ns));
        return Spans { spans, from: SpansFrom::Marks };
    }
    let mut steps: Vec<IterationSpan> = trace
        .scopes
        .iter()
        .filter_map(|s| {
            let n = trace.opt_str(s.name)?.strip_prefix("ProfilerStep#")?;
            Some(IterationSpan { index: n.parse().ok()?, start_ns: s.start_ns, end_ns: s.end_ns })
        })
        .collect();
    if !steps.is_empty() {
        steps.sort_by_key(|s| s.start_ns);
        return Spans { spans: steps, from: SpansFrom::ProfilerSteps };
    }
    let mut ends: Vec<u64> = trace
        .scopes
        .iter()
        .filter(|s| {
            let n = trace.str(s.name);
            n.starts_with("Optimizer.step") || (n.starts_with("optimizer") && n.ends_with(".step") && s.depth == 0)
        })
        .map(|s| s.end_ns)
        .collect();
    ends.sort_unstable();
    ends.dedup();
    let mut start = trace.events.ts_ns.first().copied().unwrap_or(0);
    let spans = numbered(ends.into_iter().map(|e| (std::mem::replace(&mut start, e), e)));
    if !spans.is_empty() {
        return Spans { spans, from: SpansFrom::OptimizerSteps };
    }
    let spans = numbered(repeating_spans(trace).into_iter());
    let from = if spans.is_empty() { SpansFrom::Nothing } else { SpansFrom::RepeatingAllocations };
    Spans { spans, from }
}

/// (start, end) pairs as spans numbered 0, 1, … in order.
fn numbered(bounds: impl Iterator<Item = (u64, u64)>) -> Vec<IterationSpan> {
    bounds.enumerate().map(|(k, (start_ns, end_ns))| IterationSpan { index: k as u32, start_ns, end_ns }).collect()
}

/// Whether a scope of this name stands for an iteration (`ProfilerStep#3`, a marked
/// `iteration …`) rather than for code: views that draw modules leave it out.
pub fn is_iteration_scope(name: &str) -> bool {
    name.starts_with("ProfilerStep#") || name.starts_with("iteration")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Device, EventRecord, EventType, LayerScope, Phase, SourceFormat, StrId, TraceMeta};

    /// A loop of `n` iterations of three allocations (sizes 1, 2, 3 KiB, freed), one `ProfilerStep#k`
    /// scope and one `Optimizer.step#SGD.step` scope per iteration, each iteration 100 µs long.
    fn looped(n: u64) -> Trace {
        let mut t = Trace::new(TraceMeta::new(SourceFormat::MemoryTracer));
        t.device_index(Device { kind: "cuda".into(), index: 0, rank: None });
        let step = t.strings.intern("Optimizer.step#SGD.step");
        for k in 0..n {
            let base = 1_000 + k * 100_000;
            for (j, size) in [1024u64, 2048, 3072].into_iter().enumerate() {
                for (dt, event_type) in [(j as u64 * 10_000, EventType::Alloc), (j as u64 * 10_000 + 5_000, EventType::Free)] {
                    t.events.push(EventRecord {
                        ts_ns: base + dt,
                        event_type,
                        phase: Phase::Forward,
                        size_bytes: size,
                        address: 4096 * (j as u64 + 1),
                        layer: StrId::NONE,
                        device: 0,
                        stream: 0,
                        totals: None,
                    });
                }
            }
            let name = t.strings.intern(&format!("ProfilerStep#{}", k + 7));
            let scope = |name, start_ns, end_ns| LayerScope { name, start_ns, end_ns, depth: 0, phase: Phase::Other, thread: 0 };
            t.scopes.push(scope(name, base, base + 90_000));
            t.scopes.push(scope(step, base + 60_000, base + 80_000));
        }
        t.finish();
        t
    }

    /// Each source is taken only when those before it are absent: marks, profiler steps,
    /// optimizer steps, the repeating allocation sizes, nothing.
    #[test]
    fn spans_come_from_the_first_source_the_trace_has() {
        let mut t = looped(4);
        t.iterations =
            vec![IterationSpan { index: 1, start_ns: 200_000, end_ns: 300_000 }, IterationSpan { index: 0, start_ns: 0, end_ns: 100_000 }];
        let marked = spans(&t);
        assert_eq!((marked.from, marked.bounds()), (SpansFrom::Marks, vec![(0, 100_000), (200_000, 300_000)]));
        t.iterations.clear();
        let profiled = spans(&t);
        assert_eq!(profiled.from, SpansFrom::ProfilerSteps);
        assert_eq!(
            profiled.spans.iter().map(|s| (s.index, s.start_ns)).collect::<Vec<_>>(),
            [(7, 1_000), (8, 101_000), (9, 201_000), (10, 301_000)]
        );
        let profiler_steps: Vec<StrId> = t.scopes.iter().filter(|s| is_iteration_scope(t.str(s.name))).map(|s| s.name).collect();
        assert_eq!(profiler_steps.len(), 4);
        t.scopes.retain(|s| !profiler_steps.contains(&s.name));
        let stepped = spans(&t);
        assert_eq!(stepped.from, SpansFrom::OptimizerSteps);
        assert_eq!(stepped.bounds(), [(1_000, 81_000), (81_000, 181_000), (181_000, 281_000), (281_000, 381_000)]);
        t.scopes.clear();
        let repeating = spans(&t);
        assert_eq!(repeating.from, SpansFrom::RepeatingAllocations);
        assert_eq!(repeating.spans.len(), 4, "{:?}", repeating.spans);
        assert!(SpansFrom::ProfilerSteps.is_recorded() && !SpansFrom::RepeatingAllocations.is_recorded());
        let mut lone = looped(1);
        lone.scopes.clear();
        assert_eq!(spans(&lone), Spans { spans: Vec::new(), from: SpansFrom::Nothing });
    }

    #[test]
    fn iteration_scopes_are_profiler_steps_and_marked_iterations() {
        assert!(is_iteration_scope("ProfilerStep#3") && is_iteration_scope("iteration 2"));
        assert!(!is_iteration_scope("model.layers.0") && !is_iteration_scope("Optimizer.step#SGD.step") && !is_iteration_scope(""));
    }
}
