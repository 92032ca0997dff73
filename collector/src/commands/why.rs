//! `collector why`: who holds the live bytes at a moment (the peak, the out-of-memory, a mark,
//! a time), largest first.

use super::ImportArgs;
use anyhow::Context;
use shared::analysis::holders::{device_named, why_with, Moment};
use std::path::PathBuf;
use traceio::files::load_trace;

/// A trace and the moment to look at (`why`).
#[derive(clap::Args)]
pub struct WhyArgs {
    /// Input trace file (any format; `collector trace --holders` records the holders, other
    /// traces get them inferred).
    pub input: PathBuf,
    /// When: `peak` (default), `oom`, a mark's name (`NAME#K` for its K-th occurrence) or
    /// seconds since the trace's start.
    #[arg(long, default_value = "peak", value_name = "WHEN")]
    pub at: String,
    /// The device (`cuda:0`, `cpu`; default: the one the moment is on, else the one whose
    /// memory peaks highest).
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<String>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Each module on its own line: no folding of repeated layers into `layers.{0..11}`.
    #[arg(long)]
    pub no_fold: bool,
    /// How many holders to list (all with --json).
    #[arg(long, default_value_t = 15)]
    pub top: usize,
    #[command(flatten)]
    pub import: ImportArgs,
}

/// `collector why`.
pub fn why_command(a: WhyArgs) -> anyhow::Result<()> {
    let moment = Moment::parse(&a.at).map_err(|e| anyhow::anyhow!("--at {}: {e}", a.at))?;
    let trace = load_trace(&a.input, &a.import.options())?;
    let device = a.device.as_deref().map(|d| device_named(&trace, d)).transpose()?;
    // Folded indices (`blocks.{0..2}`) are for a reader: the JSON names every module in full.
    let w = why_with(&trace, &moment, device, !a.no_fold && !a.json).with_context(|| format!("--at {}", a.at))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&w)?);
    } else {
        traceio::text::print_why(&w, a.top, std::io::stdout().lock())?;
    }
    Ok(())
}
