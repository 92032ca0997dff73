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
    /// Output file; written atomically. With `--format tensorboard`, a TensorBoard log folder
    /// (a training run's, say): a new event file is added to it, nothing there is overwritten.
    #[arg(short, long)]
    pub output: PathBuf,
    /// native, timeline, speedscope, chrome, csv, dftracer (.pfw.gz) or tensorboard. Default:
    /// from the output file name.
    #[arg(long, value_parser = parse_format)]
    pub format: Option<ExportFormat>,
    #[command(flatten)]
    pub import: ImportArgs,
}

/// `collector convert`.
pub fn convert_command(a: ConvertArgs) -> anyhow::Result<()> {
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
