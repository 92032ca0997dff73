//! `collector analyze` (the graph profile of one trace as CSV, JSON and charts) and the files
//! of a batch sweep (CSV, JSON and charts). The numbers come from `shared`; this module only
//! writes them.

use crate::files::write_atomic;
use crate::plots::{self, LineChart, Series};
use anyhow::Context;
use shared::analysis::profile::{graph_profile, GraphProfile, IterationRole};
use shared::analysis::sweep::{SweepReport, SweepStatus};
use shared::export::profile::{write_activation_stats, write_memory_breakdown, write_node_stats};
use shared::units::{format_bytes, format_seconds};
use shared::{Phase, Trace};
use std::io::Write;
use std::path::{Path, PathBuf};

/// What `analyze` computed and wrote.
#[derive(Debug)]
pub struct Analysis {
    pub profile: GraphProfile,
    pub files: Vec<PathBuf>,
}

/// Computes the graph profile of `trace` and writes into `dir`:
/// `<prefix>_node_stats.csv`, `<prefix>_warmup_node_stats.csv` (with two or more iterations),
/// `<prefix>_activation_stats.csv` and `<prefix>_memory_breakdown.csv` (where the source lets
/// tensors be classified), `<prefix>_profile.json`, and the charts
/// `<prefix>_memory_vs_rank.{png,svg}` and `<prefix>_memory_breakdown.{png,svg}`.
pub fn analyze(trace: &Trace, dir: &Path, prefix: &str) -> anyhow::Result<Analysis> {
    let profile = graph_profile(trace)?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create the output folder {}", dir.display()))?;
    let path = |name: &str| dir.join(format!("{prefix}_{name}"));
    let mut files = Vec::new();
    let mut write_file = |name: &str, write: &dyn Fn(&mut dyn Write) -> anyhow::Result<()>| -> anyhow::Result<()> {
        let p = path(name);
        write_atomic(&p, |w| write(w))?;
        files.push(p);
        Ok(())
    };
    write_file("node_stats.csv", &|w| Ok(write_node_stats(&profile.nodes, w)?))?;
    if !profile.warmup_nodes.is_empty() {
        write_file("warmup_node_stats.csv", &|w| Ok(write_node_stats(&profile.warmup_nodes, w)?))?;
    }
    if profile.not_derivable.is_empty() {
        write_file("activation_stats.csv", &|w| Ok(write_activation_stats(&profile.activations, w)?))?;
        write_file("memory_breakdown.csv", &|w| Ok(write_memory_breakdown(&profile.breakdown, w)?))?;
    }
    write_file("profile.json", &|w| Ok(serde_json::to_writer_pretty(w, &profile)?))?;

    let name = trace.meta.model.as_deref().unwrap_or("trace");
    let batch = trace.meta.batch_size.map(|b| format!(", batch {b}")).unwrap_or_default();
    let title = format!("{name}{batch}: memory per operator rank (iteration {})", profile.reference_iteration);
    files.extend(plots::memory_vs_rank(&profile, &title).write(&path("memory_vs_rank"))?);
    if !profile.breakdown.is_empty() {
        let gtypes: Vec<Phase> = profile.nodes.iter().map(|n| n.gtype).collect();
        let title = format!("{name}{batch}: allocated memory by tensor class (iteration {})", profile.reference_iteration);
        files.extend(plots::breakdown(&profile.breakdown, &gtypes, &title, &path("memory_breakdown"))?);
    }
    Ok(Analysis { profile, files })
}

/// A short account of a profile for the terminal.
pub fn print_profile(p: &GraphProfile, mut out: impl Write) -> std::io::Result<()> {
    let steady: Vec<u32> = p.iterations.iter().filter(|i| i.role == IterationRole::Steady).map(|i| i.index).collect();
    writeln!(out, "device {}; {} nodes per iteration; medians over iterations {:?}", p.device, p.nodes.len(), steady)?;
    for i in &p.iterations {
        writeln!(
            out,
            "  iteration {:>3} {:<8} {:>6} nodes  {:>10}  peak {}",
            i.index,
            match i.role {
                IterationRole::Warmup => "warm-up",
                IterationRole::Steady => "steady",
                IterationRole::Excluded => "excluded",
            },
            i.nodes,
            format_seconds(i.duration_s),
            format_bytes(i.peak_allocated_bytes)
        )?;
    }
    let s = &p.sections;
    let fmt = |r: Option<usize>| r.map_or_else(|| "-".to_owned(), |r| r.to_string());
    writeln!(
        out,
        "sections: forward from rank {}, backward from rank {}, optimizer ranks {}..{}",
        fmt(s.forward_start_rank),
        fmt(s.backward_start_rank),
        fmt(s.optimizer_start_rank),
        fmt(s.optimizer_end_rank)
    )?;
    if let Some(n) = p.nodes.get(p.peak_rank) {
        writeln!(
            out,
            "peak {} at rank {} ({} in {}, {})",
            format_bytes(p.peak_bytes),
            p.peak_rank,
            n.node_name,
            n.layer,
            n.gtype.as_str()
        )?;
    }
    if let Some(b) = p.breakdown.get(p.peak_rank) {
        writeln!(
            out,
            "at the peak: weights {}, gradients {}, optimizer state {}, activations {}, other {}",
            format_bytes(b.weights),
            format_bytes(b.gradients),
            format_bytes(b.optimizer_state),
            format_bytes(b.activations),
            format_bytes(b.other)
        )?;
    }
    if !p.activations.is_empty() {
        let total: u64 = p.activations.iter().map(|a| a.median_mem_size_bytes).sum();
        writeln!(out, "{} activations kept for backward, {} in all", p.activations.len(), format_bytes(total))?;
    }
    for n in &p.not_derivable {
        writeln!(out, "not derivable from this source: {n}")?;
    }
    for w in &p.warnings {
        writeln!(out, "warning: {w}")?;
    }
    Ok(())
}

