//! `collector leaks`: growth across iterations and what is never freed.

use super::summary::SummaryArgs;
use traceio::files::load_trace;

/// A trace to look for leaks in (`leaks`).
#[derive(clap::Args)]
pub struct LeaksArgs {
    #[command(flatten)]
    pub report: SummaryArgs,
    /// Iteration boundaries in seconds since the trace's start (each iteration ends at one),
    /// instead of the trace's iteration marks, optimizer steps or repeating allocations.
    #[arg(long, value_delimiter = ',', value_name = "SECONDS")]
    pub iterations_at: Option<Vec<f64>>,
}

/// `collector leaks`.
pub fn leaks_command(a: LeaksArgs) -> anyhow::Result<()> {
    let SummaryArgs { input, json, top, import } = a.report;
    let trace = load_trace(&input, &import.options())?;
    let opts = shared::analysis::leaks::LeakOptions { top, boundaries_s: a.iterations_at };
    let r = shared::analysis::leaks::leaks_with(&trace, &opts);
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        traceio::text::print_leaks(&r, std::io::stdout().lock())?;
    }
    Ok(())
}
