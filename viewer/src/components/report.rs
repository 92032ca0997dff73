//! A loaded trace's report: every view of it, one after another, each only where the trace
//! has what it shows. What a window shows before it is scrolled (the summary and the timeline)
//! is built and drawn first; the views below it are built once that is painted
//! ([`crate::state::FirstScreen`]), so a trace appears without waiting for what is out of sight.

use super::{active::ActiveSection, advice::AdviceSection, flame::FlameSection, fragmentation::FragmentationSection, oom::OomSection};
use super::{pools::PoolsSection, rank_chart::RankChart, ranks::RanksSection, segments::SegmentsSection, summary::SummarySection};
use super::{tables::Tables, timeline::TimelineSection};
use crate::perf;
use crate::state::{FirstScreen, Loader};
use leptos::prelude::*;
use shared::explore::Overview;
use std::sync::Arc;

/// However the timeline fares (an answer that never comes), the rest of the report is built
/// this long after it.
const REST_AT_THE_LATEST_MS: i32 = 2000;

/// Every view of a loaded trace.
#[component]
pub fn Report(
    /// The trace's overview, as the worker (or the server) made it.
    overview: Arc<Overview>,
    /// For the rank picker, which swaps the trace shown.
    loader: Loader,
) -> impl IntoView {
    perf::mark("report built");
    let has_events = overview.summary.total_events > 0;
    let has_rank = overview.profile.is_some() || !overview.curves.is_empty();
    let has_segments = overview.has_segments;
    // Without a timeline there is no chart on the first screen to wait for.
    let rest_built = RwSignal::new(!has_events);
    let first_screen = FirstScreen::new(rest_built);
    provide_context(first_screen);
    if has_events {
        crate::dom::after_ms(REST_AT_THE_LATEST_MS, move || first_screen.build_rest());
    } else {
        perf::first_screen_drawn();
    }
    // The worker makes the answers below the first screen once it is painted.
    Effect::new(move |_| {
        if rest_built.get() {
            crate::bridge::first_screen_shown();
        }
    });
    let o = overview.clone();
    let rest = move || rest_built.get().then(|| below_first_screen(o.clone(), has_rank, has_segments, has_events));
    let o = overview.clone();
    view! {
        {o.oom.clone().map(|r| view! { <OomSection oom=Arc::new(r) /> })}
        <SummarySection overview=o.clone() />
        {o.ranks.clone().map(|r| view! { <RanksSection ranks=Arc::new(r) loader=loader /> })}
        {has_events.then(|| view! { <TimelineSection overview=o.clone() /> })}
        {rest}
    }
}

/// The views below the first screen, in the report's order.
fn below_first_screen(overview: Arc<Overview>, has_rank: bool, has_segments: bool, has_events: bool) -> impl IntoView {
    let o = overview;
    view! {
        {has_events.then(|| view! {
            <ActiveSection overview=o.clone() />
            <FlameSection />
        })}
        <section class="card" id="rank">
            <h2>"Memory vs rank"</h2>
            {if has_rank {
                view! { <RankChart overview=o.clone() /> }.into_any()
            } else {
                view! { <p class="hint">{o.profile_error.clone().unwrap_or_default()}</p> }.into_any()
            }}
        </section>
        <Tables overview=o.clone() />
        {has_events.then(|| view! { <AdviceSection events=o.summary.total_events as u64 /> })}
        {has_events.then(|| view! { <FragmentationSection overview=o.clone() /> })}
        {has_segments.then(|| view! { <SegmentsSection overview=o.clone() /> })}
        {has_segments.then(|| view! { <PoolsSection overview=o.clone() /> })}
    }
}
