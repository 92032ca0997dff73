//! The Ranks view of a merged trace: one allocated-memory curve per rank on shared axes
//! ([`curves`]), the peak of every rank, the ranks missing from the job, a picker that shows
//! one rank in every other view (the worker swaps to that rank's own trace), and the two most
//! different ranks compared ([`diff`]).

mod curves;
mod diff;

use crate::bridge;
use crate::state::Loader;
use curves::RankCurves;
use diff::MostDifferent;
use leptos::prelude::*;
use shared::explore::{RankDevice, RankSet};
use shared::units::{format_bytes, format_seconds};
use std::sync::Arc;

/// Every rank's peaks, the highest starred.
fn peak_table(ranks: &RankSet) -> impl IntoView {
    let highest = ranks.highest_device;
    let row = |d: &RankDevice| {
        let top = d.device_index == highest;
        view! {
            <tr class:highest=top>
                <td class="num">{d.rank}</td>
                <td>{d.device.clone()}</td>
                <td class="num" data-bytes=d.peak_allocated_bytes.to_string()>{format_bytes(d.peak_allocated_bytes)}{top.then_some(" ★")}</td>
                <td class="num" data-bytes=d.peak_reserved_bytes.to_string()>{format_bytes(d.peak_reserved_bytes)}</td>
                <td class="num">{format_seconds(d.peak_time_s)}</td>
                <td class="name" title=d.peak_layer.clone()>{if d.peak_layer.is_empty() { "—".to_owned() } else { d.peak_layer.clone() }}</td>
                <td class="num">{d.events}</td>
            </tr>
        }
    };
    let rows: Vec<_> = ranks.devices.iter().map(row).collect();
    view! {
        <table class="data" id="rank-peaks">
            <thead><tr><th>"rank"</th><th>"device"</th><th>"peak allocated"</th><th>"peak reserved"</th><th>"at"</th><th>"layer at the peak"</th><th>"events"</th></tr></thead>
            <tbody>{rows}</tbody>
        </table>
    }
}

/// Ranks of the job without a file, and the merge's warnings.
fn missing(ranks: &RankSet) -> impl IntoView {
    let missing: Vec<String> = ranks.missing_ranks.iter().map(u32::to_string).collect();
    view! {
        {(!missing.is_empty()).then(|| view! {
            <p class="warning" id="missing-ranks">{format!("Missing ranks: {} (no file was given for them).", missing.join(", "))}</p>
        })}
        {(!ranks.warnings.is_empty()).then(|| view! {
            <ul class="notes" id="rank-warnings">
                {ranks.warnings.iter().map(|w| view! { <li class="warning">{w.clone()}</li> }).collect_view()}
            </ul>
        })}
    }
}

/// The Ranks card.
#[component]
pub fn RanksSection(
    /// The merged trace's ranks.
    ranks: Arc<RankSet>,
    /// Swaps the trace shown when a rank is picked.
    loader: Loader,
) -> impl IntoView {
    let selected = ranks.selected;
    let mut rank_numbers: Vec<u32> = ranks.devices.iter().map(|d| d.rank).collect();
    rank_numbers.dedup();
    let on_select = move |ev: leptos::ev::Event| bridge::show_rank(loader, event_target_value(&ev).parse::<u32>().ok());
    let highest = ranks.devices.iter().find(|d| d.device_index == ranks.highest_device).map(|d| d.rank);
    view! {
        <section class="card" id="ranks">
            <div class="card-head">
                <h2>"Ranks"</h2>
                <label class="hint">"Show in every view: "
                    <select id="rank-select" on:change=on_select>
                        <option value="all" selected=selected.is_none()>"all ranks"</option>
                        {rank_numbers.into_iter().map(|r| view! {
                            <option value=r.to_string() selected=selected == Some(r)>{format!("rank {r}")}</option>
                        }).collect_view()}
                    </select>
                </label>
                <span class="spacer"></span>
            </div>
            <RankCurves ranks=ranks.clone() />
            <p class="sub">{format!(
                "{} ranks, one allocated-memory curve each, on the same time axis and byte scale; rank {} has the highest peak (marked).",
                ranks.devices.len(),
                highest.map_or("—".into(), |r| r.to_string())
            )}</p>
            {peak_table(&ranks)}
            {missing(&ranks)}
            <MostDifferent ranks=ranks />
        </section>
    }
}