pub const SWEEP_HEADER: &str =
    "batch_size,status,peak_allocated_bytes,peak_reserved_bytes,pytorch_max_allocated_bytes,median_iteration_s,samples_per_s,error";
pub const SWEEP_CURVES_HEADER: &str = "batch_size,rank,gtype,allocated_bytes,peak_bytes";

/// Writes `sweep.json`, `sweep.csv`, `sweep_memory_vs_rank.csv` and the charts
/// `sweep_peak_vs_batch`, `sweep_latency_vs_batch` and `sweep_memory_vs_rank` (PNG and SVG).
/// Numeric cells of a failed run are left empty: there is no number to report.
pub fn write_sweep(report: &SweepReport, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    use shared::export::csv::{field, write_rows};
    let mut files = Vec::new();
    let p = dir.join("sweep.json");
    write_atomic(&p, |w| Ok(serde_json::to_writer_pretty(w, report)?))?;
    files.push(p);
    let p = dir.join("sweep.csv");
    write_atomic(&p, |w| {
        let opt = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_default();
        Ok(write_rows(w, SWEEP_HEADER, &report.runs, |w, r| {
            let lat = r.median_iteration_s.filter(|s| *s > 0.0);
            write!(
                w,
                "{},{},{},{},{},{},{},{}",
                r.batch_size,
                r.status.as_str(),
                opt(r.peak_allocated_bytes),
                opt(r.peak_reserved_bytes),
                opt(r.pytorch_max_allocated_bytes),
                lat.map(|s| format!("{s:.6}")).unwrap_or_default(),
                lat.map(|s| format!("{:.3}", r.batch_size as f64 / s)).unwrap_or_default(),
                field(r.error.as_deref().unwrap_or(""))
            )
        })?)
    })?;
    files.push(p);
    let p = dir.join("sweep_memory_vs_rank.csv");
    write_atomic(&p, |w| {
        let points = report.runs.iter().flat_map(|r| r.curve.iter().map(move |c| (r.batch_size, c)));
        Ok(write_rows(w, SWEEP_CURVES_HEADER, points, |w, (batch, c)| {
            write!(w, "{},{},{},{},{}", batch, c.rank, c.gtype.as_str(), c.allocated_bytes, c.peak_bytes)
        })?)
    })?;
    files.push(p);

    let ok = || report.runs.iter().filter(|r| r.status == SweepStatus::Ok);
    let failed: Vec<(f64, String)> = report
        .runs
        .iter()
        .filter(|r| r.status != SweepStatus::Ok)
        .map(|r| (r.batch_size as f64, if r.status == SweepStatus::OutOfMemory { "OOM".to_owned() } else { "failed".to_owned() }))
        .collect();
    let title = |what: &str| format!("{} ({}, {}): {what}", report.model, report.mode, report.device);
    let peak = LineChart {
        title: title("peak memory vs batch size"),
        x_label: "batch size",
        series: [
            Series {
                name: "peak allocated".into(),
                points: ok().filter_map(|r| Some((r.batch_size as f64, r.peak_allocated_bytes?))).collect(),
            },
            Series {
                name: "peak reserved".into(),
                points: ok().filter_map(|r| Some((r.batch_size as f64, r.peak_reserved_bytes?))).collect(),
            },
        ]
        .into_iter()
        // CPU runs have no reserved memory to show.
        .filter(|s| s.points.iter().any(|p| p.1 > 0))
        .collect(),
        bands: Vec::new(),
        marker: None,
        dots: true,
        failed: failed.clone(),
        log2_x: true,
    };
    files.extend(peak.write(&dir.join("sweep_peak_vs_batch"))?);
    files.extend(latency_chart(report, &title("iteration time vs batch size"), &failed, &dir.join("sweep_latency_vs_batch"))?);
    let curves = LineChart {
        title: title("memory per operator rank, by batch size"),
        x_label: "operator rank",
        series: ok()
            .map(|r| Series {
                name: format!("batch {} (peak during op)", r.batch_size),
                points: r.curve.iter().map(|c| (f64::from(c.rank), c.peak_bytes)).collect(),
            })
            .collect(),
        bands: Vec::new(),
        marker: None,
        dots: false,
        failed: Vec::new(),
        log2_x: false,
    };
    files.extend(curves.write(&dir.join("sweep_memory_vs_rank"))?);
    Ok(files)
}

/// Latency is in seconds, not bytes, so it gets its own small chart.
fn latency_chart(report: &SweepReport, title: &str, failed: &[(f64, String)], stem: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let pts: Vec<(f64, f64)> = report.runs.iter().filter_map(|r| Some((r.batch_size as f64, r.median_iteration_s? * 1e3))).collect();
    plots::seconds_chart(title, "batch size", "median iteration time (ms)", &pts, failed, stem)
}
