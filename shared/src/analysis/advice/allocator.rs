//! Allocator-settings advice: fragmentation at the peak, and the setting that saves the most
//! reserved memory when the trace is replayed through PyTorch's caching allocator under it.

use super::reserved::{Proposal, ReservedBy};
use super::{Baseline, Ctx, SuggestionKind};
use crate::units::format_bytes;

/// The allocator settings advice tries (`shared::whatif`), each over the run's own: the one
/// PyTorch's out-of-memory message names, the one its docs give for fragmentation, and the
/// power-of-two rounding that keeps block sizes reusable.
pub const ALLOCATOR_CANDIDATES: [&str; 3] =
    ["expandable_segments:True", "max_split_size_mb:512", "roundup_power2_divisions:[256:1,512:2,>:4]"];
/// The reserved peak a setting must save, in percent of the run's own, to be suggested
/// (unless it avoids an out-of-memory the run's own settings meet).
pub const ALLOCATOR_MIN_SAVING_PCT: f64 = 5.0;

/// Fragmentation at the peak, and the allocator setting that saves most of the reserved peak
/// in a replay of the trace through PyTorch's caching allocator (`shared::whatif`), where one
/// saves at least [`ALLOCATOR_MIN_SAVING_PCT`] or avoids the out-of-memory.
pub(super) fn fragmentation_advice(
    ctx: &Ctx,
    baseline: &Baseline,
    threshold: f64,
    out: &mut Vec<Proposal>,
    notes: &mut Vec<String>,
    not_available: &mut Vec<String>,
) {
    let trace = ctx.c.trace;
    let (peak, reserved) = (ctx.peak, baseline.reserved_at_peak_bytes);
    if !trace.meta.fragmentation_tracked {
        not_available.push("expandable_segments: the trace was recorded without fragmentation tracking".to_owned());
        return;
    }
    if reserved == 0 {
        not_available.push(format!(
            "expandable_segments: nothing is reserved on {} (the CPU allocator caches nothing); fragmentation and expandable_segments are about CUDA's caching allocator",
            baseline.device
        ));
        return;
    }
    let text = format!(
        "at the allocated peak {} is reserved and {} allocated: {} ({:.1} % of reserved) is held by the allocator but unused",
        format_bytes(reserved),
        format_bytes(peak),
        format_bytes(reserved.saturating_sub(peak)),
        100.0 * baseline.fragmentation_at_peak
    );
    if !baseline.device.starts_with("cuda") {
        notes.push(format!("{text}; allocator settings are CUDA's caching allocator's, and this device is {}", baseline.device));
        return;
    }
    let opts = crate::whatif::WhatIfOptions {
        settings: ALLOCATOR_CANDIDATES.iter().map(|s| (*s).to_owned()).collect(),
        device: Some(baseline.device.clone()),
        ..Default::default()
    };
    let report = match crate::whatif::what_if(trace, &opts) {
        Ok(r) => r,
        Err(e) => {
            not_available.push(format!("allocator settings: the trace cannot be replayed through the caching allocator ({e})"));
            return;
        }
    };
    let own = &report.settings[0];
    let better = |s: &&crate::whatif::SettingOutcome| {
        let avoids_oom = own.oom.is_some() && s.oom.is_none();
        s.oom.is_none() && (avoids_oom || -s.reserved_change_pct >= ALLOCATOR_MIN_SAVING_PCT)
    };
    let best = report.settings.iter().skip(1).filter(better).min_by_key(|s| (s.reserved_peak_bytes, s.allocated_peak_bytes));
    let tried = report
        .settings
        .iter()
        .skip(1)
        .map(|s| format!("{} {} ({:+.1} %)", s.alloc_conf, format_bytes(s.reserved_peak_bytes), s.reserved_change_pct))
        .collect::<Vec<_>>()
        .join(", ");
    let Some(best) = best else {
        let under = if baseline.fragmentation_at_peak > threshold {
            String::new()
        } else {
            format!(". That is under the {:.0} % from which it is worth a change", 100.0 * threshold)
        };
        notes.push(format!(
            "{text}{under}; no allocator setting saves {ALLOCATOR_MIN_SAVING_PCT:.0} % of the reserved peak ({}) in a replay: {tried}",
            format_bytes(own.reserved_peak_bytes)
        ));
        return;
    };
    let kind =
        if best.alloc_conf == "expandable_segments:True" { SuggestionKind::ExpandableSegments } else { SuggestionKind::AllocatorSetting };
    let why = match (&own.oom, &best.oom) {
        (Some(o), None) => format!(
            "; under the run's own settings a {} request runs out of the device's {} at {:.3} s, and with it every request fits",
            format_bytes(o.request_bytes),
            report.device_memory_bytes.map_or_else(|| "memory".to_owned(), format_bytes),
            o.at_s
        ),
        _ => String::new(),
    };
    let mut s = ctx.suggestion(
        kind,
        format!("PYTORCH_CUDA_ALLOC_CONF={}", best.alloc_conf),
        best.allocated_peak_bytes,
        format!(
            "{text}; replayed through PyTorch's caching allocator (`collector whatif`), {} gives a reserved peak of {}{} against {} ({:+.1} %), {} of it unused at the peak{why}. Tried: {tried}. Time is not predicted",
            best.alloc_conf,
            format_bytes(best.reserved_peak_bytes),
            best.reserved_peak_range_bytes.filter(|[lo, hi]| lo != hi).map_or_else(String::new, |[lo, hi]| format!(
                " ({} to {} by where the driver puts new segments)",
                format_bytes(lo),
                format_bytes(hi)
            )),
            format_bytes(own.reserved_peak_bytes),
            best.reserved_change_pct,
            format_bytes(best.reserved_unallocated_at_peak_bytes)
        ),
        vec![
            ("reserved_at_peak_bytes", reserved as f64),
            ("peak_reserved_bytes", baseline.peak_reserved_bytes as f64),
            ("replayed_reserved_peak_bytes", own.reserved_peak_bytes as f64),
            ("fragmentation_at_peak", baseline.fragmentation_at_peak),
        ],
    );
    s.meets_budget = ctx.budget.map(|b| best.reserved_peak_bytes <= b);
    out.push(Proposal::new(s, ReservedBy::Replayed { predicted: best.reserved_peak_bytes, own: own.reserved_peak_bytes }));
}
