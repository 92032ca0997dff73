//! Importer of PyTorch memory snapshots (`torch.cuda.memory._dump_snapshot` pickles).
//!
//! Trace entries record requested sizes; the allocator counts blocks. The importer therefore
//! replays segments and blocks ([`crate::allocator`]) starting from the memory that existed
//! before recording began, recovered from the final `segments` state, so that every event's
//! `allocated_bytes` is what `torch.cuda.memory_allocated()` said at that moment.
//!
//! In the order an import runs:
//! - `compactor.rs`: the pickle hook that keeps each trace entry as a compact record
//!   (`entries.rs`; its pool and metadata in `extras.rs`) while the pickle streams;
//! - `view.rs`: the parsed pickle read through types, and the allocator settings;
//!   `budget.rs`: what walking it may cost;
//! - `finals.rs`: the final segments; `walk.rs`: the trace entries, merged by time;
//! - `start.rs`: the memory that existed before the first entry;
//! - `replay.rs`: the entries through the allocator models, their stacks entered by
//!   `stacks.rs`;
//! - `reserved.rs`: the check of allocated memory against reserved memory.

mod budget;
mod compactor;
mod entries;
mod extras;
mod finals;
mod replay;
mod reserved;
mod stacks;
mod start;
mod view;
mod walk;

use super::pickle;
use super::ImportError;
use crate::hash::FastSet as HashSet;
use crate::model::{SourceFormat, Trace, TraceMeta};
use budget::WalkBudget;
use compactor::Compactor;
use entries::{Entry, Streams};
use finals::{final_segments, RootIds};
use replay::{import_annotations, Replay};
use reserved::check_allocated_within_reserved;
use start::{allocator_states, PreExisting, StartState};
use view::{config_from_settings, to_json, View, SETTINGS_NODE_BUDGET};
use walk::{add_devices, walk_device_traces, Traces};

/// The device index pinned host memory's entries and segments take while the importer reads
/// them (CUDA devices are below it); it becomes the device after the last CUDA one.
const HOST_DEVICE: u8 = 255;

/// Imports a snapshot pickle.
pub fn import(data: &[u8]) -> Result<Trace, ImportError> {
    import_stream(data, Some(data.len() as u64))
}

/// Imports a snapshot pickle read from `src`, which is never held whole.
pub fn import_reader(src: impl std::io::Read) -> Result<Trace, ImportError> {
    import_stream(src, None)
}

/// Imports a snapshot pickle read from `src`: the pickle is parsed (its entries compacted as
/// they stream), then walked and replayed in stages.
fn import_stream(src: impl std::io::Read, size_hint: Option<u64>) -> Result<Trace, ImportError> {
    import_with(src, size_hint, Compactor::default())
}

fn import_with(src: impl std::io::Read, size_hint: Option<u64>, mut compactor: Compactor) -> Result<Trace, ImportError> {
    let p = pickle::parse_stream(src, size_hint, &mut compactor)?;
    let v = View { p: &p };
    let root = RootIds::find(&p)?;
    let settings = p.dict_get(p.root, "allocator_settings");
    let config = config_from_settings(&v, settings);
    let mut meta = TraceMeta::new(SourceFormat::PytorchSnapshot);
    let mut settings_budget = SETTINGS_NODE_BUDGET;
    meta.allocator_settings = settings.map(|s| to_json(&p, s, 0, &mut settings_budget));
    let mut trace = Trace::new(meta);

    let input_bytes = usize::try_from(p.input_bytes).unwrap_or(usize::MAX);
    let mut budget = WalkBudget::new(input_bytes);
    let mut finals = final_segments(&v, root.segments, false, &mut compactor.extras, &mut budget)?;
    if let Some(host) = p.dict_get(p.root, "host_segments") {
        finals.extend(final_segments(&v, host, true, &mut compactor.extras, &mut budget)?);
    }
    let traces = Traces { device: root.device_traces, host: p.dict_get(p.root, "host_traces") };
    if traces.host.is_some() && p.dict_get(p.root, "host_segments").is_none() {
        trace.meta.warnings.push(
            "the snapshot has `host_traces` but no `host_segments`: pinned host memory alive before recording began is unknown and taken as none"
                .to_owned(),
        );
    }
    let mut entries = walk_device_traces(&v, &traces, &mut compactor, &mut budget, &mut trace)?;
    let host = add_devices(&mut trace, &mut finals, &mut entries);
    let pre = PreExisting::scan(&entries, &compactor.streams);
    // Devices the snapshot names segments of: only there is reserved memory known.
    let with_segments: HashSet<usize> = finals.iter().map(|f| f.device).chain(pre.seg_ranges.keys().copied()).collect();
    let mut streams = Streams::default();
    let start = StartState::build(&finals, &pre, &config, &mut streams, &mut trace)?;
    let states = allocator_states(&mut trace, start.initial, &start.loose_allocated, &config, host, entries.len() > 0);

    // External annotations (e.g. `Optimizer.step#SGD.step`) become scopes, within the trace
    // entries' time (the entries are sorted by time by now).
    if let Some(ann) = p.dict_get(p.root, "external_annotations") {
        let ns = |e: &Entry| (e.time_us.max(0) as u64).saturating_mul(1000);
        let span = entries.ends().map(|(first, last)| (ns(first), ns(last)));
        import_annotations(&v, &mut trace, ann, span, &mut budget)?;
    }
    let mut replay = Replay::new(&trace, &finals, states, start.loose_allocated, start.loose_pending, streams);
    replay.run(&v, entries, &mut compactor, &mut trace)?;
    replay.finish(&mut compactor.extras, &mut trace);
    if replay.estimated > 0 {
        trace
            .meta
            .warnings
            .push(format!("{} frees of blocks not seen allocated were sized by rounding the requested size", replay.estimated));
    }
    trace.meta.start_unix_ns = trace.events.ts_ns.first().copied();
    trace.finish();
    check_allocated_within_reserved(&mut trace, &with_segments, host)?;
    Ok(trace)
}
