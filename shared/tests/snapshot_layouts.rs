//! Snapshots in the layouts torch 2.12–2.15 write (tests/data/snapshot_layouts.gen.py, whose
//! own allocator simulation wrote the expected numbers): every device's, pool's and pinned
//! host memory's peak and final totals, annotations, metadata, and the notes the hostile
//! variants must give.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::Value;
use shared::analysis::pools::{device_totals, pool_totals, MemoryTotals};
use shared::model::{NoteKind, Trace};
use std::path::PathBuf;

fn data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data")
}

fn expected() -> Value {
    serde_json::from_slice(&std::fs::read(data().join("snapshot_layouts.expected.json")).unwrap()).unwrap()
}

fn import(name: &str) -> Trace {
    let bytes = std::fs::read(data().join(name)).unwrap();
    shared::import::snapshot::import(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn totals_of(v: &Value) -> MemoryTotals {
    let n = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"));
    MemoryTotals {
        peak_allocated_bytes: n("peak_allocated"),
        peak_reserved_bytes: n("peak_reserved"),
        final_allocated_bytes: n("final_allocated"),
        final_reserved_bytes: n("final_reserved"),
    }
}

fn device(t: &Trace, name: &str) -> usize {
    t.devices.iter().position(|d| d.to_string() == name).unwrap_or_else(|| panic!("no device {name} in {:?}", t.devices))
}

/// Every file's numbers as the generator's simulation gave them.
fn check(name: &str, want: &Value) {
    let t = import(name);
    for (d, dv) in want["devices"].as_object().unwrap() {
        let dev = device(&t, &format!("cuda:{d}"));
        assert_eq!(device_totals(&t, dev), totals_of(dv), "{name} cuda:{d}");
        let pools = pool_totals(&t);
        for (pool, pv) in dv["pools"].as_object().unwrap() {
            let id = format!("({})", pool.replace(',', ", "));
            // The Pools view's panels of this pool (one per stream) reach its peaks.
            let curves: Vec<_> = shared::analysis::pools::pool_curves(&t, 500)
                .into_iter()
                .filter(|c| c.pool == id && c.device == format!("cuda:{d}"))
                .collect();
            let want_pool = totals_of(pv);
            assert!(!curves.is_empty(), "{name} cuda:{d} pool {id}: no panel");
            if curves.len() == 1 {
                assert_eq!(curves[0].peak_allocated_bytes, want_pool.peak_allocated_bytes, "{name} cuda:{d} pool {id} panel");
                assert_eq!(curves[0].peak_reserved_bytes, want_pool.peak_reserved_bytes, "{name} cuda:{d} pool {id} panel");
                let top = curves[0].points.iter().map(|p| p.allocated_max_bytes).max().unwrap();
                assert_eq!(top, want_pool.peak_allocated_bytes, "{name} cuda:{d} pool {id} panel points");
            }
            match pools.iter().find(|p| p.pool == id && p.device == format!("cuda:{d}")) {
                Some(p) => assert_eq!(p.totals, totals_of(pv), "{name} cuda:{d} pool {id}"),
                // A device without private pools: its default pool is the device.
                None => {
                    assert!(!pools.iter().any(|p| p.device == format!("cuda:{d}")), "{name} cuda:{d}: pool {id} missing");
                    assert_eq!(device_totals(&t, dev), totals_of(pv), "{name} cuda:{d} default pool");
                }
            }
        }
    }
    let summary = shared::analysis::summary(&t);
    match want.get("host").filter(|h| !h.is_null()) {
        Some(h) => {
            let host = device(&t, "pinned host");
            assert_eq!(device_totals(&t, host), totals_of(h), "{name} pinned host");
            assert_eq!(summary.pinned_host, Some(totals_of(h)), "{name}");
            // Never added to a GPU's: the summary's peak is the highest GPU's.
            let gpu_peak = want["devices"].as_object().unwrap().values().map(|d| d["peak_allocated"].as_u64().unwrap()).max().unwrap();
            assert_eq!(summary.peak_allocated_bytes, gpu_peak, "{name}");
        }
        None => assert!(!t.devices.iter().any(|d| d.is_pinned_host()), "{name}"),
    }
    let first_us = t.events.ts_ns.first().copied().unwrap_or(0);
    let annotations: Vec<_> = t.event_notes.iter().filter(|n| n.kind == NoteKind::Annotation).collect();
    let want_ann = want["annotations"].as_array().unwrap();
    assert_eq!(annotations.len(), want_ann.len(), "{name}: annotations");
    for a in want_ann {
        let text = a["text"].as_str().unwrap();
        let note = annotations.iter().find(|n| t.str(n.text) == text).unwrap_or_else(|| panic!("{name}: annotation {text}"));
        let ev = note.event as usize;
        assert_eq!(t.events.address[ev], a["address"].as_u64().unwrap(), "{name}: {text}");
        assert_eq!(t.events.size_bytes[ev], a["alloc_block_size"].as_u64().unwrap(), "{name}: {text}");
        assert_eq!(t.events.ts_ns[ev], a["alloc_time_us"].as_u64().unwrap() * 1000, "{name}: {text}");
        assert_eq!(note.ts_ns, a["time_us"].as_u64().unwrap() * 1000, "{name}: {text}");
        assert!(note.stack.is_some(), "{name}: {text} keeps its frames");
        assert!(note.ts_ns >= first_us);
    }
    let mut user = std::collections::BTreeMap::<String, u64>::new();
    for n in t.event_notes.iter().filter(|n| n.kind == NoteKind::UserMetadata) {
        *user.entry(t.str(n.text).to_owned()).or_default() += 1;
    }
    let want_user: std::collections::BTreeMap<String, u64> =
        want["user_metadata_counts"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.as_u64().unwrap())).collect();
    assert_eq!(user, want_user, "{name}: user metadata");
    let internal = t.event_notes.iter().filter(|n| n.kind == NoteKind::Internal).count() as u64;
    assert_eq!(internal, want["internal_metadata_entries"].as_u64().unwrap(), "{name}: internal metadata");
    // Each defect is named in the warnings; a clean file has none about pools or notes.
    let warnings = t.meta.warnings.join("\n");
    for d in want["defects"].as_array().unwrap() {
        let needle = match d["kind"].as_str().unwrap() {
            "pool_id_not_a_pair" => "not a pair of integers",
            "annotate_not_live" => "annotations name an address no allocation",
            "host_traces_without_host_segments" => "no `host_segments`",
            "free_pool_differs_from_alloc" => "frees name a pool other than their allocation's",
            other => panic!("unknown defect kind {other}"),
        };
        assert!(warnings.contains(needle), "{name}: expected a warning containing {needle:?}, got:\n{warnings}");
    }
    if want["defects"].as_array().unwrap().is_empty() {
        for needle in ["pool", "annotation", "unknown action", "contradict", "host"] {
            assert!(!warnings.contains(needle), "{name}: unexpected warning about {needle}:\n{warnings}");
        }
    }
}

#[test]
fn layouts_of_torch_2_12_to_2_15_read_in_full() {
    let want = expected();
    let mut n = 0;
    for (name, w) in want.as_object().unwrap() {
        if name.ends_with(".pickle") {
            check(name, w);
            n += 1;
        }
    }
    assert!(n >= 9, "{n} files");
}

/// Protocol 5 (Python 3.14's default) and 4 give the same trace.
#[test]
fn protocol_5_and_4_give_the_same_trace() {
    let a = serde_json::to_value(import("layout_2_15.pickle")).unwrap();
    let b = serde_json::to_value(import("layout_2_15.protocol4.pickle")).unwrap();
    assert_eq!(a, b);
}

/// Pools, notes and pinned host memory survive the own format.
#[test]
fn pools_notes_and_pinned_host_round_trip_through_the_own_format() {
    let t = import("layout_2_15.pickle");
    assert!(!t.pools.is_empty() && !t.event_pools.is_empty() && !t.event_notes.is_empty());
    let mut out = Vec::new();
    shared::export::native::write(&t, &mut out).unwrap();
    let back = shared::import::native::import(&out).unwrap();
    assert_eq!(back.pools, t.pools);
    assert_eq!(back.event_pools, t.event_pools);
    assert_eq!(back.event_notes, t.event_notes);
    assert_eq!(back.devices, t.devices);
    assert_eq!(shared::analysis::summary(&back), shared::analysis::summary(&t));
}

/// A 100 MB metadata text is cut, and the file imports in bounded memory.
#[test]
fn huge_user_metadata_is_cut() {
    let dir = std::env::temp_dir().join(format!("mt-huge-meta-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("huge.pickle");
    let script = data().join("snapshot_layouts.gen.py");
    let python = std::env::var("MEMORY_TRACER_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = std::process::Command::new(python).arg(&script).arg("--huge").arg(&path).arg("100").status().map(|s| s.success());
    if ok.ok() != Some(true) {
        panic!("could not run {} --huge", script.display());
    }
    let t = shared::import::snapshot::import(&std::fs::read(&path).unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    let longest = t.event_notes.iter().map(|n| t.str(n.text).len()).max().unwrap();
    assert!(longest < 70 << 10, "{longest}");
    assert!(t.meta.warnings.iter().any(|w| w.contains("longer than 64 KiB were cut")), "{:?}", t.meta.warnings);
}

/// Real snapshots of private pools (tests/gpu/graph_snapshots.py on one H200, torch 2.11: a
/// training step captured in a CUDA graph, `torch.compile(mode="reduce-overhead")`, and a
/// `torch.cuda.MemPool`): the device's peaks and finals equal PyTorch's counters to the byte,
/// and every pool's final totals equal the allocator's own segments by pool. Torch 2.11 names
/// pools on segments only, so the pools come from the segments.
#[test]
fn real_private_pools_match_the_allocator() {
    let facts: Value = serde_json::from_slice(&std::fs::read(data().join("pool_facts.json")).unwrap()).unwrap();
    let mut n = 0;
    for (name, f) in facts.as_object().unwrap().iter().filter(|(k, _)| k.ends_with(".gz")) {
        let gz = std::fs::read(data().join(name)).unwrap();
        let t = shared::import::snapshot::import_reader(flate2::read::GzDecoder::new(&gz[..])).unwrap_or_else(|e| panic!("{name}: {e}"));
        let n_ = |k: &str| f[k].as_u64().unwrap();
        let s = shared::analysis::summary(&t);
        assert_eq!(s.peak_allocated_bytes, n_("max_memory_allocated"), "{name}");
        assert_eq!(s.peak_reserved_bytes, n_("max_memory_reserved"), "{name}");
        assert_eq!(s.final_allocated_bytes, n_("memory_allocated"), "{name}");
        assert_eq!(s.final_reserved_bytes, n_("memory_reserved"), "{name}");
        let pools = pool_totals(&t);
        let at_end = f["pools_at_end"].as_object().unwrap();
        assert_eq!(pools.len(), at_end.len(), "{name}: {pools:?}");
        for (id, want) in at_end {
            let id = format!("({})", id.replace(',', ", "));
            let p = pools.iter().find(|p| p.pool == id).unwrap_or_else(|| panic!("{name}: no pool {id} in {pools:?}"));
            assert_eq!(p.totals.final_allocated_bytes, want["allocated"].as_u64().unwrap(), "{name} {id}");
            assert_eq!(p.totals.final_reserved_bytes, want["reserved"].as_u64().unwrap(), "{name} {id}");
            // The segment map at the end: the allocator's segments of this pool.
            let at_end = shared::analysis::segments_at(&t, t.events.len() - 1, 0);
            let k = p.index;
            let mine: Vec<_> = at_end.iter().filter(|g| g.private_pool == k).collect();
            assert_eq!(mine.len() as u64, want["segments"].as_u64().unwrap(), "{name} {id}: segments at the end");
            assert_eq!(mine.iter().map(|g| g.size_bytes).sum::<u64>(), want["reserved"].as_u64().unwrap(), "{name} {id}");
        }
        n += 1;
    }
    assert_eq!(n, 3);
}

/// `find` answers by address (anywhere inside the block), annotation text, stack frame and
/// module path, counting every match.
#[test]
fn search_finds_by_address_note_frame_and_layer() {
    use shared::analysis::search::{find, MatchedBy};
    let t = import("layout_2_15.pickle");
    let ann = t.event_notes.iter().find(|n| t.str(n.text) == "graph input").unwrap();
    let (ev, addr, size) = (ann.event as usize, t.events.address[ann.event as usize], t.events.size_bytes[ann.event as usize]);
    let by_note = find(&t, "GRAPH INPUT", 10);
    assert_eq!((by_note.total, by_note.matches[0].event_index, by_note.matches[0].by), (1, ev, MatchedBy::Note));
    // Any address inside the block finds it (and every other allocation that held it).
    let inside = find(&t, &format!("0x{:x}", addr + size - 1), 10);
    assert!(inside.matches.iter().any(|m| m.event_index == ev && m.by == MatchedBy::Address), "{inside:?}");
    let outside = find(&t, &format!("0x{:x}", addr + size), 10);
    assert!(!outside.matches.iter().any(|m| m.event_index == ev), "{outside:?}");
    // A frame's file:line: every allocation whose stack has it, and only those.
    let frame = t.stacks.stack(t.stacks.stack_of_event(ev).unwrap()).next().unwrap();
    let q = format!("{}:{}", t.str(frame.filename), frame.line);
    let by_frame = find(&t, &q, 1000);
    let want = (0..t.events.len())
        .filter(|&i| t.events.event_type(i) == shared::model::EventType::Alloc)
        .filter(|&i| {
            let layer = t.opt_str(t.events.layer[i]).unwrap_or("").to_lowercase();
            let in_stack = t.stacks.stack_of_event(i).is_some_and(|s| {
                t.stacks
                    .stack(s)
                    .any(|f| format!("{} {}:{}", t.str(f.name), t.str(f.filename), f.line).to_lowercase().contains(&q.to_lowercase()))
            });
            layer.contains(&q.to_lowercase()) || in_stack
        })
        .count();
    assert_eq!(by_frame.total, want, "{q}");
    assert!(by_frame.total >= 1 && by_frame.events.len() == by_frame.total);
    assert_eq!(find(&t, "   ", 10).total, 0);
}

/// The Chrome export carries each private pool's counter track and every annotation.
#[test]
fn chrome_export_has_pool_tracks_and_annotations() {
    let t = import("layout_2_15.pickle");
    let mut out = Vec::new();
    shared::export::chrome::write(&t, &mut out).unwrap();
    let v: Value = serde_json::from_slice(&out).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    let want_pool = pool_totals(&t).into_iter().find(|p| p.index.is_some()).unwrap();
    let track = format!("memory {} pool {}", want_pool.device, want_pool.pool);
    let peak = events.iter().filter(|e| e["name"] == track.as_str()).map(|e| e["args"]["allocated_bytes"].as_u64().unwrap()).max();
    // Without the pool's memory from before recording (none in this file), its peak.
    assert_eq!(peak, Some(want_pool.totals.peak_allocated_bytes), "{track}");
    let annotations: Vec<&str> = events.iter().filter(|e| e["cat"] == "annotation").map(|e| e["name"].as_str().unwrap()).collect();
    let want = t.event_notes.iter().filter(|n| n.kind == NoteKind::Annotation).count();
    assert_eq!(annotations.len(), want);
    assert!(annotations.contains(&"graph input"), "{annotations:?}");
}

/// `collector trace` of the same programs (tests/gpu/pool_trace.sh, same H200): the native
/// capture knows private pools from their segments at the end, and each pool's allocated
/// bytes at the end equal the allocator's own, as does the peak PyTorch's counter.
#[test]
fn traced_runs_know_their_private_pools() {
    let facts: Value = serde_json::from_slice(&std::fs::read(data().join("pool_facts.json")).unwrap()).unwrap();
    for (traced, snapshot) in
        [("pool_graph.mtrace.json.gz", "pool_graph.pickle.gz"), ("pool_mempool.mtrace.json.gz", "pool_mempool.pickle.gz")]
    {
        let t = shared::import(&std::fs::read(data().join(traced)).unwrap(), &shared::ImportOptions::default()).unwrap();
        let f = &facts[snapshot];
        assert_eq!(shared::analysis::summary(&t).peak_allocated_bytes, f["max_memory_allocated"].as_u64().unwrap(), "{traced}");
        let pools = pool_totals(&t);
        let at_end = f["pools_at_end"].as_object().unwrap();
        assert_eq!(pools.len(), at_end.len(), "{traced}: {pools:?}");
        for (id, want) in at_end {
            let id = format!("({})", id.replace(',', ", "));
            let p = pools.iter().find(|p| p.pool == id).unwrap_or_else(|| panic!("{traced}: no pool {id}"));
            assert_eq!(p.totals.final_allocated_bytes, want["allocated"].as_u64().unwrap(), "{traced} {id}");
        }
        // The layer table says which of each layer's bytes went to a private pool.
        let layers = shared::analysis::layer_stats(&t);
        let pooled: u64 = layers.values().map(|l| l.private_pool_bytes).sum();
        let ev = &t.events;
        let want: u64 = (0..ev.len())
            .filter(|&i| ev.event_type(i) == shared::model::EventType::Alloc && !ev.layer[i].is_none() && t.event_pool(i).is_some())
            .map(|i| ev.size_bytes[i])
            .sum();
        assert!(want > 0, "{traced}: no allocation of a layer in a private pool");
        assert_eq!(pooled, want, "{traced}");
        assert!(layers.values().all(|l| l.private_pool_bytes <= l.allocated_bytes_total), "{traced}");
    }
}

/// Merged ranks keep every event's and every segment's pool by its id, though the ranks list
/// their pools in different orders.
#[test]
fn merged_ranks_keep_their_pools() {
    use shared::model::PoolId;
    use shared::ranks::merge::{merge, MergeInput};
    let a = import("layout_2_15.pickle");
    // Rank 1: the same run, with one more pool listed first, and a segment alive from the start
    // in its private pool.
    let mut b = a.clone();
    b.pools.insert(0, PoolId(7, 7));
    b.event_pools.iter_mut().for_each(|(_, p)| *p += 1);
    let private = b.pools.iter().position(|&p| p == PoolId(0, 1)).unwrap() as u16;
    let seg = b.initial_segments.iter_mut().find(|s| s.device == 0).unwrap();
    seg.private_pool = Some(private);
    let seg_address = seg.address;
    let pool_of = |t: &Trace, i: usize| t.event_pool(i).map(|p| t.pools[p as usize]);
    let want: Vec<(u64, Option<PoolId>)> = [&a, &b]
        .iter()
        .flat_map(|t| (0..t.events.len()).map(move |i| (t.events.ts_ns[i], pool_of(t, i))))
        .filter(|(_, p)| p.is_some())
        .collect();
    let merged =
        merge(vec![MergeInput { trace: a, rank: 0, label: "a".into() }, MergeInput { trace: b, rank: 1, label: "b".into() }]).unwrap();
    let mut got: Vec<(u64, Option<PoolId>)> =
        (0..merged.events.len()).map(|i| (merged.events.ts_ns[i], pool_of(&merged, i))).filter(|(_, p)| p.is_some()).collect();
    let mut want = want;
    got.sort();
    want.sort();
    assert_eq!(got.len(), want.len());
    assert_eq!(got.iter().map(|g| g.1).collect::<Vec<_>>(), want.iter().map(|w| w.1).collect::<Vec<_>>());
    let seg = merged.initial_segments.iter().find(|s| s.address == seg_address && s.private_pool.is_some()).unwrap();
    assert_eq!(merged.pools[seg.private_pool.unwrap() as usize], PoolId(0, 1));
}
