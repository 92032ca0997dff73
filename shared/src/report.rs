//! A trace at a glance, computed once: the peaks, the layers, each device's peaks, the leak
//! check, the out-of-memory explanation, what the memory at the peak is for and who holds it.
//! `collector summary` (text and `--json`), the MCP `summary` tool and the viewer's summary
//! card are projections of one [`TraceReport`], so they cannot disagree.

use crate::analysis::categories::{self, Categorized, Category};
use crate::analysis::holders::{self, Why};
use crate::analysis::leaks::{self, LeakReport};
use crate::analysis::oom::{self, OomReport};
use crate::analysis::{self, DevicePeak, LayerMemoryStats, Summary};
use crate::model::Trace;
use crate::whatif::{own_settings, SettingsInfo};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Never-freed groups the leak check lists (the largest first).
pub const LEAK_LINES: usize = 5;
/// Groups of each kind (by layer, phase, frame) the out-of-memory explanation lists.
pub const OOM_LINES: usize = 10;
/// Holders of the bytes live at the peak the report lists (the largest first).
pub const HOLDER_LINES: usize = 8;

/// Everything one trace's summary says, whichever way it is shown.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceReport {
    pub summary: Summary,
    /// Every layer's statistics, by name.
    pub layers: BTreeMap<String, LayerMemoryStats>,
    /// Every device's peaks (one per rank in a merged distributed trace).
    pub devices: Vec<DevicePeak>,
    /// Growth across iterations and what never gets freed ([`LEAK_LINES`] groups).
    pub leaks: LeakReport,
    /// Why the run ran out of memory, when it did.
    pub oom: Option<OomReport>,
    /// Bytes of each allocation category alive at the allocated peak.
    pub categories_at_peak: Vec<(Category, u64)>,
    /// Who holds the bytes live at the peak, where the capture recorded holders
    /// (`collector trace --holders`; `collector why` infers them for other traces).
    pub holders_at_peak: Option<Why>,
    /// Highest device memory in use as the driver saw it, when sampled.
    pub driver_used_peak_bytes: Option<u64>,
    /// The CUDA caching allocator's settings the run had (or that they are unknown), for a
    /// trace of a CUDA device.
    pub allocator_settings: Option<SettingsInfo>,
    /// The device's memory by source at the allocated peak, for a trace recorded with the
    /// ledger (`collector trace --ledger`).
    pub ledger_at_peak: Option<crate::analysis::ledger::LedgerAt>,
    /// The same at the first out-of-memory error: how much of the device was outside PyTorch.
    pub ledger_at_oom: Option<crate::analysis::ledger::LedgerAt>,
}

impl TraceReport {
    /// The report and every allocation's category (the viewer keeps them for later answers),
    /// its walks one after another (`traceio::text::report` runs them side by side); `progress`
    /// hears each step's name.
    pub fn with_categories(trace: &Trace, progress: &mut dyn FnMut(&str)) -> (Self, Vec<Categorized>) {
        let walks = Walks::one_by_one(trace, progress);
        progress("explaining out of memory");
        Self::from_walks(trace, walks)
    }

    /// The report from its walks over every event, however they were run.
    pub fn from_walks(trace: &Trace, walks: Walks) -> (Self, Vec<Categorized>) {
        let Walks { summary, layers, leaks, categorized } = walks;
        let oom = oom::oom(trace, OOM_LINES);
        let categories_at_peak = categories::bytes_at(trace, &categorized, summary.peak_event_index);
        let holders_at_peak = if trace.event_holders.is_empty() { None } else { holders::top_at_peak(trace, HOLDER_LINES) };
        let cuda = trace.devices.iter().find(|d| d.kind == "cuda" && !d.is_pinned_host()).map(|d| d.index);
        let peak_index = summary
            .peak_device
            .as_deref()
            .and_then(|p| trace.devices.iter().find(|d| d.to_string() == p && d.kind == "cuda"))
            .map(|d| d.index)
            .or(cuda);
        let allocator_settings = peak_index.map(|i| own_settings(trace).info(i));
        let ledger_at_peak = if trace.ledger.is_empty() {
            None
        } else {
            let at = crate::analysis::ledger::LedgerMoment { what: "peak".into(), ts_s: summary.peak_time_s };
            crate::analysis::ledger::ledger_at(trace, at, None)
        };
        let ledger_at_oom = match (&oom, trace.ledger.is_empty()) {
            (Some(_), false) => {
                crate::analysis::ledger::moment(trace, "oom").ok().and_then(|m| crate::analysis::ledger::ledger_at(trace, m, None))
            }
            _ => None,
        };
        let report = Self {
            allocator_settings,
            ledger_at_peak,
            ledger_at_oom,
            devices: analysis::device_peaks(trace),
            driver_used_peak_bytes: trace.device_samples.iter().map(|d| d.used_bytes).max(),
            summary,
            layers,
            leaks,
            oom,
            categories_at_peak,
            holders_at_peak,
        };
        (report, categorized)
    }

    /// The `n` layers with the highest allocated peaks.
    pub fn top_layers(&self, n: usize) -> Vec<&LayerMemoryStats> {
        analysis::top_layers_by_peak(&self.layers, n)
    }
}

/// The report's four walks over every event (a 3 GB snapshot's are 15 M events): independent,
/// so a caller with threads runs them side by side.
pub struct Walks {
    pub summary: Summary,
    pub layers: BTreeMap<String, LayerMemoryStats>,
    pub leaks: LeakReport,
    pub categorized: Vec<Categorized>,
}

impl Walks {
    /// The leak check as the report runs it.
    pub fn leaks(trace: &Trace) -> LeakReport {
        leaks::leaks(trace, LEAK_LINES)
    }

    /// The four walks one after another.
    pub fn one_by_one(trace: &Trace, progress: &mut dyn FnMut(&str)) -> Self {
        progress("summarising");
        let summary = analysis::summary(trace);
        progress("layer statistics");
        let layers = analysis::layer_stats(trace);
        progress("looking for leaks");
        let leaks = Self::leaks(trace);
        progress("categorising allocations");
        Walks { summary, layers, leaks, categorized: categories::categorize(trace) }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::analysis::ledger::{ledger_at, moment};

    /// A run that ran out of memory with the device ledger on: the report says how much of the
    /// device was outside PyTorch at the error.
    #[test]
    fn the_report_reads_the_ledger_at_the_peak_and_at_the_out_of_memory() {
        let t = crate::analysis::ledger::tests::run();
        let (report, _) = TraceReport::with_categories(&t, &mut |_| {});
        assert!(report.oom.is_some());
        let at_oom = ledger_at(&t, moment(&t, "oom").unwrap(), None).unwrap();
        assert_eq!(report.ledger_at_oom.unwrap(), at_oom);
        assert_eq!(report.ledger_at_peak.unwrap().sources[0].bytes, 100 << 20);
    }
}
