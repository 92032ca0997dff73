//! `collector whatif`: what another `PYTORCH_CUDA_ALLOC_CONF` would do to a run, from its
//! trace (`shared::whatif`), and with `--verify` the program run again under each setting,
//! predicted against PyTorch's own counters.

use super::{parse_size, ImportArgs};
use anyhow::Context;
use serde::Serialize;
use shared::units::format_bytes;
use shared::whatif::{what_if, WhatIfOptions, WhatIfReport};
use std::path::PathBuf;
use traceio::files::load_trace;

#[derive(clap::Args)]
pub struct WhatIfArgs {
    /// The trace to replay (recorded from the program's start). Not with --verify, which
    /// traces the run itself.
    #[arg(required_unless_present = "verify")]
    pub input: Option<PathBuf>,
    /// A setting to try, as PYTORCH_CUDA_ALLOC_CONF takes it (`expandable_segments:True`,
    /// `max_split_size_mb:128,roundup_power2_divisions:[256:1,512:2,>:4]`), applied over the
    /// run's own settings; repeat for several. None: the replay under the run's own settings
    /// alone, held against what was recorded.
    #[arg(long = "alloc-conf", value_name = "CONF")]
    pub alloc_conf: Vec<String>,
    /// The device's memory, for out-of-memory predictions (80GiB, 24GB, bytes). Default: the
    /// trace's own device's, else no limit.
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub device_memory: Option<u64>,
    /// Which device of the trace (`cuda:1`). Default: the one with the highest reserved peak.
    #[arg(long)]
    pub device: Option<String>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub import: ImportArgs,
    /// Prove it: trace the program after `--` as it is, predict every setting from that trace,
    /// then trace it again under each setting and print predicted against measured
    /// (`torch.cuda.max_memory_allocated()` / `max_memory_reserved()`).
    #[arg(long)]
    pub verify: bool,
    /// With --verify: where the runs' traces and whatif-verify.json go.
    #[arg(long, default_value = "whatif-verify")]
    pub out_dir: PathBuf,
    /// With --verify: the program to run (`python train.py ...`).
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// One setting's run under `--verify`.
#[derive(Clone, Debug, Serialize)]
pub struct MeasuredRow {
    pub alloc_conf: String,
    /// What PYTORCH_CUDA_ALLOC_CONF the run had.
    pub env: String,
    pub predicted_allocated_peak_bytes: u64,
    pub predicted_reserved_peak_bytes: u64,
    /// `torch.cuda.max_memory_allocated()` / `max_memory_reserved()` of the run.
    pub measured_allocated_peak_bytes: Option<u64>,
    pub measured_reserved_peak_bytes: Option<u64>,
    pub allocated_error_pct: Option<f64>,
    pub reserved_error_pct: Option<f64>,
    /// For a setting across the expandable divide: the predicted range and whether the
    /// measured reserved peak is in it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub predicted_reserved_range_bytes: Option<[u64; 2]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserved_in_range: Option<bool>,
    /// Why the run has no numbers.
    pub error: Option<String>,
    pub trace: PathBuf,
}

#[derive(Debug, Serialize)]
pub struct Verified {
    pub command: Vec<String>,
    pub prediction: WhatIfReport,
    pub rows: Vec<MeasuredRow>,
}

pub fn whatif_command(a: WhatIfArgs) -> anyhow::Result<()> {
    let opts = WhatIfOptions { settings: a.alloc_conf.clone(), device_memory_bytes: a.device_memory, device: a.device.clone() };
    if !a.verify {
        let input = a.input.as_ref().context("give a trace to replay, or --verify with a program to run")?;
        let trace = load_trace(input, &a.import.options())?;
        let report = what_if(&trace, &opts).with_context(|| format!("cannot replay {}", input.display()))?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print(&report, std::io::stdout().lock())?;
        }
        return Ok(());
    }
    anyhow::ensure!(a.input.is_none(), "--verify traces the program itself: give the program after `--`, not a trace");
    anyhow::ensure!(!a.command.is_empty(), "--verify needs the program to run after `--` (`-- python train.py`)");
    // Every setting is read before anything runs.
    shared::whatif::parse_settings(&opts.settings)?;
    let v = verify(&a.command, &opts, &a.out_dir)?;
    std::fs::write(a.out_dir.join("whatif-verify.json"), serde_json::to_vec_pretty(&v)?).context("cannot write whatif-verify.json")?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print(&v.prediction, std::io::stdout().lock())?;
        println!();
        print_verified(&v, std::io::stdout().lock())?;
    }
    Ok(())
}

