//! `collector advise`: what to change so the run needs less memory, with `--verify` proving it by
//! running the program again with the top suggestions.

use super::{parse_size, ImportArgs};
use anyhow::Context;
use shared::analysis::advice::{AdviceOptions, AdviceReport};
use std::io::Write;
use std::path::PathBuf;
use traceio::files::load_trace;

/// A trace to advise on (`advise`).
#[derive(clap::Args)]
pub struct AdviseArgs {
    /// Input trace file (any format; checkpointing, AMP and batch advice need operators).
    /// Not with --verify, which traces the run itself.
    #[arg(required_unless_present = "verify")]
    pub input: Option<PathBuf>,
    /// The memory the run must fit in: 6GiB, 512MiB, 1.5GB or bytes. Default: no budget, the
    /// best few changes.
    #[arg(long, value_parser = parse_size)]
    pub budget: Option<u64>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// How many suggestions and checkpoint candidates to list.
    #[arg(long, default_value_t = AdviceOptions::default().top)]
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
    /// With --model: iterations (default 21: the first warms up, and times are medians over
    /// at least 20).
    #[arg(long, requires = "model", default_value_t = 21)]
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

impl AdviseArgs {
    /// What the flags ask of the advice.
    fn options(&self) -> AdviceOptions {
        AdviceOptions { budget_bytes: self.budget, top: self.top, ..Default::default() }
    }
}

/// Writes the advice as `collector advise` prints it: the report as JSON (`json`), else its
/// rows as a table ([`traceio::text::print_advice`]).
fn write_advice(r: &AdviceReport, json: bool, mut out: impl Write) -> anyhow::Result<()> {
    if json {
        serde_json::to_writer_pretty(&mut out, r)?;
        writeln!(out)?;
        Ok(())
    } else {
        traceio::text::print_advice(r, out)
    }
}

/// `collector advise`: advice on a trace, or (`--verify`) advice checked by running it.
pub fn advise_command(a: AdviseArgs) -> anyhow::Result<()> {
    use shared::analysis::advice::advise;
    let opts = a.options();
    if !a.verify {
        let input = a.input.context("give a trace to advise on, or --verify with a program to run")?;
        let r = advise(&load_trace(&input, &a.import.options())?, &opts);
        return write_advice(&r, a.json, std::io::stdout().lock());
    }
    let command = match &a.model {
        Some(m) => {
            anyhow::ensure!(
                protocol::MODEL_ZOO.contains(&m.as_str()),
                "--model {m}: unknown model; built-in models: {}",
                protocol::MODEL_ZOO.join(", ")
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
        traceio::text::print_advice(&v.advice, std::io::stdout().lock())?;
        println!();
        crate::verify::print(&v, std::io::stdout().lock())?;
    }
    Ok(())
}
