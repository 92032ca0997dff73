//! The `collector-capture` binary: runs the commands of `collector` that need libtorch
//! in-process (`trace --model`/`--torchscript`, `sweep`, `overhead`). `collector` parses their
//! flags and execs this binary with the job as JSON: `collector-capture --job '{…}'`
//! ([`protocol::CaptureJob`]).

use anyhow::Context;
use protocol::CaptureJob;

fn job() -> anyhow::Result<CaptureJob> {
    let mut args = std::env::args().skip(1);
    match (args.next().as_deref(), args.next(), args.next()) {
        (Some("--version" | "-V"), None, None) => {
            println!("collector-capture {} (libtorch {})", env!("CARGO_PKG_VERSION"), protocol::TORCH_VERSION);
            std::process::exit(0)
        }
        (Some("--job"), Some(json), None) => {
            let de = &mut serde_json::Deserializer::from_str(&json);
            serde_path_to_error::deserialize(de).context("the job from `collector` does not parse (is this collector-capture from the same build?)")
        }
        _ => anyhow::bail!(
            "collector-capture runs the jobs `collector` hands it (`--job JSON`); run `collector trace --model …`, `collector sweep` or `collector overhead`"
        ),
    }
}

fn run() -> anyhow::Result<()> {
    match job()? {
        CaptureJob::Trace { run, output, format, top, quiet, progress_json } => {
            capture::cli::trace_command(capture::cli::TraceJob { run, output, format, top, quiet, progress_json })
        }
        CaptureJob::Sweep { run, batch_sizes, output } => capture::cli::sweep_command(run, &batch_sizes, &output),
        CaptureJob::Overhead(o) => capture::cli::overhead_command(o),
    }
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
