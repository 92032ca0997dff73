//! What to change so the run needs less memory (`shared::analysis::advice`, asked of the
//! worker with an optional budget): the rows `collector advise` prints, each change judged by
//! what runs out (its predicted reserved peak, allocated beside it), and those with no effect.

use crate::bridge;
use crate::state::Errors;
use leptos::prelude::*;
use shared::analysis::advice::{advice_rows, AdviceReport, AdviceRow, AdviceRows, Measure};
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

/// The measured peaks, then the rows every surface shows ([`advice_rows`]): each ranked change
/// with the predicted peak of what runs out (reserved where the trace knows it) and the
/// allocated one beside it, then the changes with no effect here, and what could not be
/// advised.
fn advice_table(report: Arc<AdviceReport>) -> impl IntoView {
    let b = &report.baseline;
    let AdviceRows { judged_by, device_total, ranked, no_effect, .. } = advice_rows(&report);
    let budget = report.budget_bytes.map(|bytes| {
        let met = match report.budget_met {
            Some(true) => "can be met",
            Some(false) => "cannot be met",
            None => "",
        };
        format!("budget {} {met}", format_bytes(bytes))
    });
    let reserved = judged_by == Measure::Reserved;
    let measured = if reserved {
        format!(
            "measured peak {} reserved, {} allocated on {}",
            format_bytes(b.peak_reserved_bytes),
            format_bytes(b.peak_allocated_bytes),
            b.device
        )
    } else {
        format!("measured peak {} on {}", format_bytes(b.peak_allocated_bytes), b.device)
    };
    let what = if reserved { "the reserved peak" } else { "the peak" };
    view! {
        <p class="sub" id="advice-measured" data-judged-by=if reserved { "reserved" } else { "allocated" }>
            {measured}
            {b.outside_pytorch_bytes.map(|o| format!(" · {} outside PyTorch", format_bytes(o)))}
            {b.iteration_time_s.map(|t| format!(" · iteration {:.1} ms", t * 1e3))}
            {budget.map(|b| format!(" · {b}"))}
        </p>
        {report.notes.iter().map(|n| view! { <p class="warning">{n.clone()}</p> }).collect_view()}
        {if ranked.is_empty() {
            view! { <p class="hint" id="advice-nothing">{format!("No change saves any of {what} on this trace.")}</p> }.into_any()
        } else {
            ranked_table(ranked, reserved, device_total).into_any()
        }}
        {(!no_effect.is_empty()).then(|| view! {
            <h3>"No effect here"</h3>
            <p class="hint">{format!("Saves nothing of {what} on this trace.")}</p>
            <ul id="advice-no-effect">
                {no_effect.into_iter().map(|row| view! {
                    <li title=row.reasoning.clone() data-kind=row.kind.as_str() data-bytes=row.peak_bytes.to_string()>{row.line()}</li>
                }).collect_view()}
            </ul>
        })}
        {(!report.not_available.is_empty()).then(|| view! {
            <h3>"Not available"</h3>
            <ul class="hint">{report.not_available.iter().map(|n| view! { <li>{n.clone()}</li> }).collect_view()}</ul>
        })}
    }
}

/// The ranked changes: the predicted peak of what runs out (`reserved`: the reserved one) and
/// the saving, the allocated peak beside, the device total (`device_total`: with the ledger)
/// and the extra time; the reasoning in each row's tooltip.
fn ranked_table(ranked: Vec<AdviceRow>, reserved: bool, device_total: bool) -> impl IntoView {
    view! {
        <table class="data" id="advice-table">
            <thead><tr>
                <th>"#"</th><th>"change"</th>
                <th>{if reserved { "predicted reserved peak" } else { "predicted peak" }}</th>
                <th>"vs measured"</th><th>"allocated peak"</th>
                {device_total.then(|| view! { <th>"device total"</th> })}
                <th>"extra time / iteration"</th>
            </tr></thead>
            <tbody>
                {ranked.into_iter().map(|row| view! {
                    <tr class=if row.meets_budget == Some(true) { "meets" } else { "" } title=row.reasoning data-kind=row.kind.as_str()>
                        <td>{row.rank.unwrap_or(0).to_string()}</td>
                        <td>{row.change}</td>
                        <td class="num peak" data-bytes=row.peak_bytes.to_string()>{row.peak_text}</td>
                        <td class="num saving" data-bytes=row.saving_bytes.to_string()>{row.saving_text}</td>
                        <td class="num allocated" data-bytes=row.allocated_peak_bytes.to_string()>{row.allocated_text}</td>
                        {device_total.then(|| view! { <td class="num device-total">{row.device_total_text.unwrap_or_default()}</td> })}
                        <td class="num">{row.extra_time_text}</td>
                    </tr>
                }).collect_view()}
            </tbody>
        </table>
    }
}
