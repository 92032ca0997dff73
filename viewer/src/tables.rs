//! The layer statistics and activation liveness tables: sortable by any column, filterable by
//! name, with bars for peaks and lifetimes.

use leptos::prelude::*;
use shared::analysis::profile::ActivationStats;
use shared::analysis::LayerMemoryStats;
use shared::explore::Overview;
use shared::units::{format_bytes, format_seconds};
use std::cmp::Ordering;
use std::sync::Arc;

/// A column: header, how to compare two rows, and whether it is numeric.
struct Column<T> {
    name: &'static str,
    cmp: fn(&T, &T) -> Ordering,
}

const LAYER_COLUMNS: [Column<LayerMemoryStats>; 8] = [
    Column { name: "layer_name", cmp: |a, b| a.layer_name.cmp(&b.layer_name) },
    Column { name: "peak_allocated", cmp: |a, b| a.peak_allocated.cmp(&b.peak_allocated) },
    Column { name: "peak_reserved", cmp: |a, b| a.peak_reserved.cmp(&b.peak_reserved) },
    Column { name: "total_allocations", cmp: |a, b| a.total_allocations.cmp(&b.total_allocations) },
    Column { name: "total_deallocations", cmp: |a, b| a.total_deallocations.cmp(&b.total_deallocations) },
    Column { name: "avg_fragmentation", cmp: |a, b| a.avg_fragmentation.total_cmp(&b.avg_fragmentation) },
    Column { name: "duration_ms", cmp: |a, b| a.duration_ms.total_cmp(&b.duration_ms) },
    Column { name: "allocated_bytes_total", cmp: |a, b| a.allocated_bytes_total.cmp(&b.allocated_bytes_total) },
];

const ACTIVATION_COLUMNS: [Column<ActivationStats>; 9] = [
    Column { name: "activation_name", cmp: |a, b| a.activation_name.cmp(&b.activation_name) },
    Column { name: "creation_rank", cmp: |a, b| a.creation_rank.cmp(&b.creation_rank) },
    Column { name: "last_fw_use_rank", cmp: |a, b| a.last_fw_use_rank.cmp(&b.last_fw_use_rank) },
    Column { name: "first_bw_use_rank", cmp: |a, b| a.first_bw_use_rank.cmp(&b.first_bw_use_rank) },
    Column { name: "last_bw_use_rank", cmp: |a, b| a.last_bw_use_rank.cmp(&b.last_bw_use_rank) },
    Column { name: "median_mem_size", cmp: |a, b| a.median_mem_size_bytes.cmp(&b.median_mem_size_bytes) },
    Column { name: "inactive_time", cmp: |a, b| a.inactive_time_s.total_cmp(&b.inactive_time_s) },
    Column { name: "recomp_time", cmp: |a, b| a.recomp_time_s.total_cmp(&b.recomp_time_s) },
    Column { name: "recomp_memory", cmp: |a, b| a.recomp_memory_bytes.cmp(&b.recomp_memory_bytes) },
];

/// Sort state: column index and descending.
type Sort = (usize, bool);

/// Rows matching `filter` (case-insensitive substring of `name`), sorted.
pub fn select<T: Clone>(rows: &[T], name: fn(&T) -> &str, filter: &str, cmp: fn(&T, &T) -> Ordering, descending: bool) -> Vec<T> {
    let f = filter.to_lowercase();
    let mut out: Vec<T> = rows.iter().filter(|r| f.is_empty() || name(r).to_lowercase().contains(&f)).cloned().collect();
    out.sort_by(|a, b| if descending { cmp(b, a) } else { cmp(a, b) });
    out
}

fn header<T: 'static>(columns: &'static [Column<T>], sort: RwSignal<Sort>, extra: Option<&'static str>) -> impl IntoView {
    view! {
        <thead><tr>
            {columns.iter().enumerate().map(|(i, c)| view! {
                <th class="sortable" on:click=move |_| sort.update(|s| *s = if s.0 == i { (i, !s.1) } else { (i, i != 0) })
                    title="Sort by this column">
                    {c.name}
                    {move || { let s = sort.get(); (s.0 == i).then_some(if s.1 { " ▼" } else { " ▲" }) }}
                </th>
            }).collect_view()}
            {extra.map(|e| view! { <th>{e}</th> })}
        </tr></thead>
    }
}

