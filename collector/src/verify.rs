//! `collector advise --verify -- COMMAND`: the advice checked by running it. The program is
//! traced as it is (`--ops all`, for activation liveness), advised, then traced again (the
//! same capture, so iteration times compare) with each top suggestion applied through its
//! flags (`--checkpoint LAYERS`, `--amp`, both), and
//! every run's measured peak is set against the peak the advice predicted for it — the
//! baseline / checkpointing / AMP / both table of the memory-profiling exercise.
//!
//! Programs opt in by taking those two flags (`python -m memory_tracer.zoo` does, for the
//! built-in models). Each run is a `collector trace` child process, so a run that fails (out
//! of memory, a flag the program lacks) is a row that says so, not the end of the table.

use anyhow::Context;
use serde::Serialize;
use shared::analysis::advice::{self, AdviceOptions, AdviceReport, SuggestionKind};
use shared::Trace;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One configuration's run.
#[derive(Clone, Debug, Serialize)]
pub struct VerifyRow {
    /// `baseline`, `checkpoint layer3,layer4`, `amp`, `checkpoint layer3,layer4 + amp`.
    pub configuration: String,
    /// The flags added to the command.
    pub flags: Vec<String>,
    /// Measured peak allocated bytes; `None` when the run failed (see `error`).
    pub peak_allocated_bytes: Option<u64>,
    /// Median iteration time after the first (warm-up) iteration, seconds.
    pub iteration_s: Option<f64>,
    /// What the advice predicted for this configuration (the baseline: its own peak).
    pub predicted_peak_bytes: Option<u64>,
    /// The extra time per iteration the advice predicted (checkpointing's recomputation).
    pub predicted_extra_s: Option<f64>,
    /// (measured − predicted) / measured, percent.
    pub error_pct: Option<f64>,
    /// `torch.cuda.max_memory_allocated()` as the program's process reported it (CUDA runs):
    /// the measured peak's check.
    pub pytorch_max_allocated_bytes: Option<u64>,
    /// Why the run has no numbers.
    pub error: Option<String>,
    /// The run's trace.
    pub trace: PathBuf,
}

/// The whole verification: the advice on the baseline and the runs.
#[derive(Clone, Debug, Serialize)]
pub struct Verification {
    pub command: Vec<String>,
    pub advice: AdviceReport,
    pub rows: Vec<VerifyRow>,
}

/// Median iteration time after warm-up, from the trace's iterations.
pub fn iteration_seconds(trace: &Trace) -> Option<f64> {
    let spans = shared::analysis::leaks::iteration_spans(trace).0;
    let mut d: Vec<f64> = spans.iter().skip(usize::from(spans.len() > 1)).map(|(s, e)| e.saturating_sub(*s) as f64 / 1e9).collect();
    shared::analysis::median_f64(&mut d)
}

/// Traces `command` + `flags` into `out` with this collector; the trace, or why there is none.
fn traced(command: &[String], flags: &[String], ops: &str, out: &Path) -> Result<Trace, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the collector: {e}"))?;
    let run = Command::new(exe)
        .args(["trace", "-q", "--ops", ops, "-o"])
        .arg(out)
        .arg("--")
        .args(command)
        .args(flags)
        .output()
        .map_err(|e| format!("cannot run the collector: {e}"))?;
    let tail = || String::from_utf8_lossy(&run.stderr).lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").to_owned();
    if !run.status.success() {
        let code = run.status.code().map_or_else(|| "a signal".into(), |c| format!("exit {c}"));
        return Err(format!("the run failed ({code}): {}", tail()));
    }
    traceio::files::load_trace(out, &shared::ImportOptions::default()).map_err(|e| format!("{e:#}"))
}

fn row(
    configuration: String,
    flags: Vec<String>,
    predicted: (Option<u64>, Option<f64>),
    result: Result<Trace, String>,
    trace: PathBuf,
) -> VerifyRow {
    let (predicted, predicted_extra_s) = predicted;
    match result {
        Ok(t) => {
            let peak = shared::analysis::summary(&t).peak_allocated_bytes;
            VerifyRow {
                configuration,
                flags,
                peak_allocated_bytes: Some(peak),
                iteration_s: iteration_seconds(&t),
                predicted_peak_bytes: predicted,
                predicted_extra_s,
                error_pct: predicted.filter(|_| peak > 0).map(|p| (peak as f64 - p as f64) / peak as f64 * 100.0),
                pytorch_max_allocated_bytes: t.meta.reported.get("cuda.max_memory_allocated").copied(),
                error: None,
                trace,
            }
        }
        Err(e) => VerifyRow {
            configuration,
            flags,
            peak_allocated_bytes: None,
            iteration_s: None,
            predicted_peak_bytes: predicted,
            predicted_extra_s,
            error_pct: None,
            pytorch_max_allocated_bytes: None,
            error: Some(e),
            trace,
        },
    }
}

