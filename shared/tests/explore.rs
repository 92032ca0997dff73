//! What the viewer's worker answers (`shared::explore`) and the flame graph, on the real samples:
//! the flame graph's weights add up to the peak, a zoomed timeline agrees with the full one,
//! hovering and clicking give the allocator's own numbers; files of several ranks merge, each
//! rank shows with its own peak (PyTorch's, from facts.json), and two traces compare.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use shared::analysis::flame::{flame_graph, FlameKind};
use shared::analysis::{live_allocations_at, summary, timeline, TimelineOptions};
use shared::explore::{Opened, Overview, RanksError, Request, Response, Session};
use shared::ranks::merge::MergeOptions;
use shared::{import, ImportOptions};
use std::path::PathBuf;

fn data(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data").join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

fn open(name: &str) -> (Session, Overview) {
    match Session::open(name, &data(name), |_| {}).unwrap() {
        Opened::Trace(s, o) => (*s, *o),
        Opened::Sweep(_) => panic!("{name} opened as a sweep"),
    }
}

fn fact(sample: &str, key: &str) -> u64 {
    let facts: serde_json::Value = serde_json::from_slice(&data("facts.json")).unwrap();
    facts["samples"][sample][key].as_u64().unwrap()
}

const RESNET: &str = "resnet18_sgd_2steps.pickle";
const MLP: &str = "mlp_adam_3steps.pickle";

/// The two samples as the files of rank 0 (resnet18) and rank 1 (mlp), given in reverse order:
/// ranks come from the file names.
fn rank_files() -> Vec<(String, Vec<u8>)> {
    vec![("rank1.pickle".into(), data(MLP)), ("rank0.pickle".into(), data(RESNET))]
}

fn open_ranks(files: &[(String, Vec<u8>)], options: &MergeOptions) -> Result<(Session, Overview), RanksError> {
    match Session::open_ranks(files, options, |_| {})? {
        Opened::Trace(s, o) => Ok((*s, *o)),
        Opened::Sweep(_) => panic!("ranks opened as a sweep"),
    }
}

fn max_allocated(points: &[shared::analysis::TimelinePoint]) -> u64 {
    points.iter().map(|p| p.allocated_max_bytes).max().unwrap_or(0)
}

#[test]
fn flame_graph_weights_add_up_to_the_peak_and_to_all_allocations() {
    for name in ["resnet18_sgd_2steps.pickle", "mlp_adam_3steps.pickle", "convnet_profiler_trace.json"] {
        let trace = import(&data(name), &ImportOptions::default()).unwrap();
        let s = summary(&trace);
        let flame = flame_graph(&trace, 0.0);
        let root = &flame.nodes[0];
        assert_eq!(root.kind, FlameKind::Root);
        assert_eq!(root.live_at_peak_bytes, s.peak_allocated_bytes, "{name}: live at peak");
        let allocated: u64 = (0..trace.events.len())
            .filter(|&i| trace.events.event_type(i) == shared::EventType::Alloc)
            .map(|i| trace.events.size_bytes[i])
            .sum();
        assert_eq!(root.total_allocated_bytes, allocated, "{name}: total allocated");
        // Every node's children add up to at most the node (the rest is the node's own bytes);
        // leaves exist and pre-order puts parents first.
        for (i, n) in flame.nodes.iter().enumerate() {
            let kids: Vec<_> = flame.children(i as u32).collect();
            let live: u64 = kids.iter().map(|&k| flame.nodes[k as usize].live_at_peak_bytes).sum();
            let total: u64 = kids.iter().map(|&k| flame.nodes[k as usize].total_allocated_bytes).sum();
            assert!(live <= n.live_at_peak_bytes && total <= n.total_allocated_bytes, "{name}: node {i} {}", n.name);
            if let Some(p) = n.parent {
                assert!((p as usize) < i);
            }
        }
        // Children of the root add up exactly: every byte is attributed somewhere.
        let kids: Vec<_> = flame.children(0).collect();
        assert_eq!(kids.iter().map(|&k| flame.nodes[k as usize].live_at_peak_bytes).sum::<u64>(), root.live_at_peak_bytes);
        assert_eq!(kids.iter().map(|&k| flame.nodes[k as usize].total_allocated_bytes).sum::<u64>(), root.total_allocated_bytes);
    }
}

#[test]
fn snapshot_flame_graph_has_python_frames() {
    let trace = import(&data("resnet18_sgd_2steps.pickle"), &ImportOptions::default()).unwrap();
    let flame = flame_graph(&trace, 1e-4);
    assert!(flame.nodes.iter().any(|n| n.kind == FlameKind::Frame && n.name.contains(".py:")), "no frames with file and line");
}

/// Issue 71: the runtime's frames (the unwinder, the caching allocator, CPython's loop, `??`)
/// are folded by default in the flame graph and in an allocation's shown frames, kept when
/// asked for; weights are unchanged by the fold.
#[test]
fn the_runtime_frames_are_folded_by_default_and_shown_when_asked() {
    let (mut session, overview) = open("resnet18_sgd_2steps.pickle");
    let ask = |session: &mut Session, all_frames: bool| match session.answer(&Request::Flame { all_frames }) {
        Response::Flame { graph } => *graph,
        other => panic!("not a flame graph: {other:?}"),
    };
    let folded = ask(&mut session, false);
    let all = ask(&mut session, true);
    let frames = |g: &shared::analysis::flame::FlameGraph| {
        g.nodes.iter().filter(|n| n.kind == FlameKind::Frame).map(|n| n.name.clone()).collect::<Vec<_>>()
    };
    let runtime = |frame: &str| {
        ["torch::unwind", "_PyEval_EvalFrameDefault", "c10::cuda::CUDACachingAllocator", "?? ", "__clone"]
            .iter()
            .any(|p| frame.starts_with(p))
    };
    assert!(frames(&all).iter().any(|n| runtime(n)), "the sample's stacks hold the unwinder and CPython's frames");
    assert!(
        !frames(&folded).iter().any(|n| runtime(n)),
        "a runtime frame left in the folded graph: {:?}",
        frames(&folded).iter().find(|n| runtime(n))
    );
    assert!(frames(&folded).iter().any(|n| n.contains(".py:")), "the program's Python frames stay");
    // A stack with nothing of the program's (the autograd engine's thread) keeps its operator
    // and autograd-node frames, as the pinned stack does: it is not left unattributed.
    assert!(frames(&folded).iter().any(|n| n.starts_with("torch::autograd::generated::")), "backward's stacks lost their nodes");
    let unattributed = |g: &shared::analysis::flame::FlameGraph| {
        g.nodes.iter().filter(|n| n.kind == FlameKind::Unattributed).map(|n| n.total_allocated_bytes).sum::<u64>()
    };
    assert_eq!(unattributed(&folded), unattributed(&all));
    assert_eq!(
        (folded.nodes[0].live_at_peak_bytes, folded.nodes[0].total_allocated_bytes),
        (all.nodes[0].live_at_peak_bytes, all.nodes[0].total_allocated_bytes)
    );
    // The cached answer follows the switch.
    assert_eq!(ask(&mut session, false), folded);
    // A snapshot's layers say which block's `forward` made the memory (torchvision's), not only
    // the line of the script that called the model.
    let trace = session.trace();
    let layers: std::collections::BTreeSet<&str> = (0..trace.events.len()).filter_map(|i| trace.opt_str(trace.events.layer[i])).collect();
    assert!(layers.iter().any(|l| l.starts_with("resnet.py:") && l.ends_with(" in forward")), "no torchvision forward among {layers:?}");

    let s = &overview.summary;
    let Response::Allocations { allocations, .. } = session.answer(&Request::Allocations { t_s: s.peak_time_s, limit: 20 }) else {
        panic!()
    };
    for a in &allocations {
        let shown: Vec<&String> = a.shown.iter().map(|&i| &a.stack[i as usize]).collect();
        assert!(!shown.is_empty() && shown.len() < a.stack.len(), "nothing shown, or nothing folded, of {:?}", a.stack);
        assert!(!shown.iter().any(|f| runtime(f)), "a runtime frame shown: {shown:?}");
        let python = a.stack.iter().any(|f| f.contains(".py:") && !f.contains("nn/modules/module.py"));
        assert!(!python || shown[0].contains(".py:"), "the first frame shown of a stack with Python frames is C++: {shown:?}");
    }
}

#[test]
fn zoomed_timeline_agrees_with_the_full_timeline() {
    let (mut session, overview) = open("resnet18_sgd_2steps.pickle");
    let trace = session.trace();
    let full = timeline(trace, &TimelineOptions::default().with_buckets(100_000));
    // A window in the middle: its max equals the max of the full-resolution points inside it.
    let (a, b) = (overview.duration_s * 0.4, overview.duration_s * 0.6);
    let Response::Timeline { points, .. } = session.answer(&Request::Timeline { start_s: a, end_s: b, buckets: 50 }) else {
        panic!("not a timeline")
    };
    assert!(!points.is_empty() && points.len() <= 50);
    let want = full.iter().filter(|p| p.t_s >= a && p.t_s < b).map(|p| p.allocated_max_bytes).max().unwrap();
    let got = points.iter().map(|p| p.allocated_max_bytes).max().unwrap();
    // The zoomed buckets may also include the level just before the window's first event.
    assert!(got >= want, "zoomed max {got} < full max {want}");
    let before = full.iter().rfind(|p| p.t_s < a).map(|p| p.allocated_last_bytes).unwrap_or(0);
    assert!(got == want || got == before, "zoomed max {got} is neither the window's {want} nor the level before it {before}");
}

#[test]
fn hover_and_click_report_the_allocator_state() {
    let (mut session, overview) = open("resnet18_sgd_2steps.pickle");
    let s = &overview.summary;
    let Response::At(m) = session.answer(&Request::At { t_s: s.peak_time_s }) else { panic!() };
    assert_eq!(m.allocated_bytes, s.peak_allocated_bytes);
    assert_eq!(m.event_index, s.peak_event_index);
    let Response::Allocations { allocations, .. } = session.answer(&Request::Allocations { t_s: s.peak_time_s, limit: 5 }) else {
        panic!()
    };
    assert_eq!(allocations.len(), 5);
    let live = live_allocations_at(session.trace(), s.peak_event_index.unwrap());
    let mut sizes: Vec<u64> = live.iter().map(|&i| session.trace().events.size_bytes[i]).collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    assert_eq!(allocations.iter().map(|a| a.size_bytes).collect::<Vec<_>>(), sizes[..5]);
    for a in &allocations {
        assert!(a.alloc_s <= s.peak_time_s && a.free_s.is_none_or(|f| f >= s.peak_time_s));
        assert!(!a.stack.is_empty(), "snapshot allocations carry their stacks");
    }
    let Response::Segments { segments, .. } = session.answer(&Request::Segments { t_s: s.peak_time_s }) else { panic!() };
    let allocated: u64 =
        segments.iter().flat_map(|seg| &seg.blocks).filter(|b| b.state == shared::model::BlockState::Allocated).map(|b| b.size_bytes).sum();
    assert_eq!(allocated, s.peak_allocated_bytes, "blocks at the peak add up to the peak");
}

#[test]
fn exports_and_bad_requests() {
    let (mut session, _) = open("mlp_adam_3steps.pickle");
    let Response::Export { text, file_name, .. } = session.answer(&Request::Export { format: "speedscope".into() }) else { panic!() };
    assert_eq!(file_name, "mlp_adam_3steps.speedscope.json");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(v["$schema"].as_str().unwrap().contains("speedscope"));
    let Response::Export { text, .. } = session.answer(&Request::Export { format: "layers_csv".into() }) else { panic!() };
    assert!(text.starts_with("layer_name,"));
    let Response::Error { message } = session.answer(&Request::Export { format: "pdf".into() }) else { panic!() };
    assert!(message.contains("\"pdf\"") && message.contains("speedscope"));
    assert!(Session::open("junk.bin", b"hello", |_| {}).is_err());
}

#[test]
fn profiler_trace_has_phase_bands_and_a_profile() {
    let (_, overview) = open("convnet_profiler_trace.json");
    assert!(overview.profile.is_some(), "{:?}", overview.profile_error);
    assert!(overview.phase_bands.iter().any(|b| b.phase == shared::Phase::Backward));
    let (_, snap) = open("mlp_adam_3steps.pickle");
    assert!(snap.profile.is_none() && snap.profile_error.unwrap().contains("no operator events"));
    assert!(snap.has_segments);
}

#[test]
fn rank_files_merge_and_every_rank_keeps_its_peak() {
    let (session, overview) = open_ranks(&rank_files(), &MergeOptions::default()).unwrap();
    assert_eq!(overview.file_name, "rank1.pickle + rank0.pickle");
    assert_eq!(overview.summary.peak_allocated_bytes, fact(RESNET, "max_allocated"));
    let ranks = overview.ranks.as_ref().expect("a merged trace of two ranks has a rank set");
    assert_eq!(ranks.selected, None);
    assert_eq!(
        ranks.devices.iter().map(|d| (d.rank, d.device.as_str())).collect::<Vec<_>>(),
        [(0, "cuda:0 (rank 0)"), (1, "cuda:0 (rank 1)")]
    );
    for (d, sample) in ranks.devices.iter().zip([RESNET, MLP]) {
        assert_eq!(d.peak_allocated_bytes, fact(sample, "max_allocated"), "{sample}");
        assert_eq!(d.peak_reserved_bytes, fact(sample, "max_reserved"), "{sample}");
        // The peak's time on the merged axis is the rank's own peak time, shifted by where
        // the rank starts on it.
        let own = shared::ranks::rank_trace(session.trace(), d.rank).unwrap();
        let shift_s = (own.start_ns() - session.trace().start_ns()) as f64 * 1e-9;
        assert!(
            (d.peak_time_s - (summary(&own).peak_time_s + shift_s)).abs() < 1e-6,
            "{sample}: {} vs {}",
            d.peak_time_s,
            summary(&own).peak_time_s + shift_s
        );
        assert_eq!(d.events, own.events.len());
    }
    assert_eq!(ranks.highest_device, ranks.devices[0].device_index);
    assert_eq!(ranks.most_different, (ranks.devices[0].device_index, ranks.devices[1].device_index));
    assert!(ranks.missing_ranks.is_empty());
    assert_eq!(ranks.duration_s, overview.duration_s);
    // A single trace has no rank set.
    assert!(open(MLP).1.ranks.is_none());
}

#[test]
fn rank_curves_share_one_axis_and_reach_each_peak() {
    let (mut session, overview) = open_ranks(&rank_files(), &MergeOptions::default()).unwrap();
    let ranks = overview.ranks.unwrap();
    let Response::RankCurves { end_s, curves } = session.answer(&Request::RankCurves { buckets: 400 }) else { panic!("no curves") };
    assert_eq!(end_s, ranks.duration_s);
    assert_eq!(curves.len(), 2);
    for (c, d) in curves.iter().zip(&ranks.devices) {
        assert_eq!((c.rank, c.device_index), (d.rank, d.device_index));
        assert_eq!(max_allocated(&c.points), d.peak_allocated_bytes, "rank {}", c.rank);
        assert!(c.points.len() <= 400 && c.points.iter().all(|p| p.t_s >= 0.0 && p.t_s <= end_s));
    }
    let (mut single, _) = open(MLP);
    let Response::Error { message } = single.answer(&Request::RankCurves { buckets: 10 }) else { panic!() };
    assert!(message.contains("no ranks"), "{message}");
}

#[test]
fn picking_a_rank_shows_that_rank_everywhere_and_all_ranks_comes_back() {
    let (mut session, _) = open_ranks(&rank_files(), &MergeOptions::default()).unwrap();
    let Response::Overview(one) = session.answer(&Request::ShowRank { rank: Some(1) }) else { panic!("no overview") };
    assert_eq!(one.file_name, "rank1.pickle + rank0.pickle · rank 1");
    assert_eq!(one.summary.peak_allocated_bytes, fact(MLP, "max_allocated"));
    assert_eq!(one.summary.peak_reserved_bytes, fact(MLP, "max_reserved"));
    let own = import(&data(MLP), &ImportOptions::default()).unwrap();
    assert_eq!(one.layers.len(), shared::analysis::layer_stats(&own).len());
    // The rank set stays the whole job's, with the rank picked.
    let ranks = one.ranks.as_ref().unwrap();
    assert_eq!((ranks.selected, ranks.devices.len()), (Some(1), 2));
    // Later answers are the rank's: its timeline, its hover, its exports.
    let Response::Timeline { points, .. } = session.answer(&Request::Timeline { start_s: 0.0, end_s: one.duration_s, buckets: 500 }) else {
        panic!()
    };
    assert_eq!(max_allocated(&points), fact(MLP, "max_allocated"));
    let Response::At(m) = session.answer(&Request::At { t_s: one.summary.peak_time_s }) else { panic!() };
    assert_eq!(m.allocated_bytes, fact(MLP, "max_allocated"));
    let Response::Export { file_name, .. } = session.answer(&Request::Export { format: "csv".into() }) else { panic!() };
    assert_eq!(file_name, "merged.rank1.csv");
    let Response::Error { message } = session.answer(&Request::ShowRank { rank: Some(7) }) else { panic!() };
    assert!(message.contains("no rank 7") && message.contains("[0, 1]"), "{message}");
    // All ranks again.
    let Response::Overview(all) = session.answer(&Request::ShowRank { rank: None }) else { panic!() };
    assert_eq!(all.summary.peak_allocated_bytes, fact(RESNET, "max_allocated"));
    assert_eq!((all.file_name.as_str(), all.ranks.unwrap().selected), ("rank1.pickle + rank0.pickle", None));
}

#[test]
fn the_two_most_different_ranks_compare() {
    let (mut session, overview) = open_ranks(&rank_files(), &MergeOptions::default()).unwrap();
    let (a, b) = overview.ranks.unwrap().most_different;
    let Response::Diff(d) = session.answer(&Request::DiffDevices { a, b }) else { panic!("no diff") };
    assert_eq!(d.a.peak_allocated_bytes, fact(RESNET, "max_allocated"));
    assert_eq!(d.b.peak_allocated_bytes, fact(MLP, "max_allocated"));
    assert_eq!(d.peak_allocated_delta_bytes, fact(MLP, "max_allocated") as i64 - fact(RESNET, "max_allocated") as i64);
    assert!(!d.layers_match);
    let Response::Error { message } = session.answer(&Request::DiffDevices { a, b: 9 }) else { panic!() };
    assert!(message.contains("device 9"), "{message}");
}

#[test]
fn the_open_trace_compares_with_another_file() {
    let (session, _) = open(RESNET);
    let d = session.compare_with(MLP, &data(MLP)).unwrap();
    assert_eq!((d.a.peak_allocated_bytes, d.b.peak_allocated_bytes), (fact(RESNET, "max_allocated"), fact(MLP, "max_allocated")));
    assert_eq!(d.peak_allocated_delta_bytes, 110388224 - 238078976);
    assert!(d.notes.iter().any(|n| n.starts_with("the layers do not match")), "{:?}", d.notes);
    let e = session.compare_with("notes.txt", b"not a trace").unwrap_err().to_string();
    assert!(e.contains("expected"), "{e}");
}

#[test]
fn rank_files_that_are_not_one_run_are_refused_with_why() {
    // The same rank twice.
    let twice = vec![("rank0.pickle".to_owned(), data(MLP)), ("b/rank0.pickle".to_owned(), data(RESNET))];
    let e = open_ranks(&twice, &MergeOptions::default()).err().unwrap();
    assert!(e.to_string().contains("rank 0 is given twice") && !e.can_merge_anyway(), "{e}");
    // A file that is no trace names itself.
    let junk = vec![("rank0.pickle".to_owned(), data(MLP)), ("rank1.txt".to_owned(), b"hello".to_vec())];
    let e = open_ranks(&junk, &MergeOptions::default()).err().unwrap();
    assert!(matches!(&e, RanksError::File { file_name, .. } if file_name == "rank1.txt"), "{e}");
    // Recorded ten minutes apart: refused, unless asked.
    let mut later = import(&data(MLP), &ImportOptions::default()).unwrap();
    later.events.ts_ns.iter_mut().for_each(|t| *t += 600_000_000_000);
    later.scopes.iter_mut().for_each(|s| (s.start_ns, s.end_ns) = (s.start_ns + 600_000_000_000, s.end_ns + 600_000_000_000));
    let mut bytes = Vec::new();
    shared::export::native::write(&later, &mut bytes).unwrap();
    let apart = vec![("rank0.pickle".to_owned(), data(RESNET)), ("rank1.mtrace.json".to_owned(), bytes)];
    let e = open_ranks(&apart, &MergeOptions::default()).err().unwrap();
    let text = e.to_string();
    assert!(e.can_merge_anyway() && text.contains("recorded at different times") && !text.contains("--allow-disjoint"), "{text}");
    let (_, o) = open_ranks(&apart, &MergeOptions { allow_disjoint: true, ..MergeOptions::default() }).unwrap();
    assert!(o.ranks.unwrap().warnings.iter().any(|w| w.contains("far apart")));
}

/// The session's flame graph, as it answers it.
fn flame_of(session: &mut Session) -> shared::analysis::flame::FlameGraph {
    match session.answer(&Request::Flame { all_frames: false }) {
        Response::Flame { graph } => *graph,
        _ => panic!("no flame graph"),
    }
}

/// The overview, the flame graph and the Active Memory Timeline cross from the worker (or the
/// server) to the page as JSON in compact forms (the flame graph in columns with each name
/// once, band bottoms as runs): what arrives equals what was sent, on every sample.
#[test]
fn overview_and_active_bands_arrive_as_they_were_sent() {
    for name in [RESNET, MLP, "read_ahead_cases.pickle"] {
        let (mut session, overview) = open(name);
        let json = serde_json::to_string(&overview).unwrap();
        let back: Overview = serde_json::from_str(&json).unwrap();
        let flame = flame_of(&mut session);
        let sent = serde_json::to_string(&session.answer(&Request::Flame { all_frames: false })).unwrap();
        let Response::Flame { graph: arrived } = serde_json::from_str(&sent).unwrap() else { panic!("{name}: not a flame graph") };
        assert_eq!(*arrived, flame, "{name}");
        for (back, sent) in [(&back.layer_bands, &overview.layer_bands), (&back.phase_bands, &overview.phase_bands)] {
            let names = |b: &[shared::explore::Band]| b.iter().map(|b| (b.label.clone(), b.phase)).collect::<Vec<_>>();
            assert_eq!(names(back), names(sent), "{name}");
            let near = |a: f64, b: f64| (a - b).abs() <= b.abs() * 1e-15;
            assert!(back.iter().zip(sent).all(|(a, b)| near(a.start_s, b.start_s) && near(a.end_s, b.end_s)), "{name}: band times differ");
        }
        assert!(flame.nodes.len() > 1, "{name}: a flame graph to send");
        let request = Request::Active { start_s: 0.0, end_s: overview.duration_s, columns: 1200 };
        let Response::Active(a) = session.answer(&request) else { panic!("{name}: no active timeline") };
        assert!(!a.bands.is_empty(), "{name}: bands to send");
        let json = serde_json::to_string(&a).unwrap();
        let back: shared::analysis::active::ActiveTimeline = serde_json::from_str(&json).unwrap();
        // (Seconds may come back a unit in the last place off: serde_json parses floats fast.)
        // Packed columns come back bit for bit (a never-freed band's infinity too).
        assert!(back.bands == a.bands, "{name}: bands differ after the trip");
        assert!(back.bands.is_consistent(back.totals.len()), "{name}");
        assert_eq!((&back.totals, &back.before_trace, back.live), (&a.totals, &a.before_trace, a.live), "{name}");
        let request = Request::Timeline { start_s: 0.0, end_s: overview.duration_s, buckets: 1200 };
        let Response::Timeline { points, .. } = session.answer(&request) else { panic!("{name}: no timeline") };
        assert!(points.len() > 10, "{name}: points to send");
        let json = serde_json::to_value(session.answer(&request)).unwrap();
        assert_eq!(json["points"]["allocated_max_bytes"].as_array().map(Vec::len), Some(points.len()), "{name}: {json}");
        let Response::Timeline { points: back, .. } = serde_json::from_value(json).unwrap() else { panic!("{name}: not a timeline") };
        let bytes = |p: &[shared::analysis::TimelinePoint]| {
            p.iter()
                .map(|p| {
                    (
                        p.allocated_min_bytes,
                        p.allocated_max_bytes,
                        p.reserved_max_bytes,
                        p.allocated_last_bytes,
                        p.reserved_last_bytes,
                        p.first_event,
                    )
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(bytes(&back), bytes(&points), "{name}");
        assert!(back.iter().zip(&points).all(|(b, p)| (b.t_s - p.t_s).abs() <= p.t_s.abs() * 1e-15), "{name}: times differ");
    }
    // The ResNet's graph with every frame repeats its frame names: each is written once.
    let flame = match open(RESNET).0.answer(&Request::Flame { all_frames: true }) {
        Response::Flame { graph } => *graph,
        _ => panic!("no flame graph"),
    };
    let names: usize = flame.nodes.iter().map(|n| n.name.len()).sum();
    let json = serde_json::to_string(&flame).unwrap();
    assert!(json.len() < names / 2, "flame graph JSON {} bytes for {names} bytes of node names", json.len());
}

/// Compact forms that do not add up are refused with what was expected, not expanded.
#[test]
fn malformed_compact_forms_are_refused() {
    let (mut session, _) = open(RESNET);
    let graph = flame_of(&mut session);
    let mut flame = serde_json::to_value(&graph).unwrap();
    flame["depth"].as_array_mut().unwrap().pop();
    let e = serde_json::from_value::<shared::analysis::flame::FlameGraph>(flame).unwrap_err().to_string();
    assert!(e.contains("columns differ in length"), "{e}");
    let mut flame = serde_json::to_value(&graph).unwrap();
    flame["parent"][1] = serde_json::json!(5);
    let e = serde_json::from_value::<shared::analysis::flame::FlameGraph>(flame).unwrap_err().to_string();
    assert!(e.contains("expected an earlier node"), "{e}");
    let mut flame = serde_json::to_value(&graph).unwrap();
    flame["name"][0] = serde_json::json!(u32::MAX);
    assert!(serde_json::from_value::<shared::analysis::flame::FlameGraph>(flame).is_err());
    // Active bands: packed columns of the wrong width or not base64 are refused; an answer
    // whose runs leave its columns is told apart before it is drawn.
    let (mut session, overview) = open(RESNET);
    let Response::Active(a) = session.answer(&Request::Active { start_s: 0.0, end_s: overview.duration_s, columns: 300 }) else {
        panic!("no active view")
    };
    assert!(a.bands.is_consistent(300));
    let sent = serde_json::to_value(&a.bands).unwrap();
    let mut bands = sent.clone();
    bands["size_bytes"] = serde_json::json!("AAAA");
    let e = serde_json::from_value::<shared::analysis::active::ActiveBands>(bands).unwrap_err().to_string();
    assert!(e.contains("expected 8-byte numbers"), "{e}");
    let mut bands = sent.clone();
    bands["event_index"] = serde_json::json!("not base64!");
    let e = serde_json::from_value::<shared::analysis::active::ActiveBands>(bands).unwrap_err().to_string();
    assert!(e.contains("a packed column"), "{e}");
    let mut bad = a.bands.clone();
    bad.run_columns[0] = 1000;
    assert!(!bad.is_consistent(300), "a run past the last column");
    let mut bad = a.bands.clone();
    bad.layer[0] = bad.names.len() as u32;
    assert!(!bad.is_consistent(300), "a name that is not there");
    let (mut session, overview) = open(RESNET);
    let mut timeline =
        serde_json::to_value(session.answer(&Request::Timeline { start_s: 0.0, end_s: overview.duration_s, buckets: 100 })).unwrap();
    timeline["points"]["reserved_last_bytes"].as_array_mut().unwrap().pop();
    let e = serde_json::from_value::<Response>(timeline).unwrap_err().to_string();
    assert!(e.contains("columns differ in length"), "{e}");
    assert!(!overview.layer_bands.is_empty());
    let mut o = serde_json::to_value(&overview).unwrap();
    o["layer_bands"]["label"][0] = serde_json::json!(99);
    let e = serde_json::from_value::<Overview>(o).unwrap_err().to_string();
    assert!(e.contains("band 0 names label 99"), "{e}");
    let mut o = serde_json::to_value(&overview).unwrap();
    o["phase_bands"]["end_s"].as_array_mut().unwrap().pop();
    let e = serde_json::from_value::<Overview>(o).unwrap_err().to_string();
    assert!(e.contains("columns differ in length"), "{e}");
}
