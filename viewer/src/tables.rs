//! The sortable, filterable tables' machinery: the layer and activation-liveness columns, the
//! rows a filter and a sort select, and the clickable header (the section that shows them is
//! `components/tables.rs`).

use leptos::prelude::*;
use shared::analysis::profile::ActivationStats;
use shared::analysis::LayerMemoryStats;
use std::cmp::Ordering;

/// A column: its header in words, the field it shows (its name in the exports, which the
/// header's tooltip gives), and how to compare two rows by it.
pub struct Column<T> {
    pub name: &'static str,
    pub field: &'static str,
    pub cmp: fn(&T, &T) -> Ordering,
}

/// The layer table's columns.
pub const LAYER_COLUMNS: [Column<LayerMemoryStats>; 8] = [
    Column { name: "layer", field: "layer_name", cmp: |a, b| a.layer_name.cmp(&b.layer_name) },
    Column { name: "peak allocated", field: "peak_allocated", cmp: |a, b| a.peak_allocated.cmp(&b.peak_allocated) },
    Column { name: "peak reserved", field: "peak_reserved", cmp: |a, b| a.peak_reserved.cmp(&b.peak_reserved) },
    Column { name: "allocations", field: "total_allocations", cmp: |a, b| a.total_allocations.cmp(&b.total_allocations) },
    Column { name: "frees", field: "total_deallocations", cmp: |a, b| a.total_deallocations.cmp(&b.total_deallocations) },
    Column { name: "mean fragmentation", field: "avg_fragmentation", cmp: |a, b| a.avg_fragmentation.total_cmp(&b.avg_fragmentation) },
    Column { name: "time (ms)", field: "duration_ms", cmp: |a, b| a.duration_ms.total_cmp(&b.duration_ms) },
    Column {
        name: "allocated in total",
        field: "allocated_bytes_total",
        cmp: |a, b| a.allocated_bytes_total.cmp(&b.allocated_bytes_total),
    },
];

/// The activation-liveness table's columns.
pub const ACTIVATION_COLUMNS: [Column<ActivationStats>; 9] = [
    Column { name: "activation", field: "activation_name", cmp: |a, b| a.activation_name.cmp(&b.activation_name) },
    Column { name: "created at rank", field: "creation_rank", cmp: |a, b| a.creation_rank.cmp(&b.creation_rank) },
    Column { name: "last forward use", field: "last_fw_use_rank", cmp: |a, b| a.last_fw_use_rank.cmp(&b.last_fw_use_rank) },
    Column { name: "first backward use", field: "first_bw_use_rank", cmp: |a, b| a.first_bw_use_rank.cmp(&b.first_bw_use_rank) },
    Column { name: "last backward use", field: "last_bw_use_rank", cmp: |a, b| a.last_bw_use_rank.cmp(&b.last_bw_use_rank) },
    Column { name: "median size", field: "median_mem_size", cmp: |a, b| a.median_mem_size_bytes.cmp(&b.median_mem_size_bytes) },
    Column { name: "waits for backward", field: "inactive_time", cmp: |a, b| a.inactive_time_s.total_cmp(&b.inactive_time_s) },
    Column { name: "recompute time", field: "recomp_time", cmp: |a, b| a.recomp_time_s.total_cmp(&b.recomp_time_s) },
    Column { name: "recompute memory", field: "recomp_memory", cmp: |a, b| a.recomp_memory_bytes.cmp(&b.recomp_memory_bytes) },
];

/// Sort state: column index and descending.
pub type Sort = (usize, bool);

/// Rows matching `filter` (case-insensitive substring of `name`), sorted.
pub fn select<T: Clone>(rows: &[T], name: fn(&T) -> &str, filter: &str, cmp: fn(&T, &T) -> Ordering, descending: bool) -> Vec<T> {
    let f = filter.to_lowercase();
    let mut out: Vec<T> = rows.iter().filter(|r| f.is_empty() || name(r).to_lowercase().contains(&f)).cloned().collect();
    out.sort_by(|a, b| if descending { cmp(b, a) } else { cmp(a, b) });
    out
}

/// A table's header: a click on a column sorts by it (again: the other way); `extra`, a last
/// column that does not sort.
pub fn header<T: 'static>(columns: &'static [Column<T>], sort: RwSignal<Sort>, extra: Option<&'static str>) -> impl IntoView {
    view! {
        <thead><tr>
            {columns.iter().enumerate().map(|(i, c)| view! {
                <th class="sortable" on:click=move |_| sort.update(|s| *s = if s.0 == i { (i, !s.1) } else { (i, i != 0) })
                    title=format!("Sort by this column ({})", c.field)>
                    {c.name}
                    {move || { let s = sort.get(); (s.0 == i).then_some(if s.1 { " ▼" } else { " ▲" }) }}
                </th>
            }).collect_view()}
            {extra.map(|e| view! { <th>{e}</th> })}
        </tr></thead>
    }
}
