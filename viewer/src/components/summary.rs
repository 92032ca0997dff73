//! The summary card: the trace's peaks and when, fragmentation, counts, the importer's notes,
//! what the memory at the peak is for, each device's peaks, and the leak check.

use crate::charts;
use crate::widgets::percent;
use leptos::prelude::*;
use shared::analysis::holders::Why;
use shared::analysis::leaks::{LeakReport, MIN_ITERATIONS};
use shared::analysis::DevicePeak;
use shared::explore::Overview;
use shared::units::{format_bytes, format_seconds};
use std::sync::Arc;

/// The summary's (name, value) pairs. Reserved figures are "n/a" where reserved memory does
/// not exist (a CPU trace: its allocator caches nothing), as `collector summary` says.
fn fields(overview: &Overview) -> Vec<(&'static str, String)> {
    let s = &overview.summary;
    let na = s.reserved_not_applicable();
    let reserved = |v: String| if na { "n/a".to_owned() } else { v };
    vec![
        ("Peak allocated", format_bytes(s.peak_allocated_bytes)),
        // A peak outside every layer (a snapshot's frames name none there) shows its time alone.
        ("at", s.peak_layer.as_ref().map_or_else(|| format_seconds(s.peak_time_s), |l| format!("{} ({l})", format_seconds(s.peak_time_s)))),
        ("Peak reserved", if na { "n/a (the CPU allocator caches nothing)".to_owned() } else { format_bytes(s.peak_reserved_bytes) }),
        ("at", reserved(format_seconds(s.peak_reserved_time_s))),
        ("Average fragmentation", reserved(percent(s.avg_fragmentation))),
        ("Reserved but unused at the peak", reserved(format_bytes(overview.fragmentation.unused_reserved_at_peak_bytes))),
        ("Allocated at the end", format_bytes(s.final_allocated_bytes)),
        ("Reserved at the end", reserved(format_bytes(s.final_reserved_bytes))),
        ("Events", s.total_events.to_string()),
        ("Allocations / frees", format!("{} / {}", s.total_allocations, s.total_deallocations)),
        ("Layers", s.total_layers.to_string()),
        ("Operators", s.total_ops.to_string()),
        ("Dropped events", s.dropped_events.to_string()),
        ("Driver used at most", overview.driver_used_peak_bytes.map_or_else(|| "n/a (not sampled)".to_owned(), format_bytes)),
        (
            "Device at the peak",
            overview.ledger_at_peak.as_ref().map_or_else(|| "n/a (record with collector trace --ledger)".to_owned(), |l| l.line()),
        ),
        ("Duration", format_seconds(s.duration_s)),
    ]
}

/// What the memory at the peak is for: one coloured chip per category that holds any.
fn categories_at_peak(overview: &Overview) -> Option<impl IntoView> {
    overview.categories_at_peak.iter().any(|&(_, b)| b > 0).then(|| {
        let chips = overview
            .categories_at_peak
            .iter()
            .filter(|&&(_, b)| b > 0)
            .map(|&(c, b)| {
                let plotters::style::RGBColor(r, g, bl) = charts::category_colour(Some(c));
                view! {
                    <span class="chip" data-category=c.as_str() data-bytes=b.to_string()>
                        <span class="swatch" style=format!("background:rgb({r},{g},{bl})")></span>
                        {format!("{} {}", c.as_str().replace('_', " "), format_bytes(b))}
                    </span>
                }
            })
            .collect_view();
        view! { <p class="sub" id="categories-at-peak">"At the peak: " {chips}</p> }
    })
}

/// Who holds the bytes live at the peak, where the capture recorded holders: the same rows as
/// `collector summary`'s "held at the peak".
fn holders_at_peak(w: Why) -> impl IntoView {
    view! { <div id="holders-at-peak">
        <h3>"Held at the peak"</h3>
        <p class="sub">{format!("{} live: {}", format_bytes(w.live_bytes), w.shares())}</p>
        <table class="data">
            <thead><tr><th>"bytes"</th><th>"blocks"</th><th>"holder"</th><th>"name"</th><th>"module"</th></tr></thead>
            <tbody>
                {w.holders.into_iter().map(|g| view! {
                    <tr data-kind=g.kind.as_str()>
                        <td>{format_bytes(g.bytes)}</td>
                        <td>{g.blocks.to_string()}</td>
                        <td>{g.kind.as_str().replace('_', " ")}</td>
                        <td>{g.name}</td>
                        <td>{g.module}</td>
                    </tr>
                }).collect_view()}
            </tbody>
        </table>
    </div> }
}

