//! `collector advise --verify -- COMMAND`: the advice checked by running it. The program is
//! traced as it is (`--ops all`, for activation liveness), advised, then traced again (the
//! same capture, so iteration times compare) with each top suggestion applied through its
//! flags (`--checkpoint LAYERS`, `--amp`, both), and under the allocator setting it suggests
//! (`PYTORCH_CUDA_ALLOC_CONF`, its reserved peak against `max_memory_reserved()`), and
//! every run's measured peak is set against the peak the advice predicted for it — the
//! baseline / checkpointing / AMP / both table of the memory-profiling exercise.
//!
//! Iteration times are verified like peaks: each run's median over its iterations after the
//! first, with the 10th to 90th percentile and the count; the measured extra time of a
//! configuration is its median less the baseline's, with an uncertainty from both spreads, set
//! against the predicted one (within 25 %, or the table says by how much and how sure it is).
//! Fewer than [`MIN_TIMED`] timed iterations are called too few to time.
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
    /// The 10th and 90th percentiles of those iteration times, seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iteration_p10_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iteration_p90_s: Option<f64>,
    /// How many iterations were timed (after warm-up).
    pub timed_iterations: usize,
    /// This configuration's median less the baseline's, seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured_extra_s: Option<f64>,
    /// The uncertainty of `measured_extra_s` (one standard error, from both runs' spreads).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured_extra_uncertainty_s: Option<f64>,
    /// (predicted − measured) / measured extra time, percent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extra_error_pct: Option<f64>,
    /// What the time comparison says: within 25 %, off by how much, or why it cannot tell.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timing_note: Option<String>,
    /// What the advice predicted for this configuration (the baseline: its own peak).
    pub predicted_peak_bytes: Option<u64>,
    /// The extra time per iteration the advice predicted (checkpointing's recomputation).
    pub predicted_extra_s: Option<f64>,
    /// (measured − predicted) / measured, percent.
    pub error_pct: Option<f64>,
    /// `torch.cuda.max_memory_allocated()` as the program's process reported it (CUDA runs):
    /// the measured peak's check.
    pub pytorch_max_allocated_bytes: Option<u64>,
    /// The `PYTORCH_CUDA_ALLOC_CONF` the run had (an allocator setting's row).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alloc_conf: Option<String>,
    /// The reserved peak the advice predicted (an allocator setting's row).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_reserved_peak_bytes: Option<u64>,
    /// `torch.cuda.max_memory_reserved()` of the run (CUDA runs).
    pub pytorch_max_reserved_bytes: Option<u64>,
    /// (measured − predicted) / measured reserved peak, percent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserved_error_pct: Option<f64>,
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

/// Iterations a time is measured over, at least (after the warm-up one).
pub const MIN_TIMED: usize = 20;

/// A run's iteration times after warm-up.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timing {
    pub median_s: f64,
    pub p10_s: f64,
    pub p90_s: f64,
    pub n: usize,
}

impl Timing {
    /// One standard error of the median: the spread read as a normal one's (p90 − p10 is 2.563
    /// standard deviations), times 1.253 / √n.
    pub fn standard_error_s(&self) -> f64 {
        (self.p90_s - self.p10_s) / 2.563 * 1.253 / (self.n.max(1) as f64).sqrt()
    }
}

/// Iteration times after warm-up (the first iteration is left out when there are more), from
/// the trace's iterations.
pub fn iteration_timing(trace: &Trace) -> Option<Timing> {
    let spans = shared::analysis::iterations::spans(trace).bounds();
    let mut d: Vec<f64> = spans.iter().skip(usize::from(spans.len() > 1)).map(|(s, e)| e.saturating_sub(*s) as f64 / 1e9).collect();
    let median_s = shared::analysis::median_f64(&mut d)?;
    // d is sorted now; nearest-rank percentiles.
    let at = |q: f64| d[((q * d.len() as f64).ceil() as usize).clamp(1, d.len()) - 1];
    Some(Timing { median_s, p10_s: at(0.1), p90_s: at(0.9), n: d.len() })
}

impl VerifyRow {
    /// The run's iteration times, as its fields hold them.
    fn timing(&self) -> Option<Timing> {
        let ((median_s, p10_s), p90_s) = self.iteration_s.zip(self.iteration_p10_s).zip(self.iteration_p90_s)?;
        Some(Timing { median_s, p10_s, p90_s, n: self.timed_iterations })
    }
}

