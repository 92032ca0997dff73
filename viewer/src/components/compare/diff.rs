//! One diff of two traces (or two ranks), as `shared::analysis::diff` computed it: the notes
//! to read first, each side's peak and when, the change, both allocated curves on one aligned
//! x axis ([`super::chart`]), the layers that changed most, the per-class breakdown, and
//! operators on one side only.

use super::chart::DiffChart;
use leptos::prelude::*;
use shared::analysis::diff::{ClassSide, IterationPosition, LayerDiff, OpCount, Presence, SideFacts, TraceDiff};
use shared::units::{format_bytes, format_seconds};
use std::sync::Arc;

/// Layer rows shown, largest change first.
const LAYER_ROWS: usize = 20;
/// Operators listed per side.
const OP_ROWS: usize = 15;

/// A signed byte count: `+1.5 MiB`, `−121.8 MiB`, `0 B`.
pub fn signed_bytes(delta: i64) -> String {
    let sign = match delta.signum() {
        1 => "+",
        -1 => "−",
        _ => "",
    };
    format!("{sign}{}", format_bytes(delta.unsigned_abs()))
}

/// A signed count with its exact bytes: `−121.8 MiB (−127690752 B)`.
fn signed_bytes_exact(delta: i64) -> String {
    let sign = if delta < 0 {
        "−"
    } else if delta > 0 {
        "+"
    } else {
        ""
    };
    format!("{} ({sign}{} B)", signed_bytes(delta), delta.unsigned_abs())
}

/// When a side's peak happens: in the trace, and in its iteration where it has some.
fn when(f: &SideFacts) -> String {
    let at = format_seconds(f.peak_time_s);
    match f.peak_in_iteration {
        Some(IterationPosition { iteration, fraction, .. }) => format!("{at} (iteration {iteration}, {:.0} % in)", fraction * 100.0),
        None => at,
    }
}

/// One diff: the notes, the peaks, the curves, the layers, the classes and the operators.
/// Element ids start with `id` (`{id}-peaks`, `{id}-canvas`, ...), so two diffs can be on the
/// page (the Compare view and the Ranks view's).
#[component]
pub fn DiffView(
    /// What was compared.
    diff: Arc<TraceDiff>,
    /// Names of A and B.
    labels: (String, String),
    /// Prefix of the element ids.
    id: &'static str,
) -> impl IntoView {
    let d = diff;
    view! {
        {(!d.notes.is_empty()).then(|| view! {
            <ul class="notes" id=format!("{id}-notes")>
                {d.notes.iter().map(|n| view! { <li class="warning">{n.clone()}</li> }).collect_view()}
            </ul>
        })}
        {peak_table(&d, labels.clone(), id)}
        <DiffChart diff=d.clone() labels=labels id=id />
        {layer_rows(d.layers.clone(), d.layers_match, id)}
        {class_rows(&d, id)}
        {op_lists(&d, id)}
    }
}

/// Peaks, when they happen, and their change.
fn peak_table(diff: &TraceDiff, labels: (String, String), id: &'static str) -> impl IntoView {
    let (a, b) = (&diff.a, &diff.b);
    let bytes_cell = |v: u64| view! { <td class="num" data-bytes=v.to_string()>{format_bytes(v)}</td> };
    let delta_cell = |v: i64| view! { <td class="num delta" data-bytes=v.to_string()>{signed_bytes_exact(v)}</td> };
    view! {
        <table class="data diff-peaks" id=format!("{id}-peaks")>
            <thead><tr><th></th><th>"A: " {labels.0}</th><th>"B: " {labels.1}</th><th>"B − A"</th></tr></thead>
            <tbody>
                <tr class="peak-allocated"><td>"peak allocated"</td>{bytes_cell(a.peak_allocated_bytes)}{bytes_cell(b.peak_allocated_bytes)}{delta_cell(diff.peak_allocated_delta_bytes)}</tr>
                <tr class="peak-reserved"><td>"peak reserved"</td>{bytes_cell(a.peak_reserved_bytes)}{bytes_cell(b.peak_reserved_bytes)}{delta_cell(diff.peak_reserved_delta_bytes)}</tr>
                <tr><td>"allocated peak at"</td><td class="num">{when(a)}</td><td class="num">{when(b)}</td><td></td></tr>
                <tr><td>"device"</td><td>{a.device.clone().unwrap_or_else(|| "—".into())}</td><td>{b.device.clone().unwrap_or_else(|| "—".into())}</td><td></td></tr>
                <tr><td>"source"</td><td>{a.source_format.clone()}</td><td>{b.source_format.clone()}</td><td></td></tr>
                <tr><td>"events / operators"</td><td class="num">{format!("{} / {}", a.events, a.ops)}</td><td class="num">{format!("{} / {}", b.events, b.ops)}</td><td></td></tr>
                <tr><td>"iterations"</td><td class="num">{format!("{} ({})", a.iterations, a.iterations_from)}</td><td class="num">{format!("{} ({})", b.iterations, b.iterations_from)}</td><td></td></tr>
                <tr><td>"average fragmentation"</td><td class="num">{format!("{:.1} %", a.avg_fragmentation * 100.0)}</td><td class="num">{format!("{:.1} %", b.avg_fragmentation * 100.0)}</td><td></td></tr>
            </tbody>
        </table>
    }
}

