//! `collector why` on a real PyTorch snapshot, which records no holders: each is inferred from
//! the allocation's category, and the cuBLAS handles' workspaces from their stacks.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use shared::analysis::holders::{why, Moment};
use shared::model::HolderKind;
use std::path::PathBuf;

fn load(name: &str) -> shared::Trace {
    let bytes = std::fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data").join(name)).unwrap();
    shared::import::snapshot::import(&bytes).unwrap()
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