/// Sets each row's measured extra time against the baseline's (the first row) and the
/// predicted one.
fn compare_times(rows: &mut [VerifyRow]) {
    let Some(base) = rows.first().and_then(VerifyRow::timing) else { return };
    for row in rows.iter_mut().skip(1) {
        let Some(t) = row.timing() else { continue };
        let extra = t.median_s - base.median_s;
        let uncertainty = base.standard_error_s().hypot(t.standard_error_s());
        row.measured_extra_s = Some(extra);
        row.measured_extra_uncertainty_s = Some(uncertainty);
        let ms = |s: f64| format!("{:+.1} ms", s * 1e3);
        let measured = format!("{} ± {:.1} ms", ms(extra), uncertainty * 1e3);
        let n = base.n.min(t.n);
        row.timing_note = Some(match row.predicted_extra_s {
            _ if n < MIN_TIMED => format!(
                "{n} timed iterations, too few to verify a time (at least {MIN_TIMED} after warm-up: run {} or more)",
                MIN_TIMED + 1
            ),
            None => format!("measured {measured}; no time was predicted"),
            Some(p) => {
                let error = (extra.abs() > f64::EPSILON).then(|| (p - extra) / extra.abs() * 100.0);
                row.extra_error_pct = error;
                match error {
                    Some(e) if e.abs() <= 25.0 => format!("predicted {}, measured {measured}: within 25 % ({e:+.0} %)", ms(p)),
                    // Off by more than the measurement can tell apart: say so, not a miss.
                    _ if (p - extra).abs() <= 2.0 * uncertainty => {
                        format!(
                            "predicted {}, measured {measured}: within the measurement's uncertainty, which is too wide to verify 25 %",
                            ms(p)
                        )
                    }
                    Some(e) => format!("predicted {}, measured {measured}: off by {e:+.0} % (beyond 25 %)", ms(p)),
                    None => format!("predicted {}, measured {measured}", ms(p)),
                }
            }
        });
    }
}

/// Traces `command` + `flags` into `out` with this collector; the trace, or why there is none.
fn traced(command: &[String], flags: &[String], ops: &str, out: &Path) -> Result<Trace, String> {
    traced_env(command, flags, ops, out, None)
}

/// [`traced`], with the program's `PYTORCH_CUDA_ALLOC_CONF` set to `alloc_conf` when given.
pub(crate) fn traced_env(command: &[String], flags: &[String], ops: &str, out: &Path, alloc_conf: Option<&str>) -> Result<Trace, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the collector: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.args(["trace", "-q", "--ops", ops, "-o"]).arg(out).arg("--").args(command).args(flags);
    if let Some(conf) = alloc_conf {
        cmd.env("PYTORCH_CUDA_ALLOC_CONF", conf);
        // Releases differ on which of the two wins: the setting goes in both.
        if std::env::var_os("PYTORCH_ALLOC_CONF").is_some() {
            cmd.env("PYTORCH_ALLOC_CONF", conf);
        }
    }
    let run = cmd.output().map_err(|e| format!("cannot run the collector: {e}"))?;
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
            let timing = iteration_timing(&t);
            let peak = shared::analysis::summary(&t).peak_allocated_bytes;
            VerifyRow {
                configuration,
                flags,
                peak_allocated_bytes: Some(peak),
                iteration_s: timing.map(|t| t.median_s),
                iteration_p10_s: timing.map(|t| t.p10_s),
                iteration_p90_s: timing.map(|t| t.p90_s),
                timed_iterations: timing.map_or(0, |t| t.n),
                measured_extra_s: None,
                measured_extra_uncertainty_s: None,
                extra_error_pct: None,
                timing_note: None,
                predicted_peak_bytes: predicted,
                predicted_extra_s,
                error_pct: predicted.filter(|_| peak > 0).map(|p| (peak as f64 - p as f64) / peak as f64 * 100.0),
                pytorch_max_allocated_bytes: t.meta.counter(shared::model::Counter::MaxMemoryAllocated),
                alloc_conf: None,
                predicted_reserved_peak_bytes: None,
                pytorch_max_reserved_bytes: t.meta.counter(shared::model::Counter::MaxMemoryReserved),
                reserved_error_pct: None,
                error: None,
                trace,
            }
        }
        Err(e) => VerifyRow {
            configuration,
            flags,
            peak_allocated_bytes: None,
            iteration_s: None,
            iteration_p10_s: None,
            iteration_p90_s: None,
            timed_iterations: 0,
            measured_extra_s: None,
            measured_extra_uncertainty_s: None,
            extra_error_pct: None,
            timing_note: None,
            predicted_peak_bytes: predicted,
            predicted_extra_s,
            error_pct: None,
            pytorch_max_allocated_bytes: None,
            alloc_conf: None,
            predicted_reserved_peak_bytes: None,
            pytorch_max_reserved_bytes: None,
            reserved_error_pct: None,
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
    // The allocator setting, run under it: its reserved peak against `max_memory_reserved()`.
    let setting =
        report.suggestions.iter().find(|s| matches!(s.kind, SuggestionKind::ExpandableSegments | SuggestionKind::AllocatorSetting));
    if let Some(s) = setting {
        let conf = s.change.trim_start_matches("PYTORCH_CUDA_ALLOC_CONF=").to_owned();
        let own = own_alloc_conf();
        let env = if own.is_empty() { conf.clone() } else { format!("{own},{conf}") };
        let path = dir.join(format!("run{}.mtrace.json", rows.len()));
        eprintln!("collector: tracing under PYTORCH_CUDA_ALLOC_CONF={env}");
        let result = traced_env(command, &[], "all", &path, Some(&env));
        let mut r = row(format!("PYTORCH_CUDA_ALLOC_CONF={conf}"), Vec::new(), (Some(s.predicted_peak_bytes), None), result, path);
        r.alloc_conf = Some(env);
        r.predicted_reserved_peak_bytes = s.predicted_reserved_peak_bytes;
        r.reserved_error_pct = match (r.pytorch_max_reserved_bytes, s.predicted_reserved_peak_bytes) {
            (Some(m), Some(p)) if m > 0 => Some((m as f64 - p as f64) / m as f64 * 100.0),
            _ => None,
        };
        rows.push(r);
    }
    compare_times(&mut rows);
    Ok(Verification { command: command.to_vec(), advice: report, rows })
}

