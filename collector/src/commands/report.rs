//! `collector report`: the viewer and a trace as a static folder or one HTML file.

use super::ImportArgs;
use anyhow::Context;
use std::path::PathBuf;
use traceio::files::load_trace;

/// `collector report` options.
#[derive(clap::Args)]
pub struct ReportArgs {
    /// Input trace file (any format the viewer opens).
    pub input: PathBuf,
    /// Output folder; with `--single-file`, the HTML file. Or object storage:
    /// s3://BUCKET/PREFIX/ (gs://, az://, file://), each file written with its content type, so
    /// the bucket served as a static website serves the report (credentials as for
    /// `collector serve --store`).
    #[arg(short, long, visible_alias = "out", default_value = "report")]
    pub output: PathBuf,
    /// Write one self-contained HTML file (wasm, worker and trace inlined).
    #[arg(long)]
    pub single_file: bool,
    #[command(flatten)]
    pub import: ImportArgs,
}

/// `collector report`.
pub fn report_command(a: ReportArgs) -> anyhow::Result<()> {
    // Import first: a file the viewer cannot open makes no report.
    let trace = load_trace(&a.input, &a.import.options())?;
    let bytes = std::fs::read(&a.input).with_context(|| format!("cannot read {}", a.input.display()))?;
    let (input, output) = (&a.input, &a.output);
    if let Some(url) = output.to_str().filter(|o| crate::objects::is_object_url(o)) {
        return to_bucket(url, input, &bytes, a.single_file, trace.events.len());
    }
    if a.single_file {
        crate::viewer_assets::write_single_file(input, &bytes, output)?;
        eprintln!("wrote {} ({} events): open it in a browser", output.display(), trace.events.len());
    } else {
        let files = crate::viewer_assets::write_folder(input, &bytes, output)?;
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

/// `--out s3://BUCKET/PREFIX/`: the report written locally, then each file put under the
/// prefix with its content type (`--single-file`: the one object the URL names).
fn to_bucket(url: &str, input: &std::path::Path, bytes: &[u8], single_file: bool, events: usize) -> anyhow::Result<()> {
    use crate::objects::{self, Put};
    let scratch = std::env::temp_dir().join(format!("memory-tracer-report-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).with_context(|| format!("cannot create {}", scratch.display()))?;
    let written = (|| -> anyhow::Result<String> {
        let (base, files) = if single_file {
            // `s3://BUCKET/PREFIX/report.html`: the bucket's URL, then the object's name.
            let (base, name) = url
                .rsplit_once('/')
                .filter(|(base, n)| !n.is_empty() && base.split_once("://").is_some_and(|(_, bucket)| !bucket.is_empty()))
                .with_context(|| format!("--out {url}: with --single-file, name the object (s3://BUCKET/PREFIX/report.html)"))?;
            let file = scratch.join(name);
            crate::viewer_assets::write_single_file(input, bytes, &file)?;
            (base.to_owned(), vec![file])
        } else {
            (url.trim_end_matches('/').to_owned(), crate::viewer_assets::write_folder(input, bytes, &scratch)?)
        };
        let bucket = objects::open(&base)?;
        bucket.check(&format!("report-{}", std::process::id()))?;
        for f in &files {
            let name = f.file_name().and_then(|n| n.to_str()).context("a report file without a name")?;
            bucket.put_file(name, f, Put { content_type: Some(objects::content_type(name)), create: false })?;
        }
        let opened = if single_file { files[0].file_name().and_then(|n| n.to_str()).unwrap_or("").to_owned() } else { "index.html".into() };
        Ok(format!(
            "wrote {} objects ({events} events) to {base}/: with the bucket served as a static website, open {opened} there",
            files.len()
        ))
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    eprintln!("{}", written?);
    Ok(())
}
