//! `collector find`: allocations by address, frame, module path or note.

use super::ImportArgs;
use std::io::Write;
use std::path::PathBuf;
use traceio::files::load_trace;

/// A trace and what to find in it (`find`).
#[derive(clap::Args)]
pub struct FindArgs {
    /// Input trace file (any format).
    pub input: PathBuf,
    /// An address (`0x…`), or text looked for in module paths, stack frames (`name
    /// file:line`) and user metadata or annotations (case-insensitive).
    pub query: String,
    /// How many matches to list.
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// Print one JSON object instead of lines.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub import: ImportArgs,
}

/// `collector find`.
pub fn find_command(a: FindArgs) -> anyhow::Result<()> {
    let trace = load_trace(&a.input, &a.import.options())?;
    let found = shared::analysis::search::find(&trace, &a.query, a.limit);
    let mut out = std::io::stdout().lock();
    if a.json {
        let mut found = found;
        found.events.clear();
        serde_json::to_writer_pretty(&mut out, &found)?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(out, "{} allocations match {:?}", found.total, found.query)?;
    for m in &found.matches {
        let by = match m.by {
            shared::analysis::search::MatchedBy::Address => "address",
            shared::analysis::search::MatchedBy::Layer => "layer",
            shared::analysis::search::MatchedBy::Stack => "frame",
            shared::analysis::search::MatchedBy::Note => "note",
        };
        writeln!(
            out,
            "  {:>10} at 0x{:x} on {} at {} in {}  [{by}: {}]",
            shared::units::format_bytes(m.size_bytes),
            m.address,
            m.device,
            shared::units::format_seconds(m.t_s),
            m.layer.as_deref().unwrap_or("—"),
            m.text
        )?;
    }
    if found.total > found.matches.len() {
        writeln!(out, "  … {} more (--limit)", found.total - found.matches.len())?;
    }
    Ok(())
}
