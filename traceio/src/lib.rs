//! Traces in and out of files and onto terminals, for the native binaries (`collector` and
//! `collector-capture`): reading and writing trace files ([`files`], [`read_ahead`]), the text
//! the commands print ([`text`], [`advice_text`]), and the folders of CSV, JSON and charts
//! that `analyze` and `sweep` write ([`folders`], [`plots`]), and Parquet tables for
//! dataframes and SQL ([`parquet`]). The numbers all come from `shared`; this crate only
//! reads, writes and formats them. It links neither libtorch nor a network stack.

pub mod advice_text;
pub mod files;
pub mod folders;
pub mod parquet;
pub mod plots;
pub mod read_ahead;
pub mod text;