/// The baseline traced as it is, the prediction from its trace, then one traced run per
/// setting (its PYTORCH_CUDA_ALLOC_CONF: the setting after the caller's own, which it
/// overrides key by key as PyTorch reads them left to right).
fn verify(command: &[String], opts: &WhatIfOptions, dir: &std::path::Path) -> anyhow::Result<Verified> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let own = crate::verify::own_alloc_conf();
    let base_path = dir.join("baseline.mtrace.json");
    eprintln!("collector: tracing the baseline: {}", command.join(" "));
    let base = crate::verify::traced_env(command, &[], "none", &base_path, None).map_err(|e| anyhow::anyhow!("the baseline run: {e}"))?;
    let prediction = what_if(&base, opts).context("cannot replay the baseline's trace")?;
    let mut rows = vec![measured(String::new(), own.clone(), &prediction, 0, Ok(base), base_path)];
    for (k, setting) in opts.settings.iter().enumerate() {
        let env = if own.is_empty() { setting.clone() } else { format!("{own},{setting}") };
        let path = dir.join(format!("setting{}.mtrace.json", k + 1));
        eprintln!("collector: tracing under PYTORCH_CUDA_ALLOC_CONF={env}");
        let result = crate::verify::traced_env(command, &[], "none", &path, Some(&env));
        rows.push(measured(setting.clone(), env, &prediction, k + 1, result, path));
    }
    Ok(Verified { command: command.to_vec(), prediction, rows })
}

fn measured(
    alloc_conf: String,
    env: String,
    prediction: &WhatIfReport,
    k: usize,
    run: Result<shared::Trace, String>,
    trace: PathBuf,
) -> MeasuredRow {
    let p = &prediction.settings[k];
    let error =
        |measured: Option<u64>, predicted: u64| measured.filter(|&m| m > 0).map(|m| (predicted as f64 - m as f64) / m as f64 * 100.0);
    let (allocated, reserved, error_text) = match &run {
        Ok(t) => {
            (t.meta.counter(shared::model::Counter::MaxMemoryAllocated), t.meta.counter(shared::model::Counter::MaxMemoryReserved), None)
        }
        Err(e) => (None, None, Some(e.clone())),
    };
    let error_text = error_text
        .or_else(|| (allocated.is_none() && run.is_ok()).then(|| "the run reported no CUDA counters (did it use a GPU?)".to_owned()));
    MeasuredRow {
        alloc_conf,
        env,
        predicted_allocated_peak_bytes: p.allocated_peak_bytes,
        predicted_reserved_peak_bytes: p.reserved_peak_bytes,
        measured_allocated_peak_bytes: allocated,
        measured_reserved_peak_bytes: reserved,
        allocated_error_pct: error(allocated, p.allocated_peak_bytes),
        reserved_error_pct: error(reserved, p.reserved_peak_bytes),
        predicted_reserved_range_bytes: p.reserved_peak_range_bytes,
        reserved_in_range: p.reserved_peak_range_bytes.zip(reserved).map(|([lo, hi], m)| (lo..=hi).contains(&m)),
        error: error_text,
        trace,
    }
}

fn label(setting: &str) -> &str {
    if setting.is_empty() {
        "(the run's own)"
    } else {
        setting
    }
}