/// Runs the baseline, advises, and runs the top checkpointing and AMP suggestions and both.
pub fn verify(command: &[String], opts: &AdviceOptions, dir: &Path) -> anyhow::Result<Verification> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let base_path = dir.join("baseline.mtrace.json");
    eprintln!("collector: tracing the baseline: {}", command.join(" "));
    let base = traced(command, &[], "all", &base_path).map_err(|e| anyhow::anyhow!("the baseline run: {e}"))?;
    let report = advice::advise(&base, opts);
    let checkpoint = report.suggestions.iter().find(|s| s.kind == SuggestionKind::Checkpoint && !s.layers.is_empty());
    let amp = report.suggestions.iter().find(|s| s.kind == SuggestionKind::Amp);
    // Both at once, predicted on the baseline before it becomes the first row.
    let both = match (checkpoint, amp) {
        (Some(c), Some(_)) => Some((c, advice::predict_peak(&base, &c.layers, true))),
        _ => None,
    };
    let mut rows = vec![row("baseline".into(), Vec::new(), (Some(report.baseline.peak_allocated_bytes), Some(0.0)), Ok(base), base_path)];

    // (label, flags, (predicted peak, predicted extra seconds per iteration))
    type Config = (String, Vec<String>, (Option<u64>, Option<f64>));
    let mut configs: Vec<Config> = Vec::new();
    if let Some(c) = checkpoint {
        let flags = vec!["--checkpoint".into(), c.layers.join(",")];
        configs.push((format!("checkpoint {}", c.layers.join(",")), flags, (Some(c.predicted_peak_bytes), c.extra_time_per_iteration_s)));
    }
    if let Some(a) = amp {
        configs.push(("amp".into(), vec!["--amp".into()], (Some(a.predicted_peak_bytes), a.extra_time_per_iteration_s)));
    }
    if let Some((c, both)) = both {
        let flags = vec!["--checkpoint".into(), c.layers.join(","), "--amp".into()];
        configs.push((format!("checkpoint {} + amp", c.layers.join(",")), flags, (both, None)));
    }
    for (k, (name, flags, predicted)) in configs.into_iter().enumerate() {
        let path = dir.join(format!("run{}.mtrace.json", k + 1));
        eprintln!("collector: tracing {name}");
        // The same capture as the baseline's, so that iteration times compare.
        let result = traced(command, &flags, "all", &path);
        rows.push(row(name, flags, predicted, result, path));
    }
    Ok(Verification { command: command.to_vec(), advice: report, rows })
}

/// The table: configuration | peak allocated | iteration time | predicted peak | error, and
/// the predicted extra time where the advice made one.
pub fn print(v: &Verification, mut out: impl std::io::Write) -> std::io::Result<()> {
    use shared::units::format_bytes;
    writeln!(out, "Verified advice for: {}", v.command.join(" "))?;
    writeln!(out, "| configuration | peak allocated | iteration time | predicted peak | error | predicted extra time |")?;
    writeln!(out, "|---|---|---|---|---|---|")?;
    for r in &v.rows {
        let peak = r.peak_allocated_bytes.map_or_else(|| "failed".into(), format_bytes);
        let it = r.iteration_s.map_or_else(|| "-".into(), |s| format!("{:.1} ms", s * 1e3));
        let pred = r.predicted_peak_bytes.map_or_else(|| "-".into(), format_bytes);
        let err = r.error_pct.map_or_else(|| "-".into(), |e| format!("{e:+.1} %"));
        let extra = r.predicted_extra_s.map_or_else(|| "-".into(), |s| format!("+{:.1} ms", s * 1e3));
        writeln!(out, "| {} | {peak} | {it} | {pred} | {err} | {extra} |", r.configuration)?;
    }
    let checked: Vec<&VerifyRow> = v.rows.iter().filter(|r| r.pytorch_max_allocated_bytes.is_some()).collect();
    if !checked.is_empty() {
        let exact = checked.iter().filter(|r| r.pytorch_max_allocated_bytes == r.peak_allocated_bytes).count();
        writeln!(out, "measured peaks equal torch.cuda.max_memory_allocated() in {exact} of {} runs", checked.len())?;
    }
    for r in v.rows.iter().filter(|r| r.error.is_some()) {
        writeln!(out, "{}: {}", r.configuration, r.error.as_deref().unwrap_or(""))?;
    }
    Ok(())
}
