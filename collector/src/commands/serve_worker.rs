//! `collector serve-worker` (hidden): one import or export for `collector serve`, under a
//! memory and CPU limit ([`crate::serve::isolate`]).

use std::path::PathBuf;

/// `collector serve-worker`: one import or export for `collector serve`.
#[derive(clap::Args)]
pub struct ServeWorkerArgs {
    #[command(subcommand)]
    pub task: ServeWorkerTask,
    /// Memory the worker may map beyond what it has at start.
    #[arg(long, global = true, default_value_t = 4 << 30)]
    pub memory_budget_bytes: u64,
    /// CPU seconds the worker may use.
    #[arg(long, global = true, default_value_t = 300)]
    pub cpu_seconds: u64,
    /// Largest decompressed size accepted from gzip input.
    #[arg(long, global = true, default_value_t = 4 << 30)]
    pub max_decompressed_bytes: u64,
}

#[derive(clap::Subcommand)]
pub enum ServeWorkerTask {
    /// Import FILE and print its summary.
    Import {
        file: PathBuf,
        /// The model name of a trace that names none.
        #[arg(long, default_value = "uploaded trace")]
        model_name: String,
        /// The file as errors name it.
        #[arg(long, default_value = "the file")]
        what: String,
    },
    /// Import FILE and write it as FORMAT to OUT.
    Export {
        file: PathBuf,
        out: PathBuf,
        #[arg(long)]
        format: String,
    },
    /// Merge the ranks of each node's part (`LABEL=FILE`) of a job of several nodes into one
    /// trace written to OUT, and print its summary.
    Merge {
        /// The parts, `LABEL=FILE` each (`node0=/tmp/...`).
        #[arg(required = true, value_parser = parse_part)]
        parts: Vec<(String, PathBuf)>,
        #[arg(long)]
        out: PathBuf,
        /// Why the ranks no part has are missing.
        #[arg(long, default_value = "no node's part has it")]
        missing_reason: String,
        /// Why a node sent no part (one per node), for the trace's warnings.
        #[arg(long)]
        absent: Vec<String>,
    },
}

/// `LABEL=FILE` → (label, file).
fn parse_part(s: &str) -> Result<(String, PathBuf), String> {
    let (label, file) = s.split_once('=').ok_or_else(|| format!("`{s}`: expected LABEL=FILE"))?;
    Ok((label.to_owned(), PathBuf::from(file)))
}

/// `collector serve-worker`: exits with the worker's code.
pub fn serve_worker_command(a: ServeWorkerArgs) -> ! {
    use crate::serve::isolate::{run_worker, WorkerTask};
    let task = match a.task {
        ServeWorkerTask::Import { file, model_name, what } => WorkerTask::Import { file, what, model_name },
        ServeWorkerTask::Export { file, out, format } => WorkerTask::Export { file, format, out },
        ServeWorkerTask::Merge { parts, out, missing_reason, absent } => WorkerTask::Merge { parts, out, missing_reason, absent },
    };
    std::process::exit(run_worker(task, a.memory_budget_bytes, a.cpu_seconds, a.max_decompressed_bytes));
}
