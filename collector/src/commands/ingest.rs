//! `collector ingest` (hidden): one capture stream from an inherited socket, built into a trace (what the
//! Python `memory_tracer.MemoryTracer` API runs).

use std::path::PathBuf;
use traceio::files::write_export;

/// `collector ingest` options.
#[derive(clap::Args)]
pub struct IngestArgs {
    /// The socket's file descriptor.
    #[arg(long)]
    pub fd: i32,
    #[arg(short, long)]
    pub output: PathBuf,
    /// Print layer statistics, peaks per layer, fragmentation and the summary as JSON.
    #[arg(long)]
    pub stats_json: bool,
    /// cpu, cuda or cuda:N: whose memory the trace keeps.
    #[arg(long)]
    pub device: Option<String>,
    #[arg(long)]
    pub no_fragmentation: bool,
}

/// `collector ingest`: one capture stream from an inherited socket, built into a trace.
pub fn ingest_command(a: IngestArgs) -> anyhow::Result<()> {
    let IngestArgs { fd, output, stats_json, device, no_fragmentation } = a;
    let (output, device) = (output.as_path(), device.as_deref());
    use crate::pyrun;
    let opts = pyrun::PyOptions {
        device: device.map(str::parse).transpose().map_err(anyhow::Error::msg)?,
        fragmentation: !no_fragmentation,
        ..pyrun::PyOptions::default()
    };
    let stream = pyrun::ingest_fd(fd)?;
    if let Some(e) = stream.error.as_ref().filter(|_| stream.records.is_empty()) {
        anyhow::bail!("the capture stream broke before any record arrived: {e}");
    }
    let trace = pyrun::build_trace(stream, &opts).map_err(anyhow::Error::msg)?;
    write_export(&trace, shared::export::ExportFormat::Native, output)?;
    if stats_json {
        println!("{}", serde_json::to_string(&protocol::frames::IngestStats::of(&trace, output))?);
    }
    Ok(())
}
