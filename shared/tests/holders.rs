//! `collector why` on a real PyTorch snapshot, which records no holders: each is inferred from
//! the allocation's category, and the cuBLAS handles' workspaces from their stacks.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use shared::analysis::holders::{why, Moment};
use shared::model::HolderKind;
use std::path::PathBuf;

fn load(name: &str) -> shared::Trace {
    let bytes = std::fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data").join(name)).unwrap();
    shared::import(&bytes, &shared::ImportOptions::default()).unwrap()
}

/// An MLP trained with Adam for three steps on an H100: at the peak the two cuBLAS handles'
/// workspaces (forward's and backward's, 32 MiB each) and cuBLASLt's (1 MiB) are a library's
/// cache, inferred from the frames that allocated them, apart from the allocator's own cache.
#[test]
fn cublas_workspaces_in_a_snapshot_are_named_from_their_stacks() {
    let t = load("mlp_adam_3steps.pickle");
    let w = why(&t, &Moment::Peak, None).unwrap();
    assert!(!w.recorded);
    let workspaces: Vec<_> = w.holders.iter().filter(|g| g.kind == HolderKind::Cache && g.name == "cuBLAS workspace").collect();
    assert_eq!(workspaces.len(), 1, "{:?}", w.holders);
    let ws = workspaces[0];
    assert_eq!((ws.bytes, ws.blocks, ws.inferred, ws.released_at_s), (2 * (32 << 20) + (1 << 20), 3, true, None));
    let allocator = w.holders.iter().find(|g| g.kind == HolderKind::Cache && g.name == "reserved, allocated to nothing").unwrap();
    assert_eq!(allocator.bytes, w.reserved_bytes - w.live_bytes);
    // Named: every live byte but what no rule and no stack explains.
    let unknown: u64 = w.holders.iter().filter(|g| g.kind == HolderKind::Unknown).map(|g| g.bytes).sum();
    assert_eq!(w.named_bytes, w.live_bytes - unknown);
}

/// A real snapshot (H200, tests/gpu/pending_free.py) of a 64 MiB tensor freed while a side
/// stream still read it (`record_stream`): PyTorch's own snapshot just after the free said
/// `active_pending_free`. While its free waits (free_requested at 2.028 s, free_completed at
/// 5.796 s) the block is a pending free, not live and not the allocator's to reuse; once
/// completed it is the allocator's cache.
#[test]
fn a_free_waiting_for_another_stream_is_a_pending_free_until_it_completes() {
    let t = load("pending_free_real.pickle.gz");
    let pending = why(&t, &Moment::Seconds(3.0), None).unwrap();
    let held: Vec<_> = pending.holders.iter().filter(|g| g.kind == HolderKind::PendingFree).collect();
    assert_eq!(held.len(), 1, "{:?}", pending.holders);
    assert_eq!((held[0].bytes, held[0].blocks), (64 << 20, 1));
    let released = held[0].released_at_s.unwrap();
    assert!((released - 5.796).abs() < 0.001, "{released}");
    // x freed, y (64 MiB on the side stream) live; 128 MiB reserved: y's, and x's block pending.
    assert_eq!((pending.live_bytes, pending.reserved_bytes), (64 << 20, 128 << 20));
    assert!(pending.holders.iter().all(|g| g.kind != HolderKind::Cache || g.bytes == 0), "{:?}", pending.holders);
    let done = why(&t, &Moment::Seconds(5.7964), None).unwrap();
    assert!(done.holders.iter().all(|g| g.kind != HolderKind::PendingFree), "{:?}", done.holders);
    let before = why(&t, &Moment::Seconds(1.0), None).unwrap();
    assert!(before.holders.iter().all(|g| g.kind != HolderKind::PendingFree), "{:?}", before.holders);
    assert_eq!(before.live_bytes, 128 << 20);
}

