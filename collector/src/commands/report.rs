//! `collector report`: the viewer and a trace as a static folder or one HTML file.

use super::ImportArgs;
use anyhow::Context;
use std::path::PathBuf;
use traceio::files::load_trace;

/// `collector report` options.
#[derive(clap::Args)]
pub struct ReportArgs {
    /// Input trace file (any format the viewer opens).
    pub input: PathBuf,
    /// Output folder; with `--single-file`, the HTML file.
    #[arg(short, long, default_value = "report")]
    pub output: PathBuf,
    /// Write one self-contained HTML file (wasm, worker and trace inlined).
    #[arg(long)]
    pub single_file: bool,
    #[command(flatten)]
    pub import: ImportArgs,
}

/// `collector report`.
pub fn report_command(a: ReportArgs) -> anyhow::Result<()> {
    // Import first: a file the viewer cannot open makes no report.
    let trace = load_trace(&a.input, &a.import.options())?;
    let bytes = std::fs::read(&a.input).with_context(|| format!("cannot read {}", a.input.display()))?;
    let (input, output) = (&a.input, &a.output);
    if a.single_file {
        crate::report::write_single_file(input, &bytes, output)?;
        eprintln!("wrote {} ({} events): open it in a browser", output.display(), trace.events.len());
    } else {
        let files = crate::report::write_folder(input, &bytes, output)?;
        eprintln!(
            "wrote {} files ({} events) to {}: serve the folder from any static host (python3 -m http.server -d {}) and open index.html",
            files.len(),
            trace.events.len(),
            output.display(),
            output.display()
        );
    }
    Ok(())
}
