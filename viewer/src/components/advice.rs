//! What to change so the run needs less memory (`shared::analysis::advice`, asked of the
//! worker with an optional budget): ranked changes with their predicted peaks and extra time.

use crate::bridge;
use crate::state::Errors;
use leptos::prelude::*;
use shared::analysis::advice::AdviceReport;
use shared::explore::{Request, Response};
use shared::units::{format_bytes, parse_size};
use std::sync::Arc;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

/// Traces with more events than this get their advice when its section comes into view:
/// replaying them takes about a second per 10 M events, which would hold up the first zoom.
const ADVISE_ON_SIGHT_EVENTS: u64 = 200_000;

/// Runs `ask` once, when `section` first comes into view.
fn when_seen(section: NodeRef<leptos::html::Section>, ask: impl Fn() + 'static) {
    let ask = std::rc::Rc::new(ask);
    Effect::new(move |_| {
        let Some(el) = section.get() else { return };
        let asked = std::rc::Rc::new(std::cell::Cell::new(false));
        let ask = ask.clone();
        let on_sight = Closure::<dyn FnMut(js_sys::Array, web_sys::IntersectionObserver)>::new(
            move |entries: js_sys::Array, observer: web_sys::IntersectionObserver| {
                let seen = entries.iter().any(|e| e.unchecked_into::<web_sys::IntersectionObserverEntry>().is_intersecting());
                if seen && !asked.replace(true) {
                    observer.disconnect();
                    ask();
                }
            },
        );
        if let Ok(observer) = web_sys::IntersectionObserver::new(on_sight.as_ref().unchecked_ref()) {
            observer.observe(&el);
        }
        on_sight.forget(); // one per report shown; it lets go of the observer once used
    });
}

/// Advice: ranked changes with their predicted peaks; a budget asks again.
#[component]
pub fn AdviceSection(
    /// The trace's events: a large trace is advised on once the section is seen.
    events: u64,
) -> impl IntoView {
    let errors = expect_context::<Errors>();
    let report: RwSignal<Option<Arc<AdviceReport>>> = RwSignal::new(None);
    let busy = RwSignal::new(false);
    let budget_text = RwSignal::new(String::new());
    let ask = move |budget: Option<u64>| {
        busy.set(true);
        bridge::ask_when_idle(Request::Advice { budget_bytes: budget }, move |r| {
            busy.set(false);
            match r {
                Response::Advice(a) => report.set(Some(Arc::new(*a))),
                Response::Error { message } => errors.report("the advice", message),
                _ => {}
            }
        });
    };
    let section = NodeRef::<leptos::html::Section>::new();
    if events <= ADVISE_ON_SIGHT_EVENTS {
        ask(None);
    } else {
        when_seen(section, move || ask(None));
    }
    let on_submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let text = budget_text.get_untracked();
        if text.trim().is_empty() {
            return ask(None);
        }
        match parse_size(text.trim()) {
            Ok(b) => ask(Some(b)),
            Err(e) => errors.report("the budget", e.to_string()),
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
                Some(r) => advice_table(r).into_any(),
                None if busy.get() => view! { <p class="hint">"Replaying the trace with each change…"</p> }.into_any(),
                None => view! { <p class="hint">"Computed when this section comes into view."</p> }.into_any(),
            }}
        </section>
    }
}

/// The measured peak, then every suggestion with its predicted peak and cost, and what could
/// not be advised.
fn advice_table(report: Arc<AdviceReport>) -> impl IntoView {
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
