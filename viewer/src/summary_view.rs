//! The summary panel and the top-layers table of a loaded trace.

use leptos::prelude::*;
use shared::analysis::{layer_stats, summary, top_layers_by_peak};
use shared::units::{format_bytes, format_seconds};

/// Peak, fragmentation and counts, then the layers with the highest peaks.
#[component]
pub fn SummaryView(
    /// Name of the opened file.
    file_name: String,
    /// The imported trace.
    trace: std::sync::Arc<shared::Trace>,
) -> impl IntoView {
    let s = summary(&trace);
    let stats = layer_stats(&trace);
    let rows: Vec<_> = top_layers_by_peak(&stats, 20)
        .into_iter()
        .map(|l| {
            view! {
                <tr>
                    <td>{l.layer_name.clone()}</td>
                    <td class="num">{format_bytes(l.peak_allocated)}</td>
                    <td class="num">{format_bytes(l.peak_reserved)}</td>
                    <td class="num">{l.total_allocations}</td>
                    <td class="num">{l.total_deallocations}</td>
                    <td class="num">{format!("{:.1} %", l.avg_fragmentation * 100.0)}</td>
                    <td class="num">{format_seconds(l.duration_ms / 1000.0)}</td>
                </tr>
            }
        })
        .collect();
    let device = trace.meta.device_name.clone().or(s.peak_device.clone()).unwrap_or_default();
    view! {
        <section class="summary">
            <h2>{file_name}</h2>
            <dl>
                <dt>"Source"</dt><dd>{s.source_format} " · " {device}</dd>
                <dt>"Peak allocated"</dt>
                <dd id="peak-allocated" data-bytes=s.peak_allocated_bytes.to_string()>
                    {format_bytes(s.peak_allocated_bytes)} " at " {format_seconds(s.peak_time_s)}
                    {s.peak_layer.clone().map(|l| format!(" in {l}")).unwrap_or_default()}
                </dd>
                <dt>"Peak reserved"</dt><dd>{format_bytes(s.peak_reserved_bytes)}</dd>
                <dt>"Average fragmentation"</dt><dd>{format!("{:.1} %", s.avg_fragmentation * 100.0)}</dd>
                <dt>"Events"</dt>
                <dd>{s.total_events} " (" {s.total_allocations} " allocations, " {s.total_deallocations} " frees), "
                    {s.total_ops} " ops, " {s.total_layers} " layers, " {s.dropped_events} " dropped"</dd>
            </dl>
            <h3>"Top layers by peak allocated"</h3>
            <table class="layers">
                <thead><tr><th>"layer"</th><th>"peak allocated"</th><th>"peak reserved"</th><th>"allocs"</th><th>"frees"</th><th>"fragmentation"</th><th>"time"</th></tr></thead>
                <tbody>{rows}</tbody>
            </table>
        </section>
    }
}
