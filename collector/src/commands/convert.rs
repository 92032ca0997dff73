//! `collector convert`: a trace of any format written in another.

use super::ImportArgs;
use shared::export::ExportFormat;
use std::path::PathBuf;
use traceio::files::{load_trace, parse_format, resolve_format, write_export};

/// `collector convert` options.
#[derive(clap::Args)]
pub struct ConvertArgs {
    /// Input trace file.
    pub input: PathBuf,
    /// Output file; written atomically.
    #[arg(short, long)]
    pub output: PathBuf,
    /// native, timeline, speedscope, chrome, csv or dftracer (.pfw.gz). Default: from the output file name.
    #[arg(long, value_parser = parse_format)]
    pub format: Option<ExportFormat>,
    #[command(flatten)]
    pub import: ImportArgs,
}

/// `collector convert`.
pub fn convert_command(a: ConvertArgs) -> anyhow::Result<()> {
    let format = resolve_format(a.format, &a.output)?;
    let trace = load_trace(&a.input, &a.import.options())?;
    let bytes = write_export(&trace, format, &a.output)?;
    let size = shared::units::format_bytes(bytes);
    eprintln!("wrote {size} ({}, {} events) to {}", format.name(), trace.events.len(), a.output.display());
    Ok(())
}