/// The table: configuration | peak allocated | iteration time (median, 10th–90th percentile,
/// iterations timed) | predicted peak | error | predicted and measured extra time, then what
/// each time comparison says.
pub fn print(v: &Verification, mut out: impl std::io::Write) -> std::io::Result<()> {
    use shared::units::format_bytes;
    writeln!(out, "Verified advice for: {}", v.command.join(" "))?;
    writeln!(out, "| configuration | peak allocated | iteration time (p10–p90, n) | predicted peak | error | predicted extra time | measured extra time |")?;
    writeln!(out, "|---|---|---|---|---|---|---|")?;
    for r in &v.rows {
        let peak = r.peak_allocated_bytes.map_or_else(|| "failed".into(), format_bytes);
        let it = match (r.iteration_s, r.iteration_p10_s, r.iteration_p90_s) {
            (Some(m), Some(a), Some(b)) => format!("{:.1} ms ({:.1}–{:.1}, {})", m * 1e3, a * 1e3, b * 1e3, r.timed_iterations),
            _ => "-".into(),
        };
        let pred = r.predicted_peak_bytes.map_or_else(|| "-".into(), format_bytes);
        let err = r.error_pct.map_or_else(|| "-".into(), |e| format!("{e:+.1} %"));
        let extra = r.predicted_extra_s.map_or_else(|| "-".into(), |s| format!("+{:.1} ms", s * 1e3));
        let measured = match (r.measured_extra_s, r.measured_extra_uncertainty_s) {
            (Some(m), Some(u)) => format!("{:+.1} ± {:.1} ms", m * 1e3, u * 1e3),
            _ => "-".into(),
        };
        writeln!(out, "| {} | {peak} | {it} | {pred} | {err} | {extra} | {measured} |", r.configuration)?;
    }
    for r in v.rows.iter().filter(|r| r.timing_note.is_some()) {
        writeln!(out, "{} time: {}", r.configuration, r.timing_note.as_deref().unwrap_or(""))?;
    }
    for r in v.rows.iter().filter(|r| r.predicted_reserved_peak_bytes.is_some()) {
        let measured = r.pytorch_max_reserved_bytes.map_or_else(|| "not measured".into(), shared::units::format_bytes);
        let err = r.reserved_error_pct.map_or_else(String::new, |e| format!(" ({e:+.1} %)"));
        writeln!(
            out,
            "{}: reserved peak predicted {}, max_memory_reserved() {measured}{err}",
            r.configuration,
            shared::units::format_bytes(r.predicted_reserved_peak_bytes.unwrap_or(0))
        )?;
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

/// The caller's own allocator setting, which a row's setting is appended to (PyTorch reads the
/// keys left to right, the last one winning).
pub fn own_alloc_conf() -> String {
    std::env::var("PYTORCH_CUDA_ALLOC_CONF").or_else(|_| std::env::var("PYTORCH_ALLOC_CONF")).unwrap_or_default()
}
