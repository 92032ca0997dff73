//! The answers the page gives besides pictures: why a run ran out of memory (shown first when
//! it did) and what to change so it needs less (`shared::analysis::advice`, asked of the
//! worker with an optional budget).

use crate::{bridge, AppState};
use leptos::prelude::*;
use shared::analysis::advice::AdviceReport;
use shared::analysis::oom::{OomGroup, OomReport};
use shared::explore::{Request, Response};
use shared::units::{format_bytes, parse_size};
use std::sync::Arc;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

/// The out-of-memory explanation: the verdict, then what was live by layer, phase and frame.
#[component]
pub fn OomSection(oom: Arc<OomReport>) -> impl IntoView {
    let table = |title: &'static str, groups: Vec<OomGroup>| {
        (!groups.is_empty()).then(|| {
            view! {
                <table class="data">
                    <thead><tr><th>{title}</th><th>"bytes"</th><th>"allocations"</th></tr></thead>
                    <tbody>
                        {groups.into_iter().map(|g| view! {
                            <tr><td>{g.name}</td><td data-bytes=g.bytes.to_string()>{format_bytes(g.bytes)}</td><td>{g.allocations.to_string()}</td></tr>
                        }).collect_view()}
                    </tbody>
                </table>
            }
        })
    };
    let free = oom.largest_free_block_bytes.map(|b| format!(" · largest free block {}", format_bytes(b)));
    view! {
        <section class="card oom" id="oom">
            <h2>"Out of memory"</h2>
            <p class="warning" id="oom-verdict">{oom.verdict.clone()}</p>
            <p class="sub">
                {format!(
                    "requested {} · allocated {} · reserved {} · reserved but unused {}",
                    format_bytes(oom.requested_bytes),
                    format_bytes(oom.allocated_bytes),
                    format_bytes(oom.reserved_bytes),
                    format_bytes(oom.unused_reserved_bytes)
                )}
                {free}
                {(oom.ooms > 1).then(|| format!(" · {} out-of-memory events, the first explained", oom.ooms))}
            </p>
            <div class="oom-tables">
                {table("live, by layer", oom.by_layer.clone())}
                {table("by the phase that allocated it", oom.by_phase.clone())}
                {table("by innermost frame", oom.by_frame.clone())}
            </div>
        </section>
    }
}

/// Traces with more events than this get their advice when its section comes into view:
/// replaying them takes about a second per 10 M events, which would hold up the first zoom.
const ADVISE_ON_SIGHT_EVENTS: u64 = 200_000;

