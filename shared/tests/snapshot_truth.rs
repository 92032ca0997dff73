//! Snapshots recorded the ways users record them (per-rank snapshots with memory from before
//! recording, other tools' traces, C++'s unknown line), checked against PyTorch's own counters
//! (`tests/data/rank_facts.json`, `facts.json`), and what every snapshot's replay must keep:
//! allocated within reserved at every event, and an end state equal to the final segments.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use shared::analysis::{segments_at, summary};
use shared::import::pickle::{self, Value};
use shared::model::BlockState;
use shared::{import, ImportOptions};
use std::collections::BTreeSet;
use std::io::Read;
use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data")
}

fn data(name: &str) -> Vec<u8> {
    let p = dir().join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

fn fact(file: &str, sample: &str, key: &str) -> u64 {
    let facts: serde_json::Value = serde_json::from_slice(&data(file)).unwrap();
    facts["samples"][sample][key].as_u64().unwrap_or_else(|| panic!("{file} lacks {sample}.{key}"))
}

/// DDP and FSDP2 ranks recorded from after the model was built (parameters, DDP buckets, NCCL
/// and FSDP state alive before recording), with uneven work per rank. FSDP2 rank 1 read
/// 8192 B above PyTorch's peak (and 4096 B at the end) when the start state left the free
/// space of segments from before recording without blocks: an allocation there took the
/// whole gap up to the next block instead of splitting a free block.
#[test]
fn per_rank_snapshots_match_pytorchs_counters_exactly() {
    for mode in ["ddp", "fsdp2"] {
        for rank in 0..2 {
            let name = format!("{mode}_rank{rank}.pickle.gz");
            let trace = import(&data(&name), &ImportOptions::default()).unwrap();
            let s = summary(&trace);
            let f = |k| fact("rank_facts.json", &name, k);
            assert_eq!(s.peak_allocated_bytes, f("max_allocated"), "{name}: max_allocated");
            assert_eq!(s.peak_reserved_bytes, f("max_reserved"), "{name}: max_reserved");
            assert_eq!(s.final_allocated_bytes, f("end_allocated"), "{name}: end_allocated");
            assert_eq!(s.final_reserved_bytes, f("end_reserved"), "{name}: end_reserved");
        }
    }
}

/// A trace whose frees are `free_completed` entries alone (no `free_requested` first), as
/// other recorders write them: memory_viz reads either as the free, and so must the replay.
/// Before, those frees were dropped and allocated grew past reserved.
#[test]
fn frees_written_as_free_completed_alone_are_frees() {
    let trace = import(&data("free_completed_only.pickle.gz"), &ImportOptions::default()).unwrap();
    let s = summary(&trace);
    assert_eq!(s.peak_allocated_bytes, fact("facts.json", "resnet18_sgd_2steps.pickle", "max_allocated"));
    assert_eq!(s.final_allocated_bytes, fact("facts.json", "resnet18_sgd_2steps.pickle", "end_allocated"));
    assert_eq!(s.peak_reserved_bytes, fact("facts.json", "resnet18_sgd_2steps.pickle", "max_reserved"));
}

/// A snapshot whose segments cannot hold its allocations (here its frees were dropped; some
/// tools write such files) opens as memory_viz opens it: the allocated timeline as the entries
/// give it, reserved memory marked unknown (0 throughout), and a warning saying where the two
/// first disagree and why.
#[test]
fn a_snapshot_whose_segments_cannot_hold_its_allocations_opens_with_reserved_unknown() {
    let trace = import(&data("dropped_frees.pickle.gz"), &ImportOptions::default()).unwrap();
    assert_eq!(trace.meta.reserved_unknown, vec![0]);
    let w = trace.meta.warnings.iter().find(|w| w.contains("cannot hold its allocations")).expect("a warning");
    assert!(w.contains("allocated inside") && w.contains("cuda:0") && w.contains("reserved memory is unknown"), "{w}");
    let s = summary(&trace);
    assert!(s.peak_allocated_bytes > 0);
    assert_eq!((s.peak_reserved_bytes, s.final_reserved_bytes), (0, 0));
    let mut cur = trace.events.cursor();
    let allocated: Vec<u64> = (0..trace.events.len()).map(|_| cur.advance().allocated_bytes).collect();
    // Allocated follows the entries: every allocation raises it by its size.
    for i in 1..trace.events.len() {
        if trace.events.event_type(i) == shared::model::EventType::Alloc {
            assert_eq!(allocated[i], allocated[i - 1] + trace.events.size_bytes[i], "event {i}");
        }
    }
}

/// A frame line of 2⁶⁴−1 (C++'s unknown line, a 9-byte LONG1) reads as Python reads it: the
/// file imports as the same snapshot with that line unknown.
#[test]
fn a_frame_line_of_two_to_the_64_minus_1_reads_as_python_reads_it() {
    let odd = import(&data("unknown_line.pickle.gz"), &ImportOptions::default()).unwrap();
    let plain = import(&data("mlp_adam_3steps.pickle"), &ImportOptions::default()).unwrap();
    assert_eq!(odd.events.len(), plain.events.len());
    assert_eq!(summary(&odd).peak_allocated_bytes, summary(&plain).peak_allocated_bytes);
    let frames = |t: &shared::Trace| -> BTreeSet<(String, String, u32)> {
        t.stacks.frames.iter().map(|f| (t.str(f.name).to_owned(), t.str(f.filename).to_owned(), f.line)).collect()
    };
    let new: Vec<_> = frames(&odd).difference(&frames(&plain)).cloned().collect();
    assert!(new.len() == 1 && new[0].2 == 0, "the unknown line reads as line 0 (unknown): {new:?}");
}

/// Every snapshot in `tests/data` and the samples: allocated ≤ reserved at every event on
/// every device, and the replay's last state is the snapshot's own `segments` (every
/// segment, every allocated block and every block pending its free, at its address).
#[test]
fn every_snapshot_keeps_allocated_within_reserved_and_ends_in_its_final_segments() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".pickle") || p.to_string_lossy().ends_with(".pickle.gz"))
        .collect();
    files.sort();
    assert!(files.len() >= 15, "{files:?}");
    let mut checked = 0;
    for path in &files {
        let raw = std::fs::read(path).unwrap();
        let bytes = if shared::import::is_gzip(&raw) {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(&raw[..]).read_to_end(&mut out).unwrap();
            out
        } else {
            raw
        };
        let trace = import(&bytes, &ImportOptions::default()).unwrap_or_else(|e| panic!("{path:?} does not import: {e}"));
        if !trace.meta.reserved_unknown.is_empty() {
            // Segments that cannot hold the allocations (a_snapshot_whose_segments_cannot_…).
            assert!(path.ends_with("dropped_frees.pickle.gz"), "{path:?}: reserved unknown: {:?}", trace.meta.warnings);
            continue;
        }
        let ev = &trace.events;
        let mut cursor = ev.cursor();
        for i in 0..ev.len() {
            let t = cursor.advance();
            assert!(t.allocated_bytes <= t.reserved_bytes, "{path:?}: event {i}: {t:?}");
        }
        if ev.is_empty() {
            continue;
        }
        for (d, want) in final_state(&bytes) {
            let last = (0..ev.len()).rev().find(|&i| ev.device[i] as usize == d).unwrap_or(ev.len() - 1);
            let segs = segments_at(&trace, last, d as u8);
            let got = State {
                segments: merged(segs.iter().map(|s| (s.address, s.size_bytes))),
                allocated: segs
                    .iter()
                    .flat_map(|s| &s.blocks)
                    .filter(|b| b.state == BlockState::Allocated)
                    .map(|b| (b.address, b.size_bytes))
                    .collect(),
                pending: segs
                    .iter()
                    .flat_map(|s| &s.blocks)
                    .filter(|b| b.state == BlockState::PendingFree)
                    .map(|b| (b.address, b.size_bytes))
                    .collect(),
            };
            // Expandable segments grow by mappings: compare the address ranges reserved.
            assert_eq!(got.segments, merged(want.segments.iter().copied()), "{path:?} cuda:{d}: segments");
            assert_eq!(got.allocated, want.allocated, "{path:?} cuda:{d}: allocated blocks");
            assert_eq!(got.pending, want.pending, "{path:?} cuda:{d}: blocks pending their free");
        }
        checked += 1;
    }
    assert!(checked >= 14, "{checked} snapshots checked");
}