/// The prediction: one row per setting.
pub fn print(r: &WhatIfReport, mut out: impl std::io::Write) -> std::io::Result<()> {
    let own =
        if r.own_settings_known { format!("recorded under {}", r.own_description) } else { format!("recorded with {}", r.own_description) };
    let capacity =
        r.device_memory_bytes.map_or_else(|| "no device memory limit".to_owned(), |b| format!("{} of device memory", format_bytes(b)));
    let reserved = r.recorded.reserved_peak_bytes.map_or_else(|| "unknown".into(), format_bytes);
    writeln!(
        out,
        "Allocator what-if on {}, {own}: peaks {} allocated, {reserved} reserved; {capacity}.",
        r.device,
        format_bytes(r.recorded.allocated_peak_bytes)
    )?;
    match (r.recorded.replay_exact, r.recorded.first_divergence_s) {
        (Some(true), _) => writeln!(out, "The replay under the run's own settings gives every recorded reserved total to the byte.")?,
        (Some(false), Some(t)) => writeln!(
            out,
            "The replay under the run's own settings leaves the recorded reserved curve at {t:.3} s: predictions are approximate."
        )?,
        _ => writeln!(out, "The trace records no reserved memory to check the replay against.")?,
    }
    writeln!(out, "| setting | allocated peak | reserved peak | change | cache at the peak | segments | out of memory |")?;
    writeln!(out, "|---|---|---|---|---|---|---|")?;
    for s in &r.settings {
        let oom = match &s.oom {
            None => "no".to_owned(),
            Some(o) => format!(
                "at {:.3} s in {} ({}), a {} request{}",
                o.at_s,
                o.module.as_deref().unwrap_or("no module"),
                o.phase.as_str(),
                format_bytes(o.request_bytes),
                if o.recorded { ", as recorded" } else { "" }
            ),
        };
        let reserved = match s.reserved_peak_range_bytes {
            Some([lo, hi]) if lo != hi => format!("{} ({} to {})", format_bytes(s.reserved_peak_bytes), format_bytes(lo), format_bytes(hi)),
            _ => format_bytes(s.reserved_peak_bytes),
        };
        writeln!(
            out,
            "| {} | {} | {reserved} | {:+.1} % | {} | {} | {oom} |",
            label(&s.alloc_conf),
            format_bytes(s.allocated_peak_bytes),
            s.reserved_change_pct,
            format_bytes(s.reserved_unallocated_at_peak_bytes),
            s.segments_at_peak
        )?;
    }
    if r.settings.iter().any(|s| s.reserved_peak_range_bytes.is_some()) {
        writeln!(
            out,
            "Settings across the expandable divide give a range: the recorded run's segment addresses do not say where the driver would put the other regime's, and they decide ties between equal free blocks."
        )?;
    }
    for s in r.settings.iter().filter(|s| !s.not_modelled.is_empty()) {
        writeln!(out, "{}: {} change no placement and are not modelled", label(&s.alloc_conf), s.not_modelled.join(", "))?;
    }
    for n in &r.notes {
        writeln!(out, "note: {n}")?;
    }
    Ok(())
}

/// Predicted against measured.
fn print_verified(v: &Verified, mut out: impl std::io::Write) -> std::io::Result<()> {
    writeln!(out, "Verified for: {}", v.command.join(" "))?;
    writeln!(out, "| PYTORCH_CUDA_ALLOC_CONF | allocated: predicted / max_memory_allocated() | error | reserved: predicted / max_memory_reserved() | error |")?;
    writeln!(out, "|---|---|---|---|---|")?;
    let pct = |e: Option<f64>| e.map_or_else(|| "-".into(), |e| format!("{e:+.2} %"));
    let bytes = |b: Option<u64>| b.map_or_else(|| "failed".into(), format_bytes);
    for r in &v.rows {
        let name = if r.env.is_empty() { "(unset)" } else { r.env.as_str() };
        let range = match (r.predicted_reserved_range_bytes, r.reserved_in_range) {
            (Some([lo, hi]), Some(within)) => {
                format!(
                    " (range {} to {}, {})",
                    format_bytes(lo),
                    format_bytes(hi),
                    if within { "measured in it" } else { "measured outside it" }
                )
            }
            _ => String::new(),
        };
        writeln!(
            out,
            "| {name} | {} / {} | {} | {} / {} | {}{range} |",
            format_bytes(r.predicted_allocated_peak_bytes),
            bytes(r.measured_allocated_peak_bytes),
            pct(r.allocated_error_pct),
            format_bytes(r.predicted_reserved_peak_bytes),
            bytes(r.measured_reserved_peak_bytes),
            pct(r.reserved_error_pct)
        )?;
    }
    for r in v.rows.iter().filter(|r| r.error.is_some()) {
        writeln!(out, "{}: {}", label(&r.alloc_conf), r.error.as_deref().unwrap_or(""))?;
    }
    Ok(())
}
