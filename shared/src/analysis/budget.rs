//! Memory budgets for CI (`collector check`): a trace's peak allocated and reserved memory
//! against limits, no steady growth across iterations, and no more than some growth of the
//! peak over a baseline trace. Each limit given is one [`BudgetCheck`]; the run passes when
//! every one does.

use super::leaks::leaks;
use super::summary;
use crate::units::format_bytes;
use crate::Trace;
use serde::{Deserialize, Serialize};

/// The limits to hold a trace to; `None` (or `false`) checks nothing.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    /// Most peak allocated bytes.
    pub max_peak_bytes: Option<u64>,
    /// Most peak reserved bytes.
    pub max_reserved_bytes: Option<u64>,
    /// No steady growth of allocated memory from one iteration's end to the next.
    pub no_leak: bool,
    /// Most growth of the peak allocated bytes over the baseline's, in percent.
    pub max_growth_percent: Option<f64>,
}

/// One limit and how the trace fared.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BudgetCheck {
    /// `peak_allocated`, `peak_reserved`, `leak` or `growth`.
    pub name: String,
    pub passed: bool,
    /// The limit, as people write it (`6.00 GiB`, `no growth`, `+5.0 %`).
    pub limit: String,
    /// What the trace has, the same way.
    pub actual: String,
    /// The numbers behind `actual` and `limit` where they are sizes or percents.
    pub actual_value: Option<f64>,
    pub limit_value: Option<f64>,
}

/// Every check, and what was at the peak.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BudgetReport {
    pub passed: bool,
    pub checks: Vec<BudgetCheck>,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// The module (layer) allocating at the peak, when the trace names one.
    pub peak_layer: Option<String>,
    pub peak_time_s: f64,
    /// The device of the peak.
    pub device: Option<String>,
}

/// Holds `trace` (and its peak against `baseline`'s, for `max_growth_percent`) to `budget`.
/// A growth limit without a baseline is a failed check saying so.
pub fn check(trace: &Trace, baseline: Option<&Trace>, budget: &Budget) -> BudgetReport {
    let s = summary(trace);
    let mut checks = Vec::new();
    let size_check = |name: &str, actual: u64, limit: u64| BudgetCheck {
        name: name.to_owned(),
        passed: actual <= limit,
        limit: format_bytes(limit),
        actual: format_bytes(actual),
        actual_value: Some(actual as f64),
        limit_value: Some(limit as f64),
    };
    if let Some(limit) = budget.max_peak_bytes {
        checks.push(size_check("peak_allocated", s.peak_allocated_bytes, limit));
    }
    if let Some(limit) = budget.max_reserved_bytes {
        checks.push(size_check("peak_reserved", s.peak_reserved_bytes, limit));
    }
    if budget.no_leak {
        let r = leaks(trace, 3);
        checks.push(BudgetCheck {
            name: "leak".to_owned(),
            passed: !r.leaking,
            limit: "no growth across iterations".to_owned(),
            actual: r.verdict,
            actual_value: Some(r.growth_per_iteration_bytes as f64),
            limit_value: None,
        });
    }
    if let Some(limit) = budget.max_growth_percent {
        checks.push(match baseline {
            Some(b) => {
                let base = summary(b).peak_allocated_bytes;
                let growth = if base == 0 { 0.0 } else { 100.0 * (s.peak_allocated_bytes as f64 - base as f64) / base as f64 };
                BudgetCheck {
                    name: "growth".to_owned(),
                    passed: growth <= limit,
                    limit: format!("{limit:+.1} % over the baseline's {}", format_bytes(base)),
                    actual: format!("{growth:+.1} % ({})", format_bytes(s.peak_allocated_bytes)),
                    actual_value: Some(growth),
                    limit_value: Some(limit),
                }
            }
            None => BudgetCheck {
                name: "growth".to_owned(),
                passed: false,
                limit: format!("{limit:+.1} %"),
                actual: "no baseline to compare with".to_owned(),
                actual_value: None,
                limit_value: Some(limit),
            },
        });
    }
    BudgetReport {
        passed: checks.iter().all(|c| c.passed),
        checks,
        peak_allocated_bytes: s.peak_allocated_bytes,
        peak_reserved_bytes: s.peak_reserved_bytes,
        peak_layer: s.peak_layer,
        peak_time_s: s.peak_time_s,
        device: s.peak_device,
    }
}

/// `5%`, `5 %`, `5`, `-2.5%` → percent; anything else says what a growth looks like.
pub fn parse_percent(text: &str) -> Result<f64, String> {
    let t = text.trim();
    let number = t.strip_suffix('%').unwrap_or(t).trim();
    match number.parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err(format!("`{text}` is not a growth; expected a percent such as 5% or 12.5")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{EventRecord, EventType, Phase, SourceFormat, Totals, TraceMeta};

    /// One allocation of `bytes` and its free, on the CPU.
    fn trace_of(bytes: u64) -> Trace {
        let mut t = Trace::new(TraceMeta::new(SourceFormat::MemoryTracer));
        let device = t.device_index(crate::model::Device { kind: "cpu".into(), index: 0, rank: None });
        t.events.base_totals = vec![Totals::default()];
        let layer = t.strings.intern("encoder");
        for (ts, et) in [(1, EventType::Alloc), (2, EventType::Free)] {
            t.events.push(EventRecord {
                ts_ns: ts,
                event_type: et,
                size_bytes: bytes,
                address: 0x1000,
                layer,
                phase: Phase::Forward,
                device,
                stream: 0,
                totals: None,
            });
        }
        t.finish();
        t
    }

    #[test]
    fn limits_pass_at_and_fail_past_the_peak() {
        let t = trace_of(1000);
        let at = check(&t, None, &Budget { max_peak_bytes: Some(1000), ..Budget::default() });
        assert!(at.passed, "{at:?}");
        assert_eq!(at.peak_layer.as_deref(), Some("encoder"));
        let past = check(&t, None, &Budget { max_peak_bytes: Some(999), ..Budget::default() });
        assert!(!past.passed);
        assert_eq!(past.checks[0].name, "peak_allocated");
        assert_eq!(past.checks[0].actual_value, Some(1000.0));
    }

    #[test]
    fn growth_is_measured_against_the_baseline_and_needs_one() {
        let (old, new) = (trace_of(1000), trace_of(1100));
        let budget = Budget { max_growth_percent: Some(5.0), ..Budget::default() };
        let r = check(&new, Some(&old), &budget);
        assert!(!r.passed);
        assert!((r.checks[0].actual_value.unwrap() - 10.0).abs() < 1e-9);
        assert!(check(&new, Some(&old), &Budget { max_growth_percent: Some(10.0), ..Budget::default() }).passed);
        assert!(!check(&new, None, &budget).passed);
    }

    #[test]
    fn percents_parse_with_or_without_the_sign() {
        assert_eq!(parse_percent("5%"), Ok(5.0));
        assert_eq!(parse_percent(" 12.5 "), Ok(12.5));
        assert!(parse_percent("five").unwrap_err().contains("5%"));
    }
}