/// Ranges (start, length) with touching ones joined.
fn merged(ranges: impl Iterator<Item = (u64, u64)>) -> BTreeSet<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = ranges.collect();
    v.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (a, n) in v {
        match out.last_mut() {
            Some(last) if last.0 + last.1 == a => last.1 += n,
            _ => out.push((a, n)),
        }
    }
    out.into_iter().collect()
}

#[derive(Debug, Default)]
struct State {
    segments: BTreeSet<(u64, u64)>,
    allocated: BTreeSet<(u64, u64)>,
    pending: BTreeSet<(u64, u64)>,
}

/// The snapshot's `segments`, by device, read with the importer's pickle reader.
fn final_state(bytes: &[u8]) -> Vec<(usize, State)> {
    let p = pickle::parse(bytes).unwrap();
    let int = |d: pickle::ValueId, k: &str| p.dict_get(d, k).and_then(|v| p.get(v).as_u64()).unwrap();
    let Value::List(segments) = p.get(p.dict_get(p.root, "segments").unwrap()) else { panic!("segments is not a list") };
    let mut by_device: std::collections::BTreeMap<usize, State> = Default::default();
    for &s in segments {
        let st = by_device.entry(int(s, "device") as usize).or_default();
        st.segments.insert((int(s, "address"), int(s, "total_size")));
        let Value::List(blocks) = p.get(p.dict_get(s, "blocks").unwrap()) else { panic!("blocks is not a list") };
        for &b in blocks {
            let Value::Str(state) = p.get(p.dict_get(b, "state").unwrap()) else { panic!("state is not a string") };
            let block = (int(b, "address"), int(b, "size"));
            match state.as_str() {
                "active_allocated" => st.allocated.insert(block),
                "active_pending_free" => st.pending.insert(block),
                _ => false,
            };
        }
    }
    by_device.into_iter().collect()
}

