//! The `collector` binary: parses the command line and runs it ([`collector::cli`]).

use clap::Parser;

fn main() -> std::process::ExitCode {
    match collector::cli::run(collector::cli::Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
