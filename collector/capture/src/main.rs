//! The `collector-capture` binary: runs the commands of `collector` that need libtorch
//! in-process (`trace --model`/`--torchscript`, `sweep`, `overhead`). `collector` execs it with
//! its own arguments, so it parses the same command line.

use clap::Parser;
use collector::cli::{Cli, Command};

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Trace(a) => capture::cli::trace_command(*a),
        Command::Sweep(a) => capture::cli::sweep_command(*a),
        Command::Overhead(a) => capture::cli::overhead_command(a),
        _ => anyhow::bail!("collector-capture runs `trace --model`/`--torchscript`, `sweep` and `overhead`; run `collector` for the rest"),
    }
}

fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
