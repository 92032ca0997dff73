//! The empty page: what to drop, and which formats open.

use leptos::prelude::*;

/// The empty page: a drop zone.
#[component]
pub fn Welcome() -> impl IntoView {
    view! {
        <section class="welcome">
            <h2>"Where does your GPU memory go?"</h2>
            <p>"Drop a trace anywhere on this page, or press " <kbd>"o"</kbd> " to pick one. It is read here, in your browser; nothing is uploaded."</p>
            <p>"Drop (or pick) one file per rank of a distributed job together to merge them: ranks come from "
                <code>"RANK"</code> " recorded by the collector, else " <code>"rank<N>"</code> " in the file names, else their order."</p>
            <ul>
                <li>"PyTorch memory snapshots (" <code>"torch.cuda.memory._dump_snapshot"</code> ", .pickle)"</li>
                <li>"torch.profiler Chrome traces with memory events (.json, .json.gz)"</li>
                <li>"DFTracer traces (.pfw, .pfw.gz)"</li>
                <li>"Memory Tracer traces (" <code>"collector trace"</code> ") and batch sweeps (" <code>"sweep.json"</code> ")"</li>
            </ul>
        </section>
    }
}
