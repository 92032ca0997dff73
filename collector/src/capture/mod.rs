//! Native capture: records from the C++ shim and their assembly into a [`shared::Trace`].
//!
//! `assemble` and `live` are pure data (the record layout is the `record` crate's): they serve the traces that
//! Python processes stream (`crate::pyrun`) and those `collector-capture` records in-process
//! (its `capture` module drives the shim linked into it).

pub mod assemble;
pub mod live;

/// The binary that runs models in-process: `$MEMORY_TRACER_CAPTURE`, else `collector-capture`
/// beside this executable.
pub fn binary() -> Option<std::path::PathBuf> {
    if let Some(p) = std::env::var_os("MEMORY_TRACER_CAPTURE") {
        return Some(std::path::PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let beside = exe.parent()?.join("collector-capture");
    beside.is_file().then_some(beside)
}