/// Advice: ranked changes with their predicted peaks; a budget asks again.
#[component]
pub fn AdviceSection(events: u64) -> impl IntoView {
    let state = expect_context::<AppState>();
    let report: RwSignal<Option<Arc<AdviceReport>>> = RwSignal::new(None);
    let busy = RwSignal::new(false);
    let budget_text = RwSignal::new(String::new());
    let ask = move |budget: Option<u64>| {
        busy.set(true);
        bridge::ask_when_idle(Request::Advice { budget_bytes: budget }, move |r| {
            busy.set(false);
            match r {
                Response::Advice(a) => report.set(Some(Arc::new(*a))),
                Response::Error { message } => state.error.set(Some(("the advice".into(), message))),
                _ => {}
            }
        });
    };
    let section = NodeRef::<leptos::html::Section>::new();
    if events <= ADVISE_ON_SIGHT_EVENTS {
        ask(None);
    } else {
        Effect::new(move |_| {
            let Some(el) = section.get() else { return };
            let asked = std::rc::Rc::new(std::cell::Cell::new(false));
            let on_sight = Closure::<dyn FnMut(js_sys::Array, web_sys::IntersectionObserver)>::new(
                move |entries: js_sys::Array, observer: web_sys::IntersectionObserver| {
                    let seen = entries.iter().any(|e| e.unchecked_into::<web_sys::IntersectionObserverEntry>().is_intersecting());
                    if seen && !asked.replace(true) {
                        observer.disconnect();
                        ask(None);
                    }
                },
            );
            if let Ok(observer) = web_sys::IntersectionObserver::new(on_sight.as_ref().unchecked_ref()) {
                observer.observe(&el);
            }
            on_sight.forget(); // one per report shown; it lets go of the observer once used
        });
    }
    let on_submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let text = budget_text.get_untracked();
        if text.trim().is_empty() {
            return ask(None);
        }
        match parse_size(text.trim()) {
            Ok(b) => ask(Some(b)),
            Err(e) => state.error.set(Some(("the budget".into(), e.to_string()))),
        }
    };
    view! {
        <section class="card" id="advice" node_ref=section>
            <div class="card-head">
                <h2>"Advice"</h2>
                <form class="inline" on:submit=on_submit>
                    <label>"Budget " <input id="advice-budget" type="text" size="8" placeholder="e.g. 6GiB"
                        on:input=move |ev| budget_text.set(event_target_value(&ev)) /></label>
                    <button type="submit" id="advice-button" disabled=move || busy.get()>"Advise"</button>
                </form>
            </div>
            {move || match report.get() {
                Some(r) => view! { <AdviceView report=r /> }.into_any(),
                None if busy.get() => view! { <p class="hint">"Replaying the trace with each change…"</p> }.into_any(),
                None => view! { <p class="hint">"Computed when this section comes into view."</p> }.into_any(),
            }}
        </section>
    }
}

#[component]
fn AdviceView(report: Arc<AdviceReport>) -> impl IntoView {
    let measured = report.baseline.peak_allocated_bytes;
    let budget = report.budget_bytes.map(|b| {
        let met = match report.budget_met {
            Some(true) => "can be met",
            Some(false) => "cannot be met",
            None => "",
        };
        format!("budget {} {met}", format_bytes(b))
    });
    view! {
        <p class="sub">
            {format!("measured peak {} on {}", format_bytes(measured), report.baseline.device)}
            {report.baseline.iteration_time_s.map(|t| format!(" · iteration {:.1} ms", t * 1e3))}
            {budget.map(|b| format!(" · {b}"))}
        </p>
        {report.notes.iter().map(|n| view! { <p class="warning">{n.clone()}</p> }).collect_view()}
        <table class="data" id="advice-table">
            <thead><tr><th>"#"</th><th>"change"</th><th>"predicted peak"</th><th>"vs measured"</th><th>"extra time / iteration"</th></tr></thead>
            <tbody>
                {report.suggestions.iter().enumerate().map(|(k, s)| {
                    let delta = s.predicted_peak_bytes as i128 - measured as i128;
                    let pct = if measured > 0 { delta as f64 / measured as f64 * 100.0 } else { 0.0 };
                    let sign = if delta < 0 { "−" } else { "+" };
                    view! {
                        <tr class=if s.meets_budget == Some(true) { "meets" } else { "" } title=s.reasoning.clone()>
                            <td>{(k + 1).to_string()}</td>
                            <td>{s.change.clone()}</td>
                            <td data-bytes=s.predicted_peak_bytes.to_string()>{format_bytes(s.predicted_peak_bytes)}</td>
                            <td>{format!("{sign}{} ({pct:+.1} %)", format_bytes(delta.unsigned_abs() as u64))}</td>
                            <td>{s.extra_time_per_iteration_s.map_or_else(|| "—".into(), |t| format!("+{:.1} ms", t * 1e3))}</td>
                        </tr>
                    }
                }).collect_view()}
            </tbody>
        </table>
        {(!report.not_available.is_empty()).then(|| view! {
            <h3>"Not available"</h3>
            <ul class="hint">{report.not_available.iter().map(|n| view! { <li>{n.clone()}</li> }).collect_view()}</ul>
        })}
    }
}
