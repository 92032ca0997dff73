//! `collector check`: a trace held to memory budgets, for CI. Exits 0 when every budget holds
//! and 1 when one does not, with a one-screen report (or `--json`), and, under GitHub Actions
//! (`GITHUB_ACTIONS=true`), an error annotation per failed budget.

use super::{parse_size, ImportArgs};
use shared::analysis::budget::{check, parse_percent, Budget};
use std::path::PathBuf;
use traceio::files::load_trace;

/// `collector check` options.
#[derive(clap::Args)]
pub struct CheckArgs {
    /// The trace to check (any format).
    pub input: PathBuf,
    /// Most peak allocated memory: 6GiB, 512MiB, 1.5GB or bytes.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_peak: Option<u64>,
    /// Most peak reserved memory (what the caching allocator holds).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_reserved: Option<u64>,
    /// Fail on steady growth of allocated memory across iterations (`collector leaks`).
    #[arg(long)]
    pub no_leak: bool,
    /// A trace of the same program before the change, for --max-growth.
    #[arg(long, value_name = "TRACE", requires = "max_growth")]
    pub baseline: Option<PathBuf>,
    /// Most growth of the peak allocated memory over the baseline's: 5% (negative: it must shrink).
    #[arg(long, value_name = "PERCENT", value_parser = parse_percent, requires = "baseline")]
    pub max_growth: Option<f64>,
    /// Print one JSON object instead of the report.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub import: ImportArgs,
}

/// `collector check`: returns whether every budget held (the caller exits 1 when not).
pub fn check_command(a: CheckArgs) -> anyhow::Result<bool> {
    let budget =
        Budget { max_peak_bytes: a.max_peak, max_reserved_bytes: a.max_reserved, no_leak: a.no_leak, max_growth_percent: a.max_growth };
    anyhow::ensure!(
        budget.max_peak_bytes.is_some() || budget.max_reserved_bytes.is_some() || budget.no_leak || budget.max_growth_percent.is_some(),
        "no budget to check; give --max-peak SIZE, --max-reserved SIZE, --no-leak or --baseline TRACE --max-growth PERCENT"
    );
    let options = a.import.options();
    let trace = load_trace(&a.input, &options)?;
    let baseline = a.baseline.as_deref().map(|b| load_trace(b, &options)).transpose()?;
    let report = check(&trace, baseline.as_ref(), &budget);
    let out = std::io::stdout().lock();
    if a.json {
        serde_json::to_writer_pretty(out, &report)?;
        println!();
    } else {
        traceio::text::print_budget(&report, &a.input.display().to_string(), out)?;
    }
    if std::env::var("GITHUB_ACTIONS").is_ok_and(|v| v == "true") {
        traceio::text::print_github_annotations(&report, &a.input.display().to_string(), std::io::stdout().lock())?;
    }
    Ok(report.passed)
}
