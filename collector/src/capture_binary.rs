//! Where `collector-capture` (the `capture` crate: models run in-process through libtorch) is:
//! the commands and the server's trace jobs hand it a [`protocol::CaptureJob`].

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
