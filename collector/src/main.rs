//! The `collector` command line: convert and summarise traces (and, with libtorch, trace models).

use anyhow::Context;
use clap::{Parser, Subcommand};
use collector::commands::{load_trace, print_summary, resolve_format, write_export};
use shared::ImportOptions;
use std::path::PathBuf;

/// Memory Tracer: where GPU memory goes when a PyTorch model runs.
#[derive(Parser)]
#[command(name = "collector", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Convert a trace (snapshot pickle, profiler Chrome trace, DFTracer .pfw, Memory Tracer
    /// trace; gzip or not) to another format.
    Convert {
        /// Input trace file.
        input: PathBuf,
        /// Output file; written atomically.
        #[arg(short, long)]
        output: PathBuf,
        /// native, timeline, speedscope, chrome or csv. Default: from the output file name.
        #[arg(long)]
        format: Option<String>,
        /// Largest decompressed size accepted from gzip input, in MiB.
        #[arg(long, default_value_t = 4096)]
        max_decompressed_mib: u64,
    },
    /// Print peak memory, fragmentation and the top layers of a trace.
    Summary {
        /// Input trace file.
        input: PathBuf,
        /// Print one JSON object instead of a table.
        #[arg(long)]
        json: bool,
        /// How many layers to list.
        #[arg(long, default_value_t = 10)]
        top: usize,
        /// Largest decompressed size accepted from gzip input, in MiB.
        #[arg(long, default_value_t = 4096)]
        max_decompressed_mib: u64,
    },
}

fn import_options(max_decompressed_mib: u64) -> ImportOptions {
    let mut o = ImportOptions::default();
    o.max_decompressed_bytes = max_decompressed_mib.saturating_mul(1 << 20);
    o
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Convert {
            input,
            output,
            format,
            max_decompressed_mib,
        } => {
            let format = resolve_format(format.as_deref(), &output)?;
            let trace = load_trace(&input, &import_options(max_decompressed_mib))?;
            let bytes = write_export(&trace, format, &output)?;
            eprintln!(
                "wrote {} ({}, {} events) to {}",
                shared::units::format_bytes(bytes),
                format.name(),
                trace.events.len(),
                output.display()
            );
        }
        Command::Summary {
            input,
            json,
            top,
            max_decompressed_mib,
        } => {
            let trace = load_trace(&input, &import_options(max_decompressed_mib))?;
            print_summary(&trace, top, json, std::io::stdout().lock()).context("cannot print the summary")?;
        }
    }
    Ok(())
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
