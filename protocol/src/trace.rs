//! What the server knows of a trace: its summary ([`TraceInfo`], computed by [`trace_info`]),
//! and the store's record of it ([`StoredTrace`]).

use serde::{Deserialize, Serialize};
use shared::analysis::{layer_stats, summary};
use shared::Trace;
use std::collections::BTreeMap;

const MIB: f64 = 1024.0 * 1024.0;

/// One layer's statistics, as the seed service reported them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LayerStatsBody {
    pub layer_name: String,
    /// Highest allocated bytes at an event of the layer.
    pub peak_allocated: u64,
    pub peak_reserved: u64,
    pub total_allocations: u64,
    pub total_deallocations: u64,
    pub avg_fragmentation: f64,
    pub duration_ms: f64,
}

/// What the server knows of a trace without reading it again.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TraceInfo {
    pub model_name: String,
    pub total_events: usize,
    pub total_layers: usize,
    /// Highest allocated memory, MiB (2^20 bytes).
    pub peak_allocated_mb: f64,
    pub peak_reserved_mb: f64,
    pub avg_fragmentation: f64,
    /// Time the collector spent tracing (model build, iterations, assembly), ms; 0 for uploads.
    pub tracing_time_ms: f64,
    pub layer_stats: BTreeMap<String, LayerStatsBody>,
    /// Exact peaks in bytes.
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// `cuda:0`, `CPU`, or the device named in the file.
    pub device: Option<String>,
    /// The format the trace was read from.
    pub source_format: String,
    /// Allocations and frees past `max_events`, counted and not kept.
    pub dropped_events: u64,
}

/// The summary of `trace` for answers and the store.
pub fn trace_info(trace: &Trace, model_fallback: &str, tracing_time_ms: f64) -> TraceInfo {
    let s = summary(trace);
    let layers = layer_stats(trace)
        .into_iter()
        .map(|(k, l)| {
            (
                k,
                LayerStatsBody {
                    layer_name: l.layer_name,
                    peak_allocated: l.peak_allocated,
                    peak_reserved: l.peak_reserved,
                    total_allocations: l.total_allocations,
                    total_deallocations: l.total_deallocations,
                    avg_fragmentation: l.avg_fragmentation,
                    duration_ms: l.duration_ms,
                },
            )
        })
        .collect();
    TraceInfo {
        model_name: trace.meta.model.clone().unwrap_or_else(|| model_fallback.to_owned()),
        total_events: s.total_events,
        total_layers: s.total_layers,
        peak_allocated_mb: s.peak_allocated_bytes as f64 / MIB,
        peak_reserved_mb: s.peak_reserved_bytes as f64 / MIB,
        avg_fragmentation: s.avg_fragmentation,
        tracing_time_ms,
        layer_stats: layers,
        peak_allocated_bytes: s.peak_allocated_bytes,
        peak_reserved_bytes: s.peak_reserved_bytes,
        device: trace.meta.device_name.clone().or(s.peak_device),
        source_format: s.source_format,
        dropped_events: s.dropped_events,
    }
}

/// The answer to a finished trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TraceResponse {
    pub trace_id: String,
    #[serde(flatten)]
    pub info: TraceInfo,
}

impl From<&StoredTrace> for TraceResponse {
    fn from(t: &StoredTrace) -> Self {
        Self { trace_id: t.trace_id.clone(), info: t.info.clone() }
    }
}

/// Where a stored trace came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// Recorded by this server (`POST /api/trace/memory`).
    Traced,
    /// Sent to `POST /api/trace/upload`.
    Uploaded,
}

impl Origin {
    /// The name on the wire (`traced`, `uploaded`).
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Traced => "traced",
            Origin::Uploaded => "uploaded",
        }
    }
}

/// An export made from a stored trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExportFile {
    /// File name under `/api/trace/download/`.
    pub file: String,
    pub file_size_bytes: u64,
}

/// A stored trace: what its sidecar holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StoredTrace {
    pub trace_id: String,
    pub created_unix_ms: u64,
    pub origin: Origin,
    /// The trace file's name in the store.
    pub file: String,
    /// The uploaded file's name, when the client gave one.
    pub original_name: Option<String>,
    pub file_size_bytes: u64,
    /// Exports by format name.
    pub exports: BTreeMap<String, ExportFile>,
    pub info: TraceInfo,
}