/// The two ranks of each job merged (they differ in length: rank 1 has twice the tokens):
/// each rank's device keeps the peak PyTorch counted on it.
#[test]
fn merged_ranks_keep_each_ranks_peak() {
    for mode in ["ddp", "fsdp2"] {
        let inputs = (0..2u32)
            .map(|rank| {
                let name = format!("{mode}_rank{rank}.pickle.gz");
                let trace = import(&data(&name), &ImportOptions::default()).unwrap();
                shared::ranks::merge::MergeInput { trace, rank, label: name }
            })
            .collect();
        let merged = shared::ranks::merge::merge(inputs).unwrap();
        let peaks = shared::analysis::device_peaks(&merged);
        for rank in 0..2u32 {
            let name = format!("{mode}_rank{rank}.pickle.gz");
            let d = merged.devices.iter().position(|d| d.rank == Some(rank)).unwrap();
            assert_eq!(peaks[d].peak_allocated_bytes, fact("rank_facts.json", &name, "max_allocated"), "{name} merged");
        }
    }
}

/// Recording turned on mid-iteration (the FSDP2 rank 1 snapshot without its first 40 % of
/// entries): blocks from before it are freed during it, and the replay still ends in
/// PyTorch's state (the property test checks every event and the final segments).
#[test]
fn a_recording_started_mid_iteration_ends_in_pytorchs_state() {
    let trace = import(&data("fsdp2_rank1_late.pickle.gz"), &ImportOptions::default()).unwrap();
    let s = summary(&trace);
    let f = |k| fact("rank_facts.json", "fsdp2_rank1.pickle.gz", k);
    assert_eq!(s.final_allocated_bytes, f("end_allocated"));
    assert_eq!(s.final_reserved_bytes, f("end_reserved"));
    assert!(s.peak_allocated_bytes <= f("max_allocated"), "{} above PyTorch's {}", s.peak_allocated_bytes, f("max_allocated"));
    assert!(trace.meta.warnings.iter().any(|w| w.contains("allocated before recording began")), "{:?}", trace.meta.warnings);
}

/// Frees that wait for other streams (`record_stream`): PyTorch stops counting a block at its
/// free request, but its space stays taken until the free completes. A block still pending at
/// the snapshot (6 MiB peak, 4 MiB at the end) and one whose request came before recording
/// (4 MiB at the start, not 6).
#[test]
fn blocks_pending_their_free_take_space_but_are_not_allocated() {
    const MIB: u64 = 1 << 20;
    for (name, peak, end) in [("pending_free.pickle.gz", 6 * MIB, 4 * MIB), ("pending_before.pickle.gz", 4 * MIB, 0)] {
        let trace = import(&data(name), &ImportOptions::default()).unwrap();
        let s = summary(&trace);
        assert_eq!((s.peak_allocated_bytes, s.final_allocated_bytes), (peak, end), "{name}");
        assert_eq!(s.peak_reserved_bytes, 20 * MIB, "{name}");
    }
    // The pending block is in the segment view, as taken but not allocated.
    let trace = import(&data("pending_free.pickle.gz"), &ImportOptions::default()).unwrap();
    let segs = segments_at(&trace, trace.events.len() - 1, 0);
    let pending: Vec<_> = segs.iter().flat_map(|s| &s.blocks).filter(|b| b.state == BlockState::PendingFree).collect();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].size_bytes, 2 * MIB);
    // A real one (H200, tests/gpu/pending_free.py): PyTorch's max_memory_allocated,
    // memory_allocated and memory_reserved at the end were 128 MiB each; the 64 MiB block waits
    // for the side stream after its free request (still at the `snapshot` entry PyTorch's own
    // snapshot made then) and is the allocator's again once the free completes.
    let trace = import(&data("pending_free_real.pickle.gz"), &ImportOptions::default()).unwrap();
    let s = summary(&trace);
    assert_eq!((s.peak_allocated_bytes, s.final_allocated_bytes, s.peak_reserved_bytes), (128 * MIB, 128 * MIB, 128 * MIB));
    let states =
        |event: usize| -> Vec<BlockState> { segments_at(&trace, event, 0).iter().flat_map(|s| &s.blocks).map(|b| b.state).collect() };
    assert!(states(3).contains(&BlockState::PendingFree), "{:?}", states(3));
    assert!(!states(5).contains(&BlockState::PendingFree), "{:?}", states(5));
}
