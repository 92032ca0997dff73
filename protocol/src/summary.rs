//! `collector summary --json`: one object, a projection of the trace's
//! [`TraceReport`](shared::report::TraceReport). Scripts and agents read its field names.

use serde::{Deserialize, Serialize};
use shared::analysis::holders::Why;
use shared::analysis::leaks::LeakReport;
use shared::analysis::oom::OomReport;
use shared::analysis::{DevicePeak, LayerMemoryStats, Summary};
use shared::model::CompiledCode;
use shared::report::TraceReport;
use shared::whatif::SettingsInfo;
use shared::Trace;
use std::collections::BTreeMap;

/// The `--json` form of `collector summary`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SummaryJson {
    #[serde(flatten)]
    pub summary: Summary,
    pub device_name: Option<String>,
    pub model: Option<String>,
    pub warnings: Vec<String>,
    /// The layers with the highest allocated peaks (`--top`).
    pub top_layers: Vec<LayerMemoryStats>,
    /// Counters PyTorch reported in the traced process (`cuda.max_memory_allocated`, ...).
    pub reported: BTreeMap<String, u64>,
    /// Highest device memory in use as the driver saw it (all of the process, CUDA context
    /// and libraries included), when sampled.
    pub driver_used_peak_bytes: Option<u64>,
    /// Every device's peaks (one per rank in a merged distributed trace).
    pub devices: Vec<DevicePeak>,
    /// Growth across iterations and what never gets freed.
    pub leaks: LeakReport,
    /// Why the run ran out of memory, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom: Option<OomReport>,
    /// Bytes of each allocation category alive at the peak (parameter, buffer, gradient,
    /// activation, optimizer_state, temporary, other).
    pub categories_at_peak: BTreeMap<String, u64>,
    /// torch.compile's generated code and the modules its allocations were attributed to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compiled: Option<CompiledCode>,
    /// Who holds the bytes live at the peak, largest first, where the capture recorded holders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holders_at_peak: Option<Why>,
    /// The CUDA caching allocator's settings the run had, for a CUDA trace (`known: false`:
    /// the file did not record them, and PyTorch's defaults are assumed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocator_settings: Option<SettingsInfo>,
    /// The device's memory by source at the peak (`collector trace --ledger`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ledger_at_peak: Option<shared::analysis::ledger::LedgerAt>,
    /// The same at the first out-of-memory error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ledger_at_oom: Option<shared::analysis::ledger::LedgerAt>,
}

impl SummaryJson {
    /// The report as `collector summary --json` writes it, with the `top` highest layers.
    pub fn new(trace: &Trace, report: &TraceReport, top: usize) -> Self {
        Self {
            summary: report.summary.clone(),
            device_name: trace.meta.device_name.clone(),
            model: trace.meta.model.clone(),
            warnings: trace.meta.warnings.clone(),
            top_layers: report.top_layers(top).into_iter().cloned().collect(),
            reported: trace.meta.reported.clone(),
            driver_used_peak_bytes: report.driver_used_peak_bytes,
            devices: report.devices.clone(),
            leaks: report.leaks.clone(),
            oom: report.oom.clone(),
            categories_at_peak: report.categories_at_peak.iter().map(|&(c, b)| (c.as_str().to_owned(), b)).collect(),
            compiled: trace.meta.compiled.clone(),
            holders_at_peak: report.holders_at_peak.clone(),
            allocator_settings: report.allocator_settings.clone(),
            ledger_at_peak: report.ledger_at_peak.clone(),
            ledger_at_oom: report.ledger_at_oom.clone(),
        }
    }
}
