//! The `collector` subcommands, one module each: its flags (`clap::Args`) and the function that
//! runs it. They sit on the run layers below them ([`crate::pyrun`], [`crate::serve`],
//! [`crate::verify`], [`crate::viewer_assets`]) and on `traceio` and `shared`; [`crate::cli`] parses
//! the command line and picks one.

pub mod advise;
pub mod analyze;
pub mod check;
pub mod convert;
pub mod diff;
pub mod find;
pub mod ingest;
pub mod leaks;
pub mod ledger;
pub mod mcp;
pub mod merge;
pub mod python_package;
pub mod report;
pub mod serve;
pub mod serve_worker;
pub mod summary;
pub mod trace;
pub mod whatif;
pub mod why;

/// How much a gzip'd input may inflate to (every command that reads a trace).
#[derive(clap::Args, Clone, Copy)]
pub struct ImportArgs {
    /// Largest decompressed size accepted from gzip input, in MiB.
    #[arg(long, default_value_t = 4096)]
    pub max_decompressed_mib: u64,
}

impl ImportArgs {
    pub fn options(self) -> shared::ImportOptions {
        let mut o = shared::ImportOptions::default();
        o.max_decompressed_bytes = self.max_decompressed_mib.saturating_mul(1 << 20);
        o
    }
}

/// A size flag's value (`6GiB`, `512MiB`, `1.5GB`, bytes), for `advise --budget` and `check`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    shared::units::parse_size(text).map_err(|e| e.to_string())
}
