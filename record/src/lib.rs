//! Memory Tracer's capture contract in one crate: the C++ shim (`shim/`) that records every
//! allocation, operator and module scope inside a PyTorch process, its builds for every
//! supported torch release (`build.rs`, the list in `torch-versions.txt`), its records as
//! Rust reads them ([`layout`]) and its functions ([`sys`], linked by `collector-capture`), and
//! the records made into a [`shared::Trace`] ([`assemble`]) or live totals ([`live`]), for the
//! traces Python processes stream to the collector and those `collector-capture` records.
//! Python binds the same functions with ctypes (`collector/python/memory_tracer/_shim.py`);
//! `tests/layout.rs` checks the three views against each other.

pub mod assemble;
pub mod layout;
pub mod live;
pub mod sys;

pub use layout::*;

/// A capture library built against one torch release.
#[derive(Debug)]
pub struct Capture {
    /// The minor version it serves (`2.11`): any patch release of it loads this library.
    pub minor: &'static str,
    /// The release it was built against (`2.11.0`).
    pub torch: &'static str,
    /// The shared library (`libmt_shim.so`).
    pub library: &'static [u8],
}

include!(concat!(env!("OUT_DIR"), "/captures.rs"));

/// The supported torch releases, oldest first (`torch-versions.txt`, comments left out).
pub fn supported_versions() -> impl Iterator<Item = &'static str> {
    include_str!("../torch-versions.txt").lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#'))
}

/// The shim's sources, for programs whose torch has no library here: they build it on first
/// use (`memory_tracer/_build.py`).
pub const SHIM_SOURCES: [(&str, &[u8]); 2] =
    [("mt_shim.cpp", include_bytes!("../shim/mt_shim.cpp")), ("mt_shim.h", include_bytes!("../shim/mt_shim.h"))];
