//! `collector mcp`: Memory Tracer's tools for AI assistants, an MCP server on stdin/stdout
//! ([`crate::mcp`]). Add it to a client as the command `collector mcp --allow ~/runs`.

use super::ImportArgs;
use crate::mcp::{serve_stdio, AllowedFolders};
use std::path::PathBuf;
use std::sync::Arc;

/// `collector mcp` options.
#[derive(clap::Args)]
pub struct McpArgs {
    /// A folder whose traces (at any depth) the tools may read; repeat for several. Default:
    /// the current folder. Paths outside them are refused.
    #[arg(long, value_name = "DIR")]
    pub allow: Vec<PathBuf>,
    #[command(flatten)]
    pub import: ImportArgs,
}

/// `collector mcp`: serves until the client closes stdin.
pub fn mcp_command(a: McpArgs) -> anyhow::Result<()> {
    let folders = if a.allow.is_empty() { vec![PathBuf::from(".")] } else { a.allow };
    let allowed = AllowedFolders::new(&folders).map_err(anyhow::Error::msg)?;
    serve_stdio(Arc::new(allowed), a.import.options())
}
