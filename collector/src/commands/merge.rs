//! `collector merge`: one trace per rank merged into one, clocks aligned.

use super::ImportArgs;
use shared::export::ExportFormat;
use shared::ranks::merge::{merge_with, InputRank, MergeInput, MergeOptions};
use std::path::PathBuf;
use traceio::files::{load_trace, parse_format, resolve_format, write_export};
use traceio::text::print_summary;

/// `collector merge` options.
#[derive(clap::Args)]
pub struct MergeArgs {
    /// The traces, one per rank (a merged trace brings each of its ranks).
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// Output file; written atomically.
    #[arg(short, long)]
    pub output: PathBuf,
    /// The inputs' ranks, in order. Default: the rank a traced process recorded (RANK),
    /// else `rank<N>` in the file name, else the input's position. A merged input keeps its
    /// ranks.
    #[arg(long, value_delimiter = ',')]
    pub ranks: Option<Vec<u32>>,
    /// Merge inputs recorded far apart in time (more than a minute and than the longest
    /// input), which are otherwise refused as traces of different runs.
    #[arg(long)]
    pub allow_disjoint: bool,
    /// native, timeline, speedscope, chrome, csv or dftracer (.pfw.gz). Default: from the output file name.
    #[arg(long, value_parser = parse_format)]
    pub format: Option<ExportFormat>,
    #[command(flatten)]
    pub import: ImportArgs,
}

/// `collector merge`.
pub fn merge_command(a: MergeArgs) -> anyhow::Result<()> {
    let format = resolve_format(a.format, &a.output)?;
    if let Some(r) = a.ranks.as_ref().filter(|r| r.len() != a.inputs.len()) {
        anyhow::bail!("--ranks gives {} ranks for {} inputs; expected one per input", r.len(), a.inputs.len());
    }
    let mut merge_inputs = Vec::new();
    for (k, path) in a.inputs.iter().enumerate() {
        let trace = load_trace(path, &a.import.options())?;
        let rank = match &a.ranks {
            Some(r) => InputRank::Given(r[k]),
            None => InputRank::NamedOr(k as u32),
        };
        merge_inputs.extend(MergeInput::of(trace, &path.display().to_string(), rank)?);
    }
    let ranks = merge_inputs.len();
    let opts = MergeOptions { allow_disjoint: a.allow_disjoint, ..Default::default() };
    let merged = merge_with(merge_inputs, &opts)?;
    let bytes = write_export(&merged, format, &a.output)?;
    print_summary(&merged, 5, false, std::io::stderr().lock())?;
    eprintln!(
        "wrote {} ({}, {} ranks, {} events) to {}",
        shared::units::format_bytes(bytes),
        format.name(),
        ranks,
        merged.events.len(),
        a.output.display()
    );
    Ok(())
}
