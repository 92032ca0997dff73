//! `collector ledger`: the process's device memory by source at a moment (the peak, the end,
//! the out-of-memory, a mark, a time) and each source's peak over the run, from a trace
//! recorded with `collector trace --ledger`.

use super::ImportArgs;
use shared::analysis::ledger::{ledger_at, moment};
use shared::units::format_bytes;
use std::io::Write;
use std::path::PathBuf;
use traceio::files::load_trace;

/// A trace and the moment to read its ledger at (`ledger`).
#[derive(clap::Args)]
pub struct LedgerArgs {
    /// Input trace file, recorded with `collector trace --ledger`.
    pub input: PathBuf,
    /// When: `peak` (default, the allocated peak), `end`, `oom`, a mark's name or seconds since
    /// the trace's start.
    #[arg(long, default_value = "peak", value_name = "WHEN")]
    pub at: String,
    /// The device (`cuda:1`; a merged distributed trace has one per rank; default: the first
    /// CUDA device).
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<String>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub import: ImportArgs,
}

/// `collector ledger`.
pub fn ledger_command(a: LedgerArgs) -> anyhow::Result<()> {
    match print_ledger(a) {
        // `collector ledger ... | head`: the reader went away.
        Err(e) if e.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) => Ok(()),
        r => r,
    }
}

fn print_ledger(a: LedgerArgs) -> anyhow::Result<()> {
    let trace = load_trace(&a.input, &a.import.options())?;
    if trace.ledger.is_empty() {
        anyhow::bail!(
            "{} has no device ledger: record one with `collector trace --ledger -- python ...` (a CUDA program)",
            a.input.display()
        );
    }
    let at = moment(&trace, &a.at).map_err(|e| anyhow::anyhow!("--at {}: {e}", a.at))?;
    let device = a.device.as_deref().map(|d| shared::analysis::holders::device_named(&trace, d)).transpose()?;
    let l = ledger_at(&trace, at, device).ok_or_else(|| anyhow::anyhow!("{} has no CUDA device for a ledger", a.input.display()))?;
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&l)?)?;
        return Ok(());
    }
    writeln!(out, "Device ledger of {} at {} ({:.3} s)", l.device, l.at.what, l.at.ts_s)?;
    writeln!(out, "  {}", l.line())?;
    writeln!(out, "  {:<34} {:>12} {:>12}  detail", "source", "now", "peak")?;
    for s in &l.sources {
        writeln!(out, "  {:<34} {:>12} {:>12}  {}", s.source, format_bytes(s.bytes), format_bytes(s.peak_bytes), s.detail)?;
        for p in &s.parts {
            writeln!(out, "    {:<32} {:>12} {:>12}", p.name, format_bytes(p.bytes), format_bytes(p.peak_bytes))?;
        }
    }
    if let Some(u) = l.unexplained_bytes {
        writeln!(
            out,
            "  {:<34} {:>12} {:>12}  NVML's figure less everything above: what no allocation call showed (kernels loaded later)",
            "unexplained",
            if u < 0 { format!("-{}", format_bytes(u.unsigned_abs())) } else { format_bytes(u as u64) },
            ""
        )?;
    }
    writeln!(out, "  the driver's bytes of PyTorch's segments: {} (beside its reserved figure)", format_bytes(l.pytorch_segments_bytes))?;
    for m in &l.missing {
        writeln!(out, "  note: {m}")?;
    }
    Ok(())
}
