//! `collector convert`: a trace of any format written in another.

use super::ImportArgs;
use shared::export::ExportFormat;
use std::path::PathBuf;
use traceio::files::{load_trace, parse_format, resolve_format, write_atomic, write_export};
use traceio::parquet::Table;

/// `collector convert` options.
#[derive(clap::Args)]
pub struct ConvertArgs {
    /// Input trace file.
    pub input: PathBuf,
    /// Output file; written atomically. With `--format tensorboard`, a TensorBoard log folder
    /// (a training run's, say): a new event file is added to it, nothing there is overwritten.
    #[arg(short, long)]
    pub output: PathBuf,
    /// native, timeline, speedscope, chrome, csv, dftracer (.pfw.gz) or tensorboard. Default:
    /// from the output file name; a `.parquet` file is a table (--table).
    #[arg(long, value_parser = parse_format)]
    pub format: Option<ExportFormat>,
    /// With a `.parquet` output: which table (one row per memory event, layer or operator).
    #[arg(long, value_enum, default_value_t = Table::Events)]
    pub table: Table,
    #[command(flatten)]
    pub import: ImportArgs,
}

/// `collector convert`.
pub fn convert_command(a: ConvertArgs) -> anyhow::Result<()> {
    if a.format.is_none() && a.output.extension().is_some_and(|e| e.eq_ignore_ascii_case("parquet")) {
        let trace = load_trace(&a.input, &a.import.options())?;
        let mut rows = 0;
        let bytes = write_atomic(&a.output, |w| {
            rows = traceio::parquet::write(&trace, a.table, w)?;
            Ok(())
        })?;
        let size = shared::units::format_bytes(bytes);
        eprintln!("wrote {size} (parquet, {rows} rows of {:?}) to {}", a.table, a.output.display());
        return Ok(());
    }
    let format = resolve_format(a.format, &a.output)?;
    let trace = load_trace(&a.input, &a.import.options())?;
    let to_folder = format == ExportFormat::Tensorboard && !a.output.to_string_lossy().ends_with(".tfevents");
    if to_folder {
        let file = traceio::files::write_tensorboard_events(&trace, &a.output)?;
        let iterations = shared::analysis::iterations::per_iteration(&trace).iterations.len();
        eprintln!("wrote {iterations} iterations of memory scalars to {} (tensorboard --logdir {})", file.display(), a.output.display());
        return Ok(());
    }
    let bytes = write_export(&trace, format, &a.output)?;
    let size = shared::units::format_bytes(bytes);
    eprintln!("wrote {size} ({}, {} events) to {}", format.name(), trace.events.len(), a.output.display());
    Ok(())
}