/// Holders recorded on the real MLP snapshot's blocks, each taking its block at a time of its
/// own: at the peak, a block is named by the holder holding it then, never by one that takes it
/// later (that block's holder is inferred, and counted apart); recorded and inferred bytes add
/// up to the named ones; the JSON's names are full module paths, folded only for a reader.
#[test]
fn a_block_is_held_now_never_by_a_holder_that_takes_it_later() {
    use shared::analysis::holders::why_with;
    use shared::model::{EventHolder, EventType};
    let mut t = load("mlp_adam_3steps.pickle");
    let at = why(&t, &Moment::Peak, None).unwrap();
    let peak_ns = t.events.ts_ns[at.at.event.unwrap() as usize];
    let allocs: Vec<usize> =
        (0..t.events.len()).filter(|&i| t.events.event_type(i) == EventType::Alloc && t.events.ts_ns[i] <= peak_ns).collect();
    // Every block allocated by the peak gets a parameter holder, in three layers; the even ones
    // from their allocation on, the odd ones only after the peak.
    for (k, &i) in allocs.iter().enumerate() {
        let (name, module) = (t.strings.intern("weight"), t.strings.intern(&format!("blocks.{}.fc", k % 3)));
        let taken_ns = if k % 2 == 0 { t.events.ts_ns[i] } else { peak_ns + 1 };
        t.event_holders.push(EventHolder { event: i as u32, kind: HolderKind::Parameter, name, module, taken_ns, released_ns: None });
    }
    t.event_holders.sort_by_key(|h| h.event);
    let w = why_with(&t, &Moment::Peak, None, false).unwrap();
    assert!(w.recorded);
    let recorded: u64 = w.holders.iter().filter(|g| g.kind == HolderKind::Parameter && !g.inferred).map(|g| g.bytes).sum();
    // What the optimizer step under way made (the peak is in it) is its temporaries, from the
    // records; no parameter's.
    let temporaries: u64 = w.holders.iter().filter(|g| g.kind == HolderKind::Temporary).map(|g| g.bytes).sum();
    assert!(w.holders.iter().any(|g| g.kind == HolderKind::Temporary && g.name == "made in this optimizer step"), "{:?}", w.holders);
    assert_eq!(w.recorded_bytes, recorded + temporaries, "{:?}", w.holders);
    assert_eq!(w.recorded_bytes + w.inferred_bytes, w.named_bytes);
    assert!(w.inferred_bytes > 0 && w.recorded_bytes > 0, "{} {}", w.recorded_bytes, w.inferred_bytes);
    // The odd blocks live at the peak are not the parameters' bytes.
    let live_even: u64 = allocs
        .iter()
        .enumerate()
        .filter(|(k, &i)| k % 2 == 0 && t.events.ts_ns[i] <= peak_ns && !freed_by(&t, i, peak_ns))
        .map(|(_, &i)| t.events.size_bytes[i])
        .sum();
    assert_eq!(recorded, live_even);
    let modules: Vec<&str> =
        w.holders.iter().filter(|g| !g.inferred && g.kind == HolderKind::Parameter).map(|g| g.module.as_str()).collect();
    assert!(modules.iter().all(|m| ["blocks.0.fc", "blocks.1.fc", "blocks.2.fc"].contains(m)), "{modules:?}");
    let folded = why_with(&t, &Moment::Peak, None, true).unwrap();
    assert!(folded.holders.iter().any(|g| g.module == "blocks.{0..2}.fc"), "{:?}", folded.holders);
}

/// Whether allocation `i`'s block is freed at or before `t_ns`.
fn freed_by(t: &shared::Trace, i: usize, t_ns: u64) -> bool {
    let a = t.events.address[i];
    (i + 1..t.events.len()).any(|j| {
        t.events.ts_ns[j] <= t_ns
            && t.events.address[j] == a
            && matches!(t.events.event_type(j), shared::model::EventType::Free | shared::model::EventType::Alloc)
    })
}
