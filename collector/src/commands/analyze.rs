//! `collector analyze`: the graph profile of a trace as CSV, JSON and charts.

use super::ImportArgs;
use anyhow::Context;
use std::path::PathBuf;
use traceio::files::load_trace;

/// `collector analyze` options.
#[derive(clap::Args)]
pub struct AnalyzeArgs {
    /// Input trace file (native, or a torch.profiler Chrome trace).
    pub input: PathBuf,
    /// Output folder (created if missing).
    #[arg(short, long, default_value = ".")]
    pub output: PathBuf,
    /// File name prefix.
    #[arg(long, default_value = "profiler_stats")]
    pub prefix: String,
    #[command(flatten)]
    pub import: ImportArgs,
}

/// `collector analyze`.
pub fn analyze_command(a: AnalyzeArgs) -> anyhow::Result<()> {
    let mut trace = load_trace(&a.input, &a.import.options())?;
    if trace.meta.model.is_none() {
        // Chart titles name the model; a profiler trace does not, so use the file name.
        trace.meta.model = a.input.file_name().map(|n| n.to_string_lossy().into_owned());
    }
    let analysis =
        traceio::folders::analyze(&trace, &a.output, &a.prefix).with_context(|| format!("cannot analyze {}", a.input.display()))?;
    traceio::folders::print_profile(&analysis.profile, std::io::stdout().lock())?;
    for f in &analysis.files {
        eprintln!("wrote {}", f.display());
    }
    Ok(())
}
