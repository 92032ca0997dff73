//! What the viewer's worker answers (`shared::explore`) and the flame graph, on the real samples:
//! the flame graph's weights add up to the peak, a zoomed timeline agrees with the full one,
//! hovering and clicking give the allocator's own numbers.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use shared::analysis::flame::{flame_graph, FlameKind};
use shared::analysis::{live_allocations_at, summary, timeline, TimelineOptions};
use shared::explore::{Opened, Request, Response, Session};
use shared::{import, ImportOptions};
use std::path::PathBuf;

fn data(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data").join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

fn open(name: &str) -> (Session, shared::explore::Overview) {
    match Session::open(name, &data(name), |_| {}).unwrap() {
        Opened::Trace(s, o) => (*s, *o),
        Opened::Sweep(_) => panic!("{name} opened as a sweep"),
    }
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

#[test]
fn zoomed_timeline_agrees_with_the_full_timeline() {
    let (session, overview) = open("resnet18_sgd_2steps.pickle");
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
    let (session, overview) = open("resnet18_sgd_2steps.pickle");
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
    let allocated: u64 = segments
        .iter()
        .flat_map(|seg| &seg.blocks)
        .filter(|b| b.state == shared::model::BlockState::Allocated)
        .map(|b| b.size_bytes)
        .sum();
    assert_eq!(allocated, s.peak_allocated_bytes, "blocks at the peak add up to the peak");
}

#[test]
fn exports_and_bad_requests() {
    let (session, _) = open("mlp_adam_3steps.pickle");
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
