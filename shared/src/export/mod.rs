//! Exporters: a [`Trace`] out to any `impl Write`.
//!
//! - [`native`]: Memory Tracer's own format (lossless; [`crate::import::native`] reads it back).
//! - [`timeline`]: the MemoryTracer API's timeline JSON (`events`, `layer_stats`, `summary`).
//! - [`speedscope`]: speedscope JSON (layer/op spans over time, live bytes by stack at the peak).
//! - [`chrome`]: Chrome trace JSON for Perfetto (memory counters, layer and op slices).
//! - [`csv`]: layer statistics as CSV.
//! - [`dftracer`]: DFTracer `.pfw.gz` (JSON lines in independent gzip chunks; memory events,
//!   layer scopes and operators; [`crate::import::dftracer`] reads it back).
//! - [`profile`]: the graph profile (node, activation and breakdown tables) as CSV.
//! - [`tensorboard`]: TensorBoard's event file, memory scalars per iteration.

pub mod chrome;
pub mod csv;
pub mod dftracer;
pub mod native;
pub mod profile;
pub mod speedscope;
pub mod tensorboard;
pub mod timeline;

use crate::model::Trace;
use std::io::Write;

/// What went wrong while exporting.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("writing the export failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("serialising the export failed: {0}")]
    Json(#[from] serde_json::Error),
}

/// Export formats, by the names the CLI and the HTTP API use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportFormat {
    Native,
    Timeline,
    Speedscope,
    Chrome,
    Csv,
    Dftracer,
    Tensorboard,
}

impl ExportFormat {
    pub const ALL: [ExportFormat; 7] = [
        ExportFormat::Native,
        ExportFormat::Timeline,
        ExportFormat::Speedscope,
        ExportFormat::Chrome,
        ExportFormat::Csv,
        ExportFormat::Dftracer,
        ExportFormat::Tensorboard,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ExportFormat::Native => "native",
            ExportFormat::Timeline => "timeline",
            ExportFormat::Speedscope => "speedscope",
            ExportFormat::Chrome => "chrome",
            ExportFormat::Csv => "csv",
            ExportFormat::Dftracer => "dftracer",
            ExportFormat::Tensorboard => "tensorboard",
        }
    }

    /// File name suffix.
    pub fn extension(self) -> &'static str {
        match self {
            ExportFormat::Native => "mtrace.json",
            ExportFormat::Timeline => "timeline.json",
            ExportFormat::Speedscope => "speedscope.json",
            ExportFormat::Chrome => "chrome.json",
            ExportFormat::Csv => "csv",
            ExportFormat::Dftracer => "pfw.gz",
            ExportFormat::Tensorboard => "tfevents",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|f| f.name() == name)
    }

    /// The format a file name's ending names, and that ending (with its dot), ignoring case:
    /// every [`ExportFormat::extension`], plus `.mtrace` and `.perfetto.json`.
    pub fn from_file_name(name: &str) -> Option<(Self, &'static str)> {
        let name = name.to_ascii_lowercase();
        FILE_SUFFIXES.iter().find(|(s, _)| name.ends_with(s)).map(|&(s, f)| (f, s))
    }
}

/// The file name endings that name a format (the one table `collector` reads `-o` names by).
pub const FILE_SUFFIXES: [(&str, ExportFormat); 9] = [
    (".mtrace.json", ExportFormat::Native),
    (".mtrace", ExportFormat::Native),
    (".speedscope.json", ExportFormat::Speedscope),
    (".chrome.json", ExportFormat::Chrome),
    (".perfetto.json", ExportFormat::Chrome),
    (".timeline.json", ExportFormat::Timeline),
    (".csv", ExportFormat::Csv),
    (".pfw.gz", ExportFormat::Dftracer),
    (".tfevents", ExportFormat::Tensorboard),
];

/// Writes `trace` in `format`.
pub fn export(trace: &Trace, format: ExportFormat, out: impl Write) -> Result<(), ExportError> {
    match format {
        ExportFormat::Native => native::write(trace, out),
        ExportFormat::Timeline => timeline::write(trace, out),
        ExportFormat::Speedscope => speedscope::write(trace, out),
        ExportFormat::Chrome => chrome::write(trace, out),
        ExportFormat::Csv => csv::write_layer_stats(trace, out),
        ExportFormat::Dftracer => dftracer::write(trace, out),
        ExportFormat::Tensorboard => Ok(tensorboard::write(trace, out)?),
    }
}
