//! The commands that read traces (any format) and write or print what is in them: `convert`,
//! `summary`, `leaks`, `diff`, `advise`, `merge`, `analyze`, `report`, and the Python API's
//! helpers (`ingest`, `python-package`).

use super::ImportArgs;
use crate::commands::{load_trace, parse_format, print_summary, resolve_format, write_export};
use anyhow::Context;
use shared::export::ExportFormat;
use std::io::Write;
use std::path::{Path, PathBuf};

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

/// `collector convert` options.
#[derive(clap::Args)]
pub struct ConvertArgs {
    /// Input trace file.
    pub input: PathBuf,
    /// Output file; written atomically.
    #[arg(short, long)]
    pub output: PathBuf,
    /// native, timeline, speedscope, chrome, csv or dftracer (.pfw.gz). Default: from the output file name.
    #[arg(long, value_parser = parse_format)]
    pub format: Option<ExportFormat>,
    #[command(flatten)]
    pub import: ImportArgs,
}

/// `collector merge` options.
#[derive(clap::Args)]
pub struct MergeArgs {
    /// The traces, one per rank.
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// Output file; written atomically.
    #[arg(short, long)]
    pub output: PathBuf,
    /// The inputs' ranks, in order. Default: the rank a traced process recorded (RANK),
    /// else `rank<N>` in the file name, else the input's position.
    #[arg(long, value_delimiter = ',')]
    pub ranks: Option<Vec<u32>>,
    /// Merge inputs recorded far apart in time (more than a minute and than the longest
    /// input), which are otherwise refused as traces of different runs.
    #[arg(long)]
    pub allow_disjoint: bool,
    /// native, timeline, speedscope, chrome, csv or dftracer (.pfw.gz). Default: from the output file name.
    #[arg(long, value_parser = parse_format)]
    pub format: Option<ExportFormat>,
    #[command(flatten)]
    pub import: ImportArgs,
}

/// `collector analyze` options.
#[derive(clap::Args)]
pub struct AnalyzeArgs {
    /// Input trace file (native, or a torch.profiler Chrome trace).
    pub input: PathBuf,
    /// Output folder (created if missing).
    #[arg(short, long, default_value = ".")]
    pub output: PathBuf,
    /// File name prefix.
    #[arg(long, default_value = "profiler_stats")]
    pub prefix: String,
    #[command(flatten)]
    pub import: ImportArgs,
}

/// `collector report` options.
#[derive(clap::Args)]
pub struct ReportArgs {
    /// Input trace file (any format the viewer opens).
    pub input: PathBuf,
    /// Output folder; with `--single-file`, the HTML file.
    #[arg(short, long, default_value = "report")]
    pub output: PathBuf,
    /// Write one self-contained HTML file (wasm, worker and trace inlined).
    #[arg(long)]
    pub single_file: bool,
    #[command(flatten)]
    pub import: ImportArgs,
}

/// A trace to read and how to print what is found (`summary`, `leaks`).
#[derive(clap::Args)]
pub struct SummaryArgs {
    /// Input trace file (any format).
    pub input: PathBuf,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// How many rows (layers, groups of never-freed allocations) to list.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    #[command(flatten)]
    pub import: ImportArgs,
}

/// A trace and what to find in it (`find`).
#[derive(clap::Args)]
pub struct FindArgs {
    /// Input trace file (any format).
    pub input: PathBuf,
    /// An address (`0x…`), or text looked for in module paths, stack frames (`name
    /// file:line`) and user metadata or annotations (case-insensitive).
    pub query: String,
    /// How many matches to list.
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// Print one JSON object instead of lines.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub import: ImportArgs,
}

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

/// A trace to advise on (`advise`).
#[derive(clap::Args)]
pub struct AdviseArgs {
    /// Input trace file (any format; checkpointing, AMP and batch advice need operators).
    /// Not with --verify, which traces the run itself.
    #[arg(required_unless_present = "verify")]
    pub input: Option<PathBuf>,
    /// The memory the run must fit in: 6GiB, 512MiB, 1.5GB or bytes. Default: no budget, the
    /// best few changes.
    #[arg(long, value_parser = parse_budget)]
    pub budget: Option<u64>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// How many suggestions and checkpoint candidates to list.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    #[command(flatten)]
    pub import: ImportArgs,
    /// Prove it: trace the program after `--` (or a built-in model, --model) as it is, advise,
    /// then trace it again with the top checkpointing suggestion (`--checkpoint LAYERS`), AMP
    /// (`--amp`) and both, and print configuration | peak allocated | iteration time |
    /// predicted peak | error. The program must take those two flags.
    #[arg(long)]
    pub verify: bool,
    /// With --verify: a built-in model, run as `python -m memory_tracer.zoo --model NAME`.
    #[arg(long, requires = "verify")]
    pub model: Option<String>,
    /// With --model: its batch size.
    #[arg(long, requires = "model")]
    pub batch_size: Option<u64>,
    /// With --model: iterations (default 4; the first warms up).
    #[arg(long, requires = "model", default_value_t = 4)]
    pub iterations: u32,
    /// With --model: cuda or cpu (default: cuda when torch sees one).
    #[arg(long, requires = "model")]
    pub device: Option<String>,
    /// With --verify: where the runs' traces and verify.json go.
    #[arg(long, default_value = "advise-verify")]
    pub out_dir: PathBuf,
    /// With --verify: the program to run (`python train.py ...`).
    #[arg(last = true)]
    pub command: Vec<String>,
}

