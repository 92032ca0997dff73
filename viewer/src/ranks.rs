//! The Ranks view of a merged trace: one allocated-memory curve per rank on shared axes, the
//! peak of every rank, the ranks missing from the job, a selector that shows one rank in every
//! other view (the worker swaps to that rank's own trace), and the two most different ranks
//! compared.

use crate::charts;
use crate::compare::DiffView;
use crate::widgets::png_button;
use crate::{bridge, fit_canvas, perf, AppState};
use leptos::html::Canvas;
use leptos::prelude::*;
use shared::analysis::diff::TraceDiff;
use shared::explore::{RankCurve, RankDevice, RankSet, Request, Response};
use shared::units::{format_bytes, format_seconds};
use std::sync::Arc;

/// Height of one rank's panel, in CSS pixels.
fn panel_height(ranks: usize) -> u32 {
    if ranks <= 8 {
        110
    } else {
        70
    }
}

/// Shows `rank` (or every rank) in every view: the worker swaps traces and answers with the
/// new overview.
fn show_rank(state: AppState, rank: Option<u32>) {
    let what = rank.map_or("every rank".to_owned(), |r| format!("rank {r}"));
    state.begin_loading(&what);
    state.loading.set(Some((what.clone(), "analysing".into())));
    bridge::ask(&Request::ShowRank { rank }, move |r| match r {
        Response::Overview(o) => state.finish_loading(*o),
        Response::Error { message } => {
            state.loading.set(None);
            state.error.set(Some((what, message)));
        }
        _ => state.loading.set(None),
    });
}

/// The Ranks card.
#[component]
pub fn RanksSection(
    /// The merged trace's ranks.
    ranks: Arc<RankSet>,
) -> impl IntoView {
    let state = expect_context::<AppState>();
    let selected = ranks.selected;
    let mut rank_numbers: Vec<u32> = ranks.devices.iter().map(|d| d.rank).collect();
    rank_numbers.dedup();
    let on_select = move |ev: leptos::ev::Event| {
        let value = event_target_value(&ev);
        show_rank(state, value.parse::<u32>().ok());
    };
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
            <PeakTable ranks=ranks.clone() />
            <Missing ranks=ranks.clone() />
            <MostDifferent ranks=ranks />
        </section>
    }
}

/// The small multiples, one panel per rank's device.
#[component]
fn RankCurves(ranks: Arc<RankSet>) -> impl IntoView {
    let state = expect_context::<AppState>();
    let canvas = NodeRef::<Canvas>::new();
    let curves: RwSignal<Option<(f64, Arc<Vec<RankCurve>>)>> = RwSignal::new(None);
    let height = panel_height(ranks.devices.len()) * ranks.devices.len().max(1) as u32;
    Effect::new(move |_| {
        let Some(c) = canvas.get() else { return };
        fit_canvas(&c, height);
        bridge::ask(&Request::RankCurves { buckets: c.width().max(200) as usize }, move |r| match r {
            Response::RankCurves { end_s, curves: got } => curves.set(Some((end_s, Arc::new(got)))),
            Response::Error { message } => state.error.set(Some(("the rank curves".into(), message))),
            _ => {}
        });
    });
    let highest = ranks.highest_device;
    Effect::new(move |_| {
        let pal = state.palette();
        let Some(c) = canvas.get() else { return };
        curves.with(|got| {
            let Some((end_s, got)) = got else { return };
            fit_canvas(&c, height);
            match charts::draw_rank_curves(&c, &pal, *end_s, got, highest) {
                Ok(_) => perf::drawn("ranks"),
                Err(e) => state.error.set(Some(("the rank curves".into(), e))),
            }
        });
    });
    view! {
        <div class="card-head"><span class="spacer"></span>{png_button(canvas, "ranks")}</div>
        <div class="chart-wrap"><canvas class="chart" id="ranks-canvas" node_ref=canvas></canvas></div>
    }
}

/// Every rank's peaks.
#[component]
fn PeakTable(ranks: Arc<RankSet>) -> impl IntoView {
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
#[component]
fn Missing(ranks: Arc<RankSet>) -> impl IntoView {
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

/// The two ranks whose peaks differ most, compared on demand (the diff runs in the worker).
#[component]
fn MostDifferent(ranks: Arc<RankSet>) -> impl IntoView {
    let state = expect_context::<AppState>();
    let (a, b) = ranks.most_different;
    let name = |k: u8| ranks.devices.iter().find(|d| d.device_index == k).map_or_else(|| format!("device {k}"), |d| d.device.clone());
    let labels = (name(a), name(b));
    let result: RwSignal<Option<Arc<TraceDiff>>> = RwSignal::new(None);
    let busy = RwSignal::new(false);
    let compare = move |_| {
        busy.set(true);
        bridge::ask(&Request::DiffDevices { a, b }, move |r| {
            busy.set(false);
            match r {
                Response::Diff(d) => result.set(Some(Arc::new(*d))),
                Response::Error { message } => state.error.set(Some(("the rank comparison".into(), message))),
                _ => {}
            }
        });
    };
    let button_text = format!("Compare {} with {}", labels.0, labels.1);
    view! {
        <div class="card-head">
            <h3>"The two most different ranks"</h3>
            <span class="hint">"highest and lowest allocated peak"</span>
            <button id="rank-diff-button" on:click=compare disabled=move || busy.get()>{button_text}</button>
        </div>
        {move || result.get().map(|d| view! { <DiffView diff=d labels=labels.clone() id="rank-diff" /> })}
    }
}
