//! The keyboard shortcuts overlay (`?`).

use leptos::prelude::*;

/// Every shortcut and what it does.
const KEYS: [(&str, &str); 10] = [
    ("o", "open a trace (several files: the ranks of one job)"),
    ("1 … 7", "jump to summary, timeline, flame graph, rank, tables, fragmentation, segments"),
    ("+ / −  or wheel", "zoom the timeline (around the pointer with the wheel)"),
    ("← / →  or drag", "pan the timeline"),
    ("0", "show the whole timeline"),
    ("click", "timeline: list what is live then; flame graph: zoom into a box"),
    ("/", "search the flame graph"),
    ("t", "dark or light theme"),
    ("?", "open or close this help"),
    ("Esc", "close this help, leave a text field"),
];

/// The keyboard shortcuts overlay.
#[component]
pub fn Help(
    /// Whether the overlay shows; a click anywhere on it closes it.
    open: RwSignal<bool>,
) -> impl IntoView {
    view! {
        <div class="overlay" class:hidden=move || !open.get() on:click=move |_| open.set(false)>
            <section class="help" id="help" role="dialog" aria-modal="true" aria-label="Keyboard shortcuts">
                <h2>"Keyboard shortcuts"</h2>
                <table>
                    {KEYS.into_iter().map(|(k, what)| view! { <tr><td><kbd>{k}</kbd></td><td>{what}</td></tr> }).collect_view()}
                </table>
                <p class="hint">"Esc or a click closes this."</p>
            </section>
        </div>
    }
}