#[component]
pub fn Tables(overview: Arc<Overview>) -> impl IntoView {
    let layers = Arc::new(overview.layers.clone());
    let activations = Arc::new(overview.profile.as_ref().map(|p| p.activations.clone()).unwrap_or_default());
    let ranks = overview.profile.as_ref().map_or(1, |p| p.nodes.len().max(1)) as f64;
    let not_derivable = overview.profile.as_ref().map(|p| p.not_derivable.join(" ")).unwrap_or_default();
    let layer_filter = RwSignal::new(String::new());
    let layer_sort = RwSignal::new((1usize, true));
    let act_filter = RwSignal::new(String::new());
    let act_sort = RwSignal::new((1usize, false));
    let max_peak = layers.iter().map(|l| l.peak_allocated).max().unwrap_or(1).max(1) as f64;
    let l2 = layers.clone();
    let layer_rows = Memo::new(move |_| {
        let (c, d) = layer_sort.get();
        select(&l2, |l| &l.layer_name, &layer_filter.get(), LAYER_COLUMNS[c].cmp, d)
    });
    let a2 = activations.clone();
    let act_rows = Memo::new(move |_| {
        let (c, d) = act_sort.get();
        select(&a2, |a| &a.activation_name, &act_filter.get(), ACTIVATION_COLUMNS[c].cmp, d)
    });
    let n_layers = layers.len();
    let n_acts = activations.len();
    view! {
        <section class="card" id="tables">
            <div class="card-head">
                <h2>"Layers"</h2>
                <input type="search" id="layer-filter" placeholder="filter layers" on:input=move |ev| layer_filter.set(event_target_value(&ev)) />
                <span class="hint" id="layer-count">{move || format!("{} of {n_layers} layers", layer_rows.with(Vec::len))}</span>
            </div>
            {if n_layers == 0 {
                view! { <p class="hint">"This trace attributes no events to layers."</p> }.into_any()
            } else {
                view! {
                    <div class="table-wrap">
                    <table class="data" id="layer-table">
                        {header(&LAYER_COLUMNS, layer_sort, None)}
                        <tbody>
                            {move || layer_rows.get().into_iter().map(|l| view! {
                                <tr>
                                    <td class="name" title=l.layer_name.clone()>{l.layer_name.clone()}</td>
                                    <td class="num"><span class="cell-bar" style=format!("width:{:.1}%", l.peak_allocated as f64 * 100.0 / max_peak)></span>{format_bytes(l.peak_allocated)}</td>
                                    <td class="num">{format_bytes(l.peak_reserved)}</td>
                                    <td class="num">{l.total_allocations}</td>
                                    <td class="num">{l.total_deallocations}</td>
                                    <td class="num">{format!("{:.1} %", l.avg_fragmentation * 100.0)}</td>
                                    <td class="num">{format!("{:.3}", l.duration_ms)}</td>
                                    <td class="num">{format_bytes(l.allocated_bytes_total)}</td>
                                </tr>
                            }).collect_view()}
                        </tbody>
                    </table>
                    </div>
                }.into_any()
            }}
            <div class="card-head">
                <h2>"Activation liveness"</h2>
                <input type="search" id="activation-filter" placeholder="filter activations" on:input=move |ev| act_filter.set(event_target_value(&ev)) />
                <span class="hint">{move || format!("{} of {n_acts} activations", act_rows.with(Vec::len))}</span>
            </div>
            {if n_acts == 0 {
                let why = if not_derivable.is_empty() { overview.profile_error.clone().unwrap_or_else(|| "No activations were found.".into()) } else { not_derivable.clone() };
                view! { <p class="hint">{why}</p> }.into_any()
            } else {
                view! {
                    <p class="sub">"Lifetime bar over the iteration's ranks: "
                        <span class="legend fw"></span>" created → last forward use, "
                        <span class="legend idle"></span>" waiting for backward, "
                        <span class="legend bw"></span>" backward uses."</p>
                    <div class="table-wrap">
                    <table class="data" id="activation-table">
                        {header(&ACTIVATION_COLUMNS, act_sort, Some("lifetime"))}
                        <tbody>
                            {move || act_rows.get().into_iter().map(|a| {
                                let pos = |r: usize| r as f64 * 100.0 / ranks;
                                let bar = format!(
                                    "--a:{:.2}%;--b:{:.2}%;--c:{:.2}%;--d:{:.2}%",
                                    pos(a.creation_rank), pos(a.last_fw_use_rank), pos(a.first_bw_use_rank), pos(a.last_bw_use_rank + 1)
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
                            }).collect_view()}
                        </tbody>
                    </table>
                    </div>
                }.into_any()
            }}
        </section>
    }
}