/// `collector advise`: advice on a trace, or (`--verify`) advice checked by running it.
pub fn advise_command(a: AdviseArgs) -> anyhow::Result<()> {
    use shared::analysis::advice::{advise, AdviceOptions};
    let opts = AdviceOptions { budget_bytes: a.budget, top: a.top, ..Default::default() };
    if !a.verify {
        let input = a.input.context("give a trace to advise on, or --verify with a program to run")?;
        let r = advise(&load_trace(&input, &a.import.options())?, &opts);
        if a.json {
            println!("{}", serde_json::to_string_pretty(&r)?);
        } else {
            crate::commands::print_advice(&r, std::io::stdout().lock())?;
        }
        return Ok(());
    }
    let command = match &a.model {
        Some(m) => {
            anyhow::ensure!(
                crate::MODEL_ZOO.contains(&m.as_str()),
                "--model {m}: unknown model; built-in models: {}",
                crate::MODEL_ZOO.join(", ")
            );
            anyhow::ensure!(a.command.is_empty(), "give --model or a command after `--`, not both");
            let python = std::env::var("MEMORY_TRACER_PYTHON").unwrap_or_else(|_| "python3".into());
            let mut c: Vec<String> = [python.as_str(), "-m", "memory_tracer.zoo", "--model", m, "--iterations"].map(String::from).to_vec();
            c.push(a.iterations.to_string());
            if let Some(b) = a.batch_size {
                c.extend(["--batch-size".into(), b.to_string()]);
            }
            if let Some(d) = &a.device {
                c.extend(["--device".into(), d.clone()]);
            }
            c
        }
        None => a.command.clone(),
    };
    anyhow::ensure!(
        !command.is_empty(),
        "--verify needs a program after `--` (one that takes --checkpoint LAYERS and --amp) or --model NAME"
    );
    let v = crate::verify::verify(&command, &opts, &a.out_dir)?;
    std::fs::write(a.out_dir.join("verify.json"), serde_json::to_vec_pretty(&v)?).context("cannot write verify.json")?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        crate::commands::print_advice(&v.advice, std::io::stdout().lock())?;
        println!();
        crate::verify::print(&v, std::io::stdout().lock())?;
    }
    Ok(())
}

fn parse_budget(text: &str) -> Result<u64, String> {
    shared::units::parse_size(text).map_err(|e| e.to_string())
}

/// `collector ingest`: one capture stream from an inherited socket, built into a trace.
pub fn ingest_command(a: IngestArgs) -> anyhow::Result<()> {
    let IngestArgs { fd, output, stats_json, device, no_fragmentation } = a;
    let (output, device) = (output.as_path(), device.as_deref());
    use crate::pyrun;
    use shared::analysis;
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
        let layers = analysis::layer_stats(&trace);
        let j = serde_json::json!({
            "summary": analysis::summary(&trace),
            "layer_stats": layers,
            "peak_memory_per_layer": analysis::peak_memory_per_layer(&trace),
            "fragmentation": analysis::fragmentation_stats_with_layers(&trace, &layers),
            "warnings": trace.meta.warnings,
            "capture": trace.meta.capture,
            "reported": trace.meta.reported,
            "trace_path": output,
        });
        println!("{j}");
    }
    Ok(())
}

/// `collector python-package`: the package and capture libraries this collector carries.
pub fn python_package_command(out: &Path) -> anyhow::Result<()> {
    crate::pyrun::package::write_to(out)?;
    let carried: Vec<&str> = record::CAPTURES.iter().map(|c| c.torch).collect();
    let carried = if carried.is_empty() { "none: every torch builds it on first use".to_owned() } else { carried.join(", ") };
    eprintln!("wrote the memory_tracer package to {} (capture libraries for torch {carried})", out.display());
    Ok(())
}

/// `collector convert`.
pub fn convert_command(a: ConvertArgs) -> anyhow::Result<()> {
    let format = resolve_format(a.format, &a.output)?;
    let trace = load_trace(&a.input, &a.import.options())?;
    let bytes = write_export(&trace, format, &a.output)?;
    let size = shared::units::format_bytes(bytes);
    eprintln!("wrote {size} ({}, {} events) to {}", format.name(), trace.events.len(), a.output.display());
    Ok(())
}

