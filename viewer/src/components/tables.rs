//! The layer statistics and activation liveness tables: sortable by any column, filterable by
//! name, with bars for peaks and lifetimes (the machinery is [`crate::tables`]).

use crate::tables::{header, select, ACTIVATION_COLUMNS, LAYER_COLUMNS};
use leptos::prelude::*;
use shared::analysis::profile::ActivationStats;
use shared::analysis::LayerMemoryStats;
use shared::explore::Overview;
use shared::units::{format_bytes, format_seconds};
use std::sync::Arc;

/// The layer table, its filter and count; its reserved figures "n/a" where reserved memory
/// does not exist (`reserved_na`: a CPU trace).
fn layer_table(layers: Arc<Vec<LayerMemoryStats>>, compiled: Arc<Vec<String>>, reserved_na: bool) -> impl IntoView {
    let reserved = move |v: String| if reserved_na { "n/a".to_owned() } else { v };
    let filter = RwSignal::new(String::new());
    let sort = RwSignal::new((1usize, true));
    let max_peak = layers.iter().map(|l| l.peak_allocated).max().unwrap_or(1).max(1) as f64;
    let n_layers = layers.len();
    let rows = Memo::new(move |_| {
        let (c, d) = sort.get();
        select(&layers, |l| &l.layer_name, &filter.get(), LAYER_COLUMNS[c].cmp, d)
    });
    view! {
        <div class="card-head">
            <h2>"Layers"</h2>
            <input type="search" id="layer-filter" placeholder="filter layers" on:input=move |ev| filter.set(event_target_value(&ev)) />
            <span class="hint" id="layer-count">{move || format!("{} of {n_layers} layers", rows.with(Vec::len))}</span>
        </div>
        {if n_layers == 0 {
            view! { <p class="hint">"This trace attributes no events to layers."</p> }.into_any()
        } else {
            view! {
                <div class="table-wrap">
                <table class="data" id="layer-table">
                    {header(&LAYER_COLUMNS, sort, None)}
                    <tbody>
                        {move || rows.get().into_iter().map(|l| view! {
                            <tr>
                                <td class="name" title=l.layer_name.clone()>
                                    {l.layer_name.clone()}
                                    {compiled.contains(&l.layer_name).then(|| view! {
                                        <span class="compiled" title="includes allocations of torch.compile'd code, attributed by its FX nodes' modules">" *"</span>
                                    })}
                                </td>
                                <td class="num"><span class="cell-bar" style=format!("width:{:.1}%", l.peak_allocated as f64 * 100.0 / max_peak)></span>{format_bytes(l.peak_allocated)}</td>
                                <td class="num">{reserved(format_bytes(l.peak_reserved))}</td>
                                <td class="num">{l.total_allocations}</td>
                                <td class="num">{l.total_deallocations}</td>
                                <td class="num">{reserved(format!("{:.1} %", l.avg_fragmentation * 100.0))}</td>
                                <td class="num">{format!("{:.3}", l.duration_ms)}</td>
                                <td class="num">
                                    {format_bytes(l.allocated_bytes_total)}
                                    {(l.private_pool_bytes > 0).then(|| view! {
                                        <span class="pooled" title="allocated in a private pool: a CUDA graph's memory for its replays, or a torch.cuda.MemPool">
                                            {format!(" ({} pooled)", format_bytes(l.private_pool_bytes))}
                                        </span>
                                    })}
                                </td>
                            </tr>
                        }).collect_view()}
                    </tbody>
                </table>
                </div>
            }.into_any()
        }}
    }
}

/// One activation's row, its lifetime bar over the iteration's `ranks`.
fn activation_row(a: ActivationStats, ranks: f64) -> impl IntoView {
    let pos = |r: usize| r as f64 * 100.0 / ranks;
    let bar = format!(
        "--a:{:.2}%;--b:{:.2}%;--c:{:.2}%;--d:{:.2}%",
        pos(a.creation_rank),
        pos(a.last_fw_use_rank),
        pos(a.first_bw_use_rank),
        pos(a.last_bw_use_rank + 1)
    );
    view! {
        <tr>
            <td class="name" title=a.activation_name.clone()>{a.activation_name.clone()}</td>
            <td class="num">{a.creation_rank}</td>
            <td class="num">{a.last_fw_use_rank}</td>
            <td class="num">{a.first_bw_use_rank}</td>
            <td class="num">{a.last_bw_use_rank}</td>
            <td class="num">{format_bytes(a.median_mem_size_bytes)}</td>
            <td class="num">{format_seconds(a.inactive_time_s)}</td>
            <td class="num">{format_seconds(a.recomp_time_s)}</td>
            <td class="num">{format_bytes(a.recomp_memory_bytes)}</td>
            <td class="lifetime"><span class="life" style=bar></span></td>
        </tr>
    }
}

/// The activation-liveness table, its filter and count; `why_none` where it has no rows.
fn activation_table(activations: Arc<Vec<ActivationStats>>, ranks: f64, why_none: String) -> impl IntoView {
    let filter = RwSignal::new(String::new());
    let sort = RwSignal::new((1usize, false));
    let n_acts = activations.len();
    let rows = Memo::new(move |_| {
        let (c, d) = sort.get();
        select(&activations, |a| &a.activation_name, &filter.get(), ACTIVATION_COLUMNS[c].cmp, d)
    });
    view! {
        <div class="card-head">
            <h2>"Activation liveness"</h2>
            <input type="search" id="activation-filter" placeholder="filter activations" on:input=move |ev| filter.set(event_target_value(&ev)) />
            <span class="hint">{move || format!("{} of {n_acts} activations", rows.with(Vec::len))}</span>
        </div>
        {if n_acts == 0 {
            view! { <p class="hint">{why_none}</p> }.into_any()
        } else {
            view! {
                <p class="sub">"Lifetime bar over the iteration's ranks: "
                    <span class="legend fw"></span>" created → last forward use, "
                    <span class="legend idle"></span>" waiting for backward, "
                    <span class="legend bw"></span>" backward uses."</p>
                <div class="table-wrap">
                <table class="data" id="activation-table">
                    {header(&ACTIVATION_COLUMNS, sort, Some("lifetime"))}
                    <tbody>{move || rows.get().into_iter().map(|a| activation_row(a, ranks)).collect_view()}</tbody>
                </table>
                </div>
            }.into_any()
        }}
    }
}

/// The layer and activation-liveness tables.
#[component]
pub fn Tables(
    /// The trace's overview (its layer statistics and graph profile).
    overview: Arc<Overview>,
) -> impl IntoView {
    let layers = Arc::new(overview.layers.clone());
    let activations = Arc::new(overview.profile.as_ref().map(|p| p.activations.clone()).unwrap_or_default());
    let ranks = overview.profile.as_ref().map_or(1, |p| p.nodes.len().max(1)) as f64;
    let not_derivable = overview.profile.as_ref().map(|p| p.not_derivable.join(" ")).unwrap_or_default();
    let why_none = if not_derivable.is_empty() {
        overview.profile_error.clone().unwrap_or_else(|| "No activations were found.".into())
    } else {
        not_derivable
    };
    view! {
        <section class="card" id="tables">
            {layer_table(layers, Arc::new(overview.compiled.as_ref().map(|c| c.modules.clone()).unwrap_or_default()), overview.summary.reserved_not_applicable())}
            {activation_table(activations, ranks, why_none)}
        </section>
    }
}