fn presence(p: Presence) -> &'static str {
    match p {
        Presence::Both => "both",
        Presence::OnlyA => "only in A",
        Presence::OnlyB => "only in B",
    }
}

/// The layers that changed most.
fn layer_rows(rows: Vec<LayerDiff>, layers_match: bool, id: &'static str) -> impl IntoView {
    let total = rows.len();
    let peak = |s: Option<shared::analysis::diff::LayerSide>| s.map_or("—".to_owned(), |s| format_bytes(s.peak_allocated_bytes));
    view! {
        <h3>"Layers by change"</h3>
        {if total == 0 {
            view! { <p class="hint">"Neither side attributes memory to layers."</p> }.into_any()
        } else {
            view! {
                <p class="sub">{format!("{} of {total} layers, largest peak change first{}.", total.min(LAYER_ROWS), if layers_match { "" } else { "; the layer names differ between A and B" })}</p>
                <div class="table-wrap">
                <table class="data" id=format!("{id}-layers")>
                    <thead><tr><th>"layer"</th><th>"in"</th><th>"peak A"</th><th>"peak B"</th><th>"Δ peak"</th><th>"Δ allocated"</th><th>"Δ allocations"</th></tr></thead>
                    <tbody>
                        {rows.into_iter().take(LAYER_ROWS).map(|l| view! {
                            <tr>
                                <td class="name" title=l.layer_name.clone()>{l.layer_name.clone()}</td>
                                <td>{presence(l.presence)}</td>
                                <td class="num">{peak(l.a)}</td>
                                <td class="num">{peak(l.b)}</td>
                                <td class="num" data-bytes=l.peak_delta_bytes.to_string()>{signed_bytes(l.peak_delta_bytes)}</td>
                                <td class="num">{signed_bytes(l.allocated_delta_bytes)}</td>
                                <td class="num">{format!("{:+}", l.allocations_delta)}</td>
                            </tr>
                        }).collect_view()}
                    </tbody>
                </table>
                </div>
            }.into_any()
        }}
    }
}

fn class_reason(side: &str, c: &ClassSide) -> Option<String> {
    match c {
        ClassSide::Unavailable { reason } => Some(format!("{side}: {reason}")),
        ClassSide::Available { .. } => None,
    }
}

/// Bytes per tensor class at each side's peak rank, where both sides have them.
fn class_rows(diff: &TraceDiff, id: &'static str) -> impl IntoView {
    let classes = &diff.classes;
    let body = if classes.rows.is_empty() {
        let why: Vec<String> = [class_reason("A", &classes.a), class_reason("B", &classes.b)].into_iter().flatten().collect();
        view! { <p class="hint">"No per-class breakdown: " {why.join("; ")}</p> }.into_any()
    } else {
        view! {
            <table class="data" id=format!("{id}-classes")>
                <thead><tr><th>"class"</th><th>"A"</th><th>"B"</th><th>"B − A"</th></tr></thead>
                <tbody>
                    {classes.rows.iter().map(|r| view! {
                        <tr>
                            <td>{r.class.as_str()}</td>
                            <td class="num">{format_bytes(r.a_bytes)}</td>
                            <td class="num">{format_bytes(r.b_bytes)}</td>
                            <td class="num">{signed_bytes(r.delta_bytes)}</td>
                        </tr>
                    }).collect_view()}
                </tbody>
            </table>
        }
        .into_any()
    };
    view! { <h3>"Memory by tensor class at the peak"</h3> {body} }
}

fn op_list(title: String, ops: &[OpCount], list_id: String) -> impl IntoView {
    view! {
        <div>
            <h3>{title}</h3>
            <ul class="ops" id=list_id>
                {ops.iter().take(OP_ROWS).map(|o| view! { <li><code>{o.name.clone()}</code> " ×" {o.count}</li> }).collect_view()}
                {(ops.len() > OP_ROWS).then(|| view! { <li class="hint">{format!("and {} more", ops.len() - OP_ROWS)}</li> })}
            </ul>
        </div>
    }
}

/// Operators that run on one side only.
fn op_lists(diff: &TraceDiff, id: &'static str) -> impl IntoView {
    match &diff.ops {
        None => view! { <h3>"Operators"</h3> <p class="hint">"Operator lists need operator data on both sides."</p> }.into_any(),
        Some(ops) => view! {
            <div class="op-lists">
                {op_list(format!("Only in A ({})", ops.only_in_a.len()), &ops.only_in_a, format!("{id}-only-a"))}
                {op_list(format!("Only in B ({})", ops.only_in_b.len()), &ops.only_in_b, format!("{id}-only-b"))}
            </div>
            <p class="sub">{format!("{} operators run on both sides.", ops.common)}</p>
        }
        .into_any(),
    }
}