/// `collector analyze`.
pub fn analyze_command(a: AnalyzeArgs) -> anyhow::Result<()> {
    let mut trace = load_trace(&a.input, &a.import.options())?;
    if trace.meta.model.is_none() {
        // Chart titles name the model; a profiler trace does not, so use the file name.
        trace.meta.model = a.input.file_name().map(|n| n.to_string_lossy().into_owned());
    }
    let analysis =
        crate::analyze::analyze(&trace, &a.output, &a.prefix).with_context(|| format!("cannot analyze {}", a.input.display()))?;
    crate::analyze::print_profile(&analysis.profile, std::io::stdout().lock())?;
    for f in &analysis.files {
        eprintln!("wrote {}", f.display());
    }
    Ok(())
}

/// `collector report`.
pub fn report_command(a: ReportArgs) -> anyhow::Result<()> {
    // Import first: a file the viewer cannot open makes no report.
    let trace = load_trace(&a.input, &a.import.options())?;
    let bytes = std::fs::read(&a.input).with_context(|| format!("cannot read {}", a.input.display()))?;
    let (input, output) = (&a.input, &a.output);
    if a.single_file {
        crate::report::write_single_file(input, &bytes, output)?;
        eprintln!("wrote {} ({} events): open it in a browser", output.display(), trace.events.len());
    } else {
        let files = crate::report::write_folder(input, &bytes, output)?;
        eprintln!(
            "wrote {} files ({} events) to {}: serve the folder from any static host (python3 -m http.server -d {}) and open index.html",
            files.len(),
            trace.events.len(),
            output.display(),
            output.display()
        );
    }
    Ok(())
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
        crate::commands::print_leaks(&r, std::io::stdout().lock())?;
    }
    Ok(())
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
        crate::commands::print_diff(&d, (&labels.0, &labels.1), a.top, std::io::stdout().lock())?;
    }
    Ok(())
}

/// `collector merge`.
pub fn merge_command(a: MergeArgs) -> anyhow::Result<()> {
    let format = resolve_format(a.format, &a.output)?;
    if let Some(r) = a.ranks.as_ref().filter(|r| r.len() != a.inputs.len()) {
        anyhow::bail!("--ranks gives {} ranks for {} inputs; expected one per input", r.len(), a.inputs.len());
    }
    let mut merge_inputs = Vec::new();
    for (k, path) in a.inputs.iter().enumerate() {
        let trace = load_trace(path, &a.import.options())?;
        let rank = match &a.ranks {
            Some(r) => r[k],
            None => shared::rank_files::rank_of(&trace, &path.to_string_lossy()).unwrap_or(k as u32),
        };
        merge_inputs.push(shared::merge::MergeInput { trace, rank, label: path.display().to_string() });
    }
    let opts = shared::merge::MergeOptions { allow_disjoint: a.allow_disjoint, ..Default::default() };
    let merged = shared::merge::merge_with(merge_inputs, &opts)?;
    let bytes = write_export(&merged, format, &a.output)?;
    print_summary(&merged, 5, false, std::io::stderr().lock())?;
    eprintln!(
        "wrote {} ({}, {} ranks, {} events) to {}",
        shared::units::format_bytes(bytes),
        format.name(),
        a.inputs.len(),
        merged.events.len(),
        a.output.display()
    );
    Ok(())
}

/// `collector find`.
pub fn find_command(a: FindArgs) -> anyhow::Result<()> {
    let trace = load_trace(&a.input, &a.import.options())?;
    let found = shared::analysis::search::find(&trace, &a.query, a.limit);
    let mut out = std::io::stdout().lock();
    if a.json {
        let mut found = found;
        found.events.clear();
        serde_json::to_writer_pretty(&mut out, &found)?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(out, "{} allocations match {:?}", found.total, found.query)?;
    for m in &found.matches {
        let by = match m.by {
            shared::analysis::search::MatchedBy::Address => "address",
            shared::analysis::search::MatchedBy::Layer => "layer",
            shared::analysis::search::MatchedBy::Stack => "frame",
            shared::analysis::search::MatchedBy::Note => "note",
        };
        writeln!(
            out,
            "  {:>10} at 0x{:x} on {} at {} in {}  [{by}: {}]",
            shared::units::format_bytes(m.size_bytes),
            m.address,
            m.device,
            shared::units::format_seconds(m.t_s),
            m.layer.as_deref().unwrap_or("—"),
            m.text
        )?;
    }
    if found.total > found.matches.len() {
        writeln!(out, "  … {} more (--limit)", found.total - found.matches.len())?;
    }
    Ok(())
}

/// `collector summary`.
pub fn summary_command(a: SummaryArgs) -> anyhow::Result<()> {
    let trace = load_trace(&a.input, &a.import.options())?;
    print_summary(&trace, a.top, a.json, std::io::stdout().lock()).context("cannot print the summary")
}
