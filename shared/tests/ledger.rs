//! The device ledger of a recorded GPU run with two NCCL communicators (`tests/gpu/ledger.sh`
//! on an H200, NCCL 2.28: `ledger_probe.py`'s default group and a second group of the same
//! rank, each all-reducing once): NCCL's bytes are split by communicator, as NCCL's profiler
//! plugin interface told the capture which one each allocation was for.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use shared::analysis::ledger::{ledger_at, ledger_bands, moment};
use shared::{import, ImportOptions};

const MIB: u64 = 1 << 20;

#[test]
fn nccls_bytes_are_split_by_the_communicator_that_made_them() {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/ledger/probe_communicators.mtrace.json.gz");
    let trace = import(&std::fs::read(&p).unwrap(), &ImportOptions::default()).unwrap();
    let l = ledger_at(&trace, moment(&trace, "held").unwrap(), None).unwrap();
    let nccl = l.sources.iter().find(|s| s.source == "nccl").expect("an nccl source");
    assert_eq!(nccl.bytes, 776 * MIB);
    let communicators: Vec<_> = nccl.parts.iter().filter(|p| p.name.starts_with("communicator ")).collect();
    assert_eq!(communicators.len(), 2, "{:?}", nccl.parts);
    for c in &communicators {
        // torch names no communicator: NCCL's hash, and the rank of the group's size.
        assert!(c.name.ends_with(" (rank 0 of 1)"), "{}", c.name);
        assert_eq!((c.bytes, c.peak_bytes), (406_847_488, 406_847_488), "{}", c.name);
    }
    assert_ne!(communicators[0].name, communicators[1].name);
    // What NCCL made before it named its first communicator: 2 MiB, given back by the moment.
    let untold = nccl.parts.iter().find(|p| p.name == "not told apart").unwrap();
    assert_eq!((untold.bytes, untold.peak_bytes), (0, 2 * MIB));
    assert_eq!(nccl.parts.iter().map(|p| p.bytes).sum::<u64>(), nccl.bytes);
    assert!(nccl.detail.starts_with("2 communicators: communicator "), "{}", nccl.detail);
    // One source in the summary's line and one band in the viewer, not one per communicator.
    assert!(l.line().contains("+ nccl 776.00 MiB +"), "{}", l.line());
    assert!(!l.sources.iter().any(|s| s.source.starts_with("nccl ")));
    let bands = ledger_bands(&trace, 0, &[(0.0, 1.0), (1.0, 10.0)]);
    assert_eq!(bands.sources.iter().filter(|(n, _)| n.starts_with("nccl")).count(), 1);
    // Everything NVML counts is named but 1.75 MiB.
    assert!(l.unexplained_bytes.unwrap().unsigned_abs() <= 2 * MIB, "{:?}", l.unexplained_bytes);
}