/// Each device's peaks, for a trace of several.
fn devices_table(devices: Vec<DevicePeak>) -> impl IntoView {
    view! {
        <h3>"Devices"</h3>
        <table id="devices" class="data">
            <thead><tr><th>"device"</th><th>"peak allocated"</th><th>"at"</th><th>"peak reserved"</th><th>"events"</th></tr></thead>
            <tbody>
                {devices.into_iter().map(|d| view! {
                    <tr>
                        <td>{d.device}</td>
                        <td>{format_bytes(d.peak_allocated_bytes)}</td>
                        <td>{format_seconds(d.peak_time_s)}</td>
                        <td>{format_bytes(d.peak_reserved_bytes)}</td>
                        <td>{d.events.to_string()}</td>
                    </tr>
                }).collect_view()}
            </tbody>
        </table>
    }
}

/// The leak check's verdict and, when it found leaks, what is never freed.
fn leaks_view(leaks: LeakReport) -> impl IntoView {
    let verdict = if leaks.iterations < MIN_ITERATIONS {
        // The verdict already says how many were found, and from what.
        leaks.verdict.clone()
    } else {
        format!("{} ({} iterations from {}, {} as warm-up)", leaks.verdict, leaks.iterations, leaks.iterations_from, leaks.warmup)
    };
    view! { <div id="leaks">
        <h3>"Leaks"</h3>
        <p class=if leaks.leaking { "warning" } else { "sub" }>{verdict}</p>
        {(leaks.leaking && !leaks.survivors.is_empty()).then(|| view! {
            <table class="data">
                <thead><tr><th>"never freed in"</th><th>"operator"</th><th>"frame"</th><th>"bytes"</th><th>"per iteration"</th><th>"iterations"</th></tr></thead>
                <tbody>
                    {leaks.survivors.clone().into_iter().map(|g| view! {
                        <tr>
                            <td>{g.layer}</td>
                            <td>{g.op.unwrap_or_default()}</td>
                            <td>{g.frame.unwrap_or_default()}</td>
                            <td>{format_bytes(g.bytes)}</td>
                            <td>{format_bytes(g.bytes_per_iteration as u64)}</td>
                            <td>{g.iterations.to_string()}</td>
                        </tr>
                    }).collect_view()}
                </tbody>
            </table>
        })}
    </div> }
}

/// The summary card.
#[component]
pub fn SummarySection(
    /// The trace's overview.
    overview: Arc<Overview>,
) -> impl IntoView {
    let s = &overview.summary;
    let warnings = overview.profile.as_ref().map(|p| p.warnings.clone()).unwrap_or_default();
    // A merged trace's notes are the Ranks view's warnings.
    let notes = if overview.ranks.is_some() { Vec::new() } else { overview.notes.clone() };
    let devices = (overview.devices.len() > 1).then(|| overview.devices.clone());
    // Without events (a snapshot taken without its recorder) there is nothing to call a leak.
    let leaks = (s.total_events > 0).then(|| overview.leaks.clone());
    view! {
        <section class="card" id="summary">
            <h2>{overview.file_name.clone()}</h2>
            <p class="sub">
                {format!("{} · device {} · {}", s.source_format, overview.device, format_bytes(overview.file_bytes))}
            </p>
            <dl class="summary">
                {fields(&overview).into_iter().map(|(k, v)| view! { <div><dt>{k}</dt><dd>{v}</dd></div> }).collect_view()}
            </dl>
            {categories_at_peak(&overview)}
            {overview.allocator_settings.as_ref().map(|a| view! {
                <p class=if a.known { "sub" } else { "warning" } id="allocator-settings">
                    {format!("Allocator: {}", a.description)}
                    {a.notes.iter().map(|n| format!(" {n}.")).collect::<String>()}
                </p>
            })}
            {overview.compiled.as_ref().map(|c| view! {
                <p class="sub" id="compiled-code" title="Layers marked * hold allocations of compiled code, attributed by the modules of the FX nodes they come from">
                    {format!("Compiled code: {}", c.describe())}
                </p>
            })}
            {(s.dropped_events > 0).then(|| view! {
                <p class="warning">{format!("{} events were dropped by the recorder: totals after them come from the allocator's own counters, but per-layer counts are incomplete.", s.dropped_events)}</p>
            })}
            {warnings.into_iter().map(|w| view! { <p class="warning">{w}</p> }).collect_view()}
            {(!notes.is_empty()).then(|| view! {
                <ul class="import-notes" id="import-notes">{notes.into_iter().map(|n| view! { <li>{n}</li> }).collect_view()}</ul>
            })}
            {overview.holders_at_peak.clone().map(holders_at_peak)}
            {devices.map(devices_table)}
            {leaks.map(leaks_view)}
        </section>
    }
}
