//! `collector diff`: two traces compared (B against A).

use super::ImportArgs;
use std::path::PathBuf;
use traceio::files::load_trace;

/// Two traces to compare (`diff`).
#[derive(clap::Args)]
pub struct DiffArgs {
    /// Trace A (any format).
    pub a: PathBuf,
    /// Trace B (any format); changes are B - A.
    pub b: PathBuf,
    /// Print one JSON object instead of a table (every layer).
    #[arg(long)]
    pub json: bool,
    /// How many layers and operators to list in the table.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// Device of A to compare (index into its devices, e.g. a rank of a merged trace).
    /// Default: the device with the highest allocated peak.
    #[arg(long)]
    pub device_a: Option<u8>,
    /// Device of B to compare. Default: the device with the highest allocated peak.
    #[arg(long)]
    pub device_b: Option<u8>,
    #[command(flatten)]
    pub import: ImportArgs,
}

/// `collector diff`.
pub fn diff_command(a: DiffArgs) -> anyhow::Result<()> {
    let options = a.import.options();
    let (ta, tb) = (load_trace(&a.a, &options)?, load_trace(&a.b, &options)?);
    let d = shared::analysis::diff::diff_devices(&ta, a.device_a, &tb, a.device_b)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&d)?);
    } else {
        let labels = (a.a.display().to_string(), a.b.display().to_string());
        traceio::text::print_diff(&d, (&labels.0, &labels.1), a.top, std::io::stdout().lock())?;
    }
    Ok(())
}
