//! A loaded trace's report: every view of it, one after another, each only where the trace
//! has what it shows.

use super::{active::ActiveSection, advice::AdviceSection, flame::FlameSection, fragmentation::FragmentationSection, oom::OomSection};
use super::{pools::PoolsSection, rank_chart::RankChart, ranks::RanksSection, segments::SegmentsSection, summary::SummarySection};
use super::{tables::Tables, timeline::TimelineSection};
use crate::perf;
use crate::state::Loader;
use leptos::prelude::*;
use shared::explore::Overview;
use std::sync::Arc;

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
    let o = overview.clone();
    view! {
        {o.oom.clone().map(|r| view! { <OomSection oom=Arc::new(r) /> })}
        <SummarySection overview=o.clone() />
        {o.ranks.clone().map(|r| view! { <RanksSection ranks=Arc::new(r) loader=loader /> })}
        {has_events.then(|| view! {
            <TimelineSection overview=o.clone() />
            <ActiveSection overview=o.clone() />
            <FlameSection overview=o.clone() />
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
