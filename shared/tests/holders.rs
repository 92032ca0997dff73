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
