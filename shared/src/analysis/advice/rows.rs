//! The advice as rows: the one projection of an [`AdviceReport`] that every surface shows,
//! figures and words alike — `collector advise`'s table, the viewer's Advice table — and that a
//! reader of `collector advise --json` or MCP's `advise` gets back from their report.

use super::{AdviceReport, Measure, ReservedPrediction, Suggestion, SuggestionKind};
use crate::units::{format_bytes, format_seconds};
use serde::{Deserialize, Serialize};

/// One change as every surface shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdviceRow {
    /// Its place in the ranking, from 1; `None` for a change with no effect here.
    pub rank: Option<usize>,
    pub kind: SuggestionKind,
    /// The change in a few words ([`Suggestion::label`]).
    pub label: String,
    /// The change in full.
    pub change: String,
    /// The predicted peak of what runs out ([`AdviceRows::judged_by`]).
    pub peak_bytes: u64,
    /// What the change saves of it (negative: it raises it).
    pub saving_bytes: i64,
    pub allocated_peak_bytes: u64,
    pub allocated_saving_bytes: i64,
    /// The predicted peak plus what the run held outside PyTorch (a trace with the ledger).
    pub device_total_bytes: Option<u64>,
    /// `9.29 GiB reserved`; `≈` before a reserved peak taken from the allocated saving.
    pub peak_text: String,
    /// `-2.65 GiB (-32.4 %)`: against the measured peak.
    pub saving_text: String,
    /// `5.43 GiB (-17.25 MiB)`.
    pub allocated_text: String,
    /// `9.81 GiB`, where there is a device total.
    pub device_total_text: Option<String>,
    /// `+12.30 ms (+4.5 %)`, or `not predicted`.
    pub extra_time_text: String,
    pub meets_budget: Option<bool>,
    /// Why, with the numbers.
    pub reasoning: String,
}

impl AdviceRow {
    /// The row on one line, as the lists of changes with no effect show it.
    pub fn line(&self) -> String {
        let total = self.device_total_text.as_ref().map_or_else(String::new, |t| format!("; device total {t}"));
        format!("{}: {}, {}; allocated {}{total}", self.label, self.peak_text, self.saving_text, self.allocated_text)
    }
}

/// The ranked changes and those with no effect, as every surface shows them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdviceRows {
    /// What the changes are judged by.
    pub judged_by: Measure,
    /// The measured peak of it: what savings are a share of.
    pub measured_peak_bytes: u64,
    /// Whether the rows have a device total (the trace has the device ledger).
    pub device_total: bool,
    pub ranked: Vec<AdviceRow>,
    pub no_effect: Vec<AdviceRow>,
}

/// The rows of a report: its ranked suggestions in their order, then those with no effect.
pub fn advice_rows(r: &AdviceReport) -> AdviceRows {
    let b = &r.baseline;
    let measured = match r.judged_by {
        Measure::Reserved => b.peak_reserved_bytes,
        Measure::Allocated => b.peak_allocated_bytes,
    };
    let row = |rank: Option<usize>, s: &Suggestion| {
        let (peak, unit) = match (r.judged_by, s.predicted_reserved_peak_bytes) {
            (Measure::Reserved, Some(p)) => (p, " reserved"),
            _ => (s.predicted_peak_bytes, ""),
        };
        let about = if s.reserved_predicted_by == Some(ReservedPrediction::AllocatedSaving) && !unit.is_empty() { "≈" } else { "" };
        let pct = if measured == 0 { 0.0 } else { (-s.saving_bytes) as f64 * 100.0 / measured as f64 };
        let extra_time_text = match (s.extra_time_per_iteration_s, b.iteration_time_s) {
            (Some(t), Some(it)) if it > 0.0 => format!("+{} ({:+.1} %)", format_seconds(t), 100.0 * t / it),
            (Some(t), _) => format!("+{}", format_seconds(t)),
            (None, _) => "not predicted".to_owned(),
        };
        AdviceRow {
            rank,
            kind: s.kind,
            label: s.label(),
            change: s.change.clone(),
            peak_bytes: peak,
            saving_bytes: s.saving_bytes,
            allocated_peak_bytes: s.predicted_peak_bytes,
            allocated_saving_bytes: s.allocated_saving_bytes,
            device_total_bytes: s.predicted_device_total_bytes,
            peak_text: format!("{about}{}{unit}", format_bytes(peak)),
            saving_text: format!("{} ({pct:+.1} %)", delta(-s.saving_bytes)),
            allocated_text: format!("{} ({})", format_bytes(s.predicted_peak_bytes), delta(-s.allocated_saving_bytes)),
            device_total_text: s.predicted_device_total_bytes.map(format_bytes),
            extra_time_text,
            meets_budget: s.meets_budget,
            reasoning: s.reasoning.clone(),
        }
    };
    AdviceRows {
        judged_by: r.judged_by,
        measured_peak_bytes: measured,
        device_total: r.suggestions.iter().chain(&r.no_effect).any(|s| s.predicted_device_total_bytes.is_some()),
        ranked: r.suggestions.iter().enumerate().map(|(k, s)| row(Some(k + 1), s)).collect(),
        no_effect: r.no_effect.iter().map(|s| row(None, s)).collect(),
    }
}

/// `-2.65 GiB`, `+512.00 KiB`, `0 B`.
fn delta(bytes: i64) -> String {
    let sign = match bytes.signum() {
        1 => "+",
        -1 => "-",
        _ => "",
    };
    format!("{sign}{}", format_bytes(bytes.unsigned_abs()))
}
