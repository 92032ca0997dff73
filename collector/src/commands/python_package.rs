//! `collector python-package` (hidden): writes the `memory_tracer` package this collector carries.

use std::path::Path;

/// `collector python-package`: the package and capture libraries this collector carries.
pub fn python_package_command(out: &Path) -> anyhow::Result<()> {
    crate::pyrun::package::write_to(out)?;
    let carried: Vec<&str> = record::CAPTURES.iter().map(|c| c.torch).collect();
    let carried = if carried.is_empty() { "none: every torch builds it on first use".to_owned() } else { carried.join(", ") };
    eprintln!("wrote the memory_tracer package to {} (capture libraries for torch {carried})", out.display());
    Ok(())
}
