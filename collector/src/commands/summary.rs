//! `collector summary`: peaks, fragmentation and the top layers of a trace (or `--json`).

use super::ImportArgs;
use anyhow::Context;
use std::path::PathBuf;
use traceio::files::load_trace;
use traceio::text::print_summary;

/// A trace to read and how to print what is found (`summary`, `leaks`).
#[derive(clap::Args)]
pub struct SummaryArgs {
    /// Input trace file (any format).
    pub input: PathBuf,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// How many rows (layers, groups of never-freed allocations) to list.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    #[command(flatten)]
    pub import: ImportArgs,
}

/// `collector summary`.
pub fn summary_command(a: SummaryArgs) -> anyhow::Result<()> {
    let trace = load_trace(&a.input, &a.import.options())?;
    print_summary(&trace, a.top, a.json, std::io::stdout().lock()).context("cannot print the summary")
}
