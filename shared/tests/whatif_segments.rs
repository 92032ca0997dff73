//! The simulated segment map (`shared::whatif::segments_after`, the Segments view's second
//! canvas): under a run's own settings it is the recorded map (`analysis::segments_at`) segment
//! by segment and block by block, at moments throughout real traces of `tests/data/`; under
//! `expandable_segments:True` the same blocks sit in fewer segments.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use shared::analysis::{has_segments, segments_at, segments_before_events};
use shared::model::{BlockState, EventType, SegmentInfo, Trace};
use shared::whatif::{requests, segments_after, AllocConf, SimOptions};
use shared::{import, ImportOptions};
use std::path::PathBuf;

fn load(name: &str) -> Trace {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data").join(name);
    let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
    import(&bytes, &ImportOptions::default()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// About `n` events of a device's requests, spread evenly, the last one included.
fn moments(events: &[u32], n: usize) -> Vec<u32> {
    let step = (events.len() / n).max(1);
    let mut at: Vec<u32> = events.iter().copied().step_by(step).collect();
    at.extend(events.last());
    at.dedup();
    at
}

fn allocated_bytes(segments: &[SegmentInfo]) -> u64 {
    segments.iter().flat_map(|s| &s.blocks).filter(|b| b.state == BlockState::Allocated).map(|b| b.size_bytes).sum()
}

/// Reserved bytes and the blocks not free, in address order.
fn in_use(segments: &[SegmentInfo]) -> (u64, Vec<(u64, u64, BlockState)>) {
    let reserved = segments.iter().map(|s| s.size_bytes).sum();
    let mut blocks: Vec<_> = segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|b| b.state != BlockState::Free)
        .map(|b| (b.address, b.size_bytes, b.state))
        .collect();
    blocks.sort_by_key(|b| b.0);
    (reserved, blocks)
}

/// Every device of `name` replayed under its own settings gives the recorded segment map
/// before its first event and after each of about 30 of its requests' events (the last event
/// of the trace aside).
fn own_settings_give_the_recorded_map(name: &str) -> usize {
    let trace = load(name);
    assert!(has_segments(&trace), "{name} records segments");
    let reqs = requests(&trace);
    let mut compared = 0;
    for dev in &reqs.devices {
        let before = segments_after(dev, &reqs.own_conf, &SimOptions::default(), None).unwrap();
        assert_eq!(before, segments_before_events(&trace, dev.device), "{name} {}: before the first event", dev.name);
        // Not between a free and its completion in the next event: the replay takes the two as
        // one (the block cached at once), where the recorded map shows the block pending.
        let ev = &trace.events;
        let halfway = |e: u32| ev.event_type(e as usize) == EventType::Free && ev.event_type(e as usize + 1) == EventType::FreeCompleted;
        let events: Vec<u32> = dev.requests.iter().map(|r| r.event).filter(|&e| (e as usize + 1) < ev.len() && !halfway(e)).collect();
        for e in moments(&events, 30) {
            let simulated = segments_after(dev, &reqs.own_conf, &SimOptions::default(), Some(e)).unwrap();
            let recorded = segments_at(&trace, e as usize, dev.device);
            if dev.initial_expandable || reqs.own_conf.expandable() {
                // The recorded replay lists each mapping as a segment of its own; the simulation
                // one segment per mapped range. The memory and the blocks in use are the same.
                assert_eq!(in_use(&simulated), in_use(&recorded), "{name} {}: after event {e}", dev.name);
            } else {
                assert_eq!(simulated, recorded, "{name} {}: after event {e}", dev.name);
            }
            compared += 1;
        }
    }
    compared
}

#[test]
fn under_the_runs_own_settings_the_simulated_map_is_the_recorded_one() {
    // Segments from before recording (resnet18), private pools (CUDA graphs, MemPool),
    // held-back frees, two devices.
    for name in [
        "resnet18_sgd_2steps.pickle",
        "mlp_adam_3steps.pickle",
        "pool_graph.pickle.gz",
        "pool_mempool.pickle.gz",
        "pending_free.pickle.gz",
        "layout_2_15.pickle",
        "expandable_mlp.pickle",
    ] {
        let compared = own_settings_give_the_recorded_map(name);
        assert!(compared >= 2, "{name}: {compared} moments compared");
    }
}

/// A native trace records no segments, only totals: the simulated map's memory is the recorded
/// totals' at every moment.
#[test]
fn a_native_traces_simulated_map_holds_its_recorded_totals() {
    let trace = load("whatif/cnn.default.mtrace.json.gz");
    assert!(!has_segments(&trace));
    let reqs = requests(&trace);
    let dev = &reqs.devices[0];
    let events: Vec<u32> = dev.requests.iter().map(|r| r.event).collect();
    for e in moments(&events, 30) {
        let simulated = segments_after(dev, &reqs.own_conf, &SimOptions::default(), Some(e)).unwrap();
        let recorded = trace.events.totals_at(e as usize);
        let reserved: u64 = simulated.iter().map(|s| s.size_bytes).sum();
        assert_eq!((allocated_bytes(&simulated), reserved), (recorded.allocated_bytes, recorded.reserved_bytes), "after event {e}");
    }
}

/// Under expandable segments each allocation's block is its request rounded (they split a
/// block wherever 512 bytes are left, where the run's own segments handed out whole cached
/// blocks of up to 1 MiB more), in fewer segments.
#[test]
fn under_expandable_segments_the_blocks_are_their_requests_in_fewer_segments() {
    let trace = load("resnet18_sgd_2steps.pickle");
    let reqs = requests(&trace);
    let dev = &reqs.devices[0];
    let conf = reqs.own_conf.overridden_by(&AllocConf::parse("expandable_segments:True").unwrap());
    let peak = shared::analysis::summary(&trace).peak_event_index.unwrap() as u32;
    let recorded = segments_at(&trace, peak as usize, dev.device);
    let simulated = segments_after(dev, &conf, &SimOptions::default(), Some(peak)).unwrap();
    let round = conf.allocator_config();
    let before: u64 =
        dev.initial_segments.iter().flat_map(|s| &s.blocks).filter(|b| b.state == BlockState::Allocated).map(|b| b.size_bytes).sum();
    let mut live = std::collections::HashMap::new();
    for i in 0..=peak as usize {
        match trace.events.event_type(i) {
            EventType::Alloc => {
                let asked = trace.requested_of(i).expect("a snapshot's allocations name their requests");
                live.insert(trace.events.address[i], round.round_size(asked));
            }
            EventType::Free => {
                live.remove(&trace.events.address[i]);
            }
            _ => {}
        }
    }
    assert_eq!(allocated_bytes(&simulated), before + live.values().sum::<u64>());
    assert!(allocated_bytes(&simulated) < allocated_bytes(&recorded));
    // The 3 segments from before recording stay; the rest is one mapped range per pool.
    assert!(simulated.len() < recorded.len(), "{} simulated, {} recorded", simulated.len(), recorded.len());
    assert!(simulated.len() <= 5, "{}", simulated.len());
    // Each segment's blocks tile it, in address order.
    for s in &simulated {
        let mut at = s.address;
        for b in &s.blocks {
            assert_eq!(b.address, at);
            at += b.size_bytes;
        }
        assert_eq!(at, s.address + s.size_bytes);
    }
}

#[test]
fn a_setting_the_model_cannot_replay_is_refused() {
    let trace = load("mlp_adam_3steps.pickle");
    let reqs = requests(&trace);
    let conf = reqs.own_conf.overridden_by(&AllocConf::parse("backend:cudaMallocAsync").unwrap());
    let e = segments_after(&reqs.devices[0], &conf, &SimOptions::default(), Some(10)).unwrap_err();
    assert!(e.to_string().contains("cudaMallocAsync"), "{e}");
}

/// The viewer's question: the worker's session answers it for the device the Segments view
/// shows, and a setting that does not parse is an error line, not a panic.
#[test]
fn the_session_answers_with_the_simulated_map_or_the_settings_error() {
    use shared::explore::{Opened, Request, Response, Session};
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/mlp_adam_3steps.pickle");
    let Opened::Trace(mut session, o) = Session::open("mlp.pickle", &std::fs::read(p).unwrap(), |_| {}).unwrap() else { panic!() };
    let t_s = o.summary.peak_time_s;
    let Response::Segments { segments: recorded, .. } = session.answer(&Request::Segments { t_s }) else { panic!() };
    let ask = |session: &mut Session, conf: &str| session.answer(&Request::SimulatedSegments { t_s, alloc_conf: conf.into() });
    let Response::SimulatedSegments { segments, error: None, .. } = ask(&mut session, "") else { panic!("the run's own settings") };
    assert_eq!(segments, recorded);
    let Response::SimulatedSegments { segments, error: None, .. } = ask(&mut session, "expandable_segments:True") else { panic!() };
    assert_eq!(allocated_bytes(&segments), allocated_bytes(&recorded));
    assert!(segments.len() < recorded.len());
    let Response::SimulatedSegments { segments, error: Some(e), .. } = ask(&mut session, "max_split_size_mb:lots") else { panic!() };
    assert!(segments.is_empty() && e.contains("max_split_size_mb") && e.contains("lots"), "{e}");
}
