//! Server mode's panel, when `collector serve` serves the page: trace a model, the jobs
//! running, the stored traces (open, open on the server, delete, compare two), and the trace
//! followed live. Its logic is [`crate::server`].

use super::{compare::stored::StoredCompare, live::LiveView};
use crate::bridge;
use crate::server::{delete_stored, follow, open_stored, submit_form, ServerState, OPEN_ON_SERVER_BYTES};
use crate::state::Loader;
use leptos::prelude::*;
use protocol::TraceRow;
use shared::units::format_bytes;

/// Why the server cannot trace, once its health says so (`GET /api/health`'s
/// `tracing_available`); `None` while it can, or before it answers.
fn cannot_trace(server: ServerState) -> Option<&'static str> {
    server.health.with(|h| h.as_ref().is_some_and(|h| !h.tracing_available)).then_some(
        "This server cannot trace models: there is no collector-capture beside it (what runs models through libtorch; \
         `cargo build -p capture` builds it). It stores, opens, compares and exports traces, and takes uploads.",
    )
}

/// The form that asks the server to trace a model; disabled, with the reason, on a server that
/// cannot trace.
fn trace_form(loader: Loader, server: ServerState) -> impl IntoView {
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        submit_form(loader, server);
    };
    view! {
        {move || cannot_trace(server).map(|why| view! { <p class="hint" id="srv-cannot-trace">{why}</p> })}
        <form on:submit=submit>
        <fieldset class="trace-form" prop:disabled=move || cannot_trace(server).is_some()>
            // The server's models: the built-in ones and its --models-dir TorchScript files.
            <label>"Model " <select id="srv-model">{move || server.health.get().map(|h| {
                h.models.into_iter().map(|m| view! { <option value=m.clone()>{m.clone()}</option> }).collect_view()
            })}</select></label>
            <label>"Input shape " <input id="srv-shape" type="text" placeholder="model default" size="10" title="The full input shape, batch first: 8,3,224,224 (images), 8,512 (token ids), 4,128,512 (transformer embeddings), 64,784 (mlp); a batch size replaces the first dimension" /></label>
            <label>"Batch " <input id="srv-batch" type="text" placeholder="default" size="5" /></label>
            <label>"Iterations " <input id="srv-iterations" type="text" placeholder="3" size="4" /></label>
            <label>"Max events " <input id="srv-max-events" type="text" value="1000000" size="8" title="Allocations and frees kept (the API's default is 10000)" /></label>
            <label>"Mode " <select id="srv-mode"><option value="train">"train"</option><option value="infer">"infer"</option></select></label>
            <label>"Device " <select id="srv-device">
                <option value="">"server default"</option>
                <option value="cpu">"cpu"</option>
                {move || server.health.get().map(|h| (0..h.cuda_device_count).map(|i| {
                    let d = format!("cuda:{i}");
                    view! { <option value=d.clone()>{d.clone()}</option> }
                }).collect_view())}
            </select></label>
            <label title="Processes of a torchrun job: a rank per GPU (or on the CPU with gloo), each with the whole input">"Ranks " <input id="srv-world" type="text" placeholder="1" size="3" /></label>
            <label>"Strategy " <select id="srv-strategy"><option value="ddp">"DDP"</option><option value="fsdp">"FSDP2"</option></select></label>
            <button type="submit" id="srv-trace">"Trace"</button>
        </fieldset>
        </form>
    }
}

/// The jobs queued or running, each with a "Follow" button.
fn job_list(loader: Loader, server: ServerState) -> impl IntoView {
    move || {
        let jobs = server.jobs.get();
        (!jobs.is_empty()).then(|| {
            view! {
                <h3>"Running and queued"</h3>
                <ul class="jobs">
                    {jobs.into_iter().map(|j| {
                        let id = j.trace_id.clone();
                        view! { <li>
                            <code>{j.trace_id.clone()}</code> " " {j.model_name} " on " {j.device} " · " {j.state.as_str()} " · "
                            {format!("{}/{} iterations", j.iterations_done, j.iterations)} " "
                            <button on:click=move |_| follow(loader, server, &id)>"Follow"</button>
                        </li> }
                    }).collect_view()}
                </ul>
            }
        })
    }
}

/// A stored trace's buttons: open it in the page (or, too large for it, on the server), on
/// the server, delete it.
fn trace_buttons(loader: Loader, server: ServerState, t: &TraceRow) -> impl IntoView {
    let (open_id, del_id) = (t.trace_id.clone(), t.trace_id.clone());
    view! {
        {if t.file_size_bytes > OPEN_ON_SERVER_BYTES {
            view! { <button class="open" title="Too large for the page: the server imports it and answers every view" on:click=move |_| bridge::open_remote(loader, &open_id)>"Open on the server"</button> }.into_any()
        } else {
            let here_id = open_id.clone();
            view! {
                <button class="open" on:click=move |_| open_stored(loader, &open_id)>"Open"</button>
                " "
                <button class="explore-remote" title="The server imports it and answers every view (for files larger than the page holds)" on:click=move |_| bridge::open_remote(loader, &here_id)>"on server"</button>
            }.into_any()
        }}
        " "
        <button on:click=move |_| delete_stored(server, del_id.clone())>"Delete"</button>
    }
}

/// The stored traces' table, and the picker of two to compare.
fn stored_traces(loader: Loader, server: ServerState) -> impl IntoView {
    move || {
        let traces = server.traces.get();
        if traces.is_empty() {
            return view! { <p class="hint">"None yet: trace a model above, or POST a file to /api/trace/upload."</p> }.into_any();
        }
        let traces_for_compare = traces.clone();
        view! {
            <table class="data" id="server-traces">
                <thead><tr><th>"Trace"</th><th>"Model"</th><th>"Origin"</th><th>"Device"</th><th>"Peak allocated"</th><th>"Events"</th><th>"Size"</th><th></th></tr></thead>
                <tbody>
                    {traces.into_iter().map(|t| view! { <tr>
                        <td><code>{t.trace_id.clone()}</code></td>
                        <td>{t.model_name.clone()}</td>
                        <td>{t.origin.as_str()}</td>
                        <td>{t.device.clone().unwrap_or_default()}</td>
                        <td class="num">{format_bytes(t.peak_allocated_bytes)}</td>
                        <td class="num">{t.total_events}</td>
                        <td class="num">{format_bytes(t.file_size_bytes)}</td>
                        <td>{trace_buttons(loader, server, &t)}</td>
                    </tr> }).collect_view()}
                </tbody>
            </table>
            {(traces_for_compare.len() >= 2).then(|| view! { <StoredCompare traces=traces_for_compare loader=loader server=server /> })}
        }.into_any()
    }
}

/// The server panel: trace a model, running jobs, stored traces, and the live view.
#[component]
pub fn ServerPanel(
    /// Opens stored traces and shows comparisons of two.
    loader: Loader,
) -> impl IntoView {
    let server = ServerState::start(loader);
    view! {
        <section class="card server" id="server">
            <div class="card-head">
                <h2>"Server"</h2>
                <span class="hint">{move || server.health.get().map(|h| format!(
                    "default device {}{}",
                    h.device,
                    if h.tracing_available { "" } else { " · built without tracing" }
                ))}</span>
                <button on:click=move |_| server.refresh() title="Reload the lists">"Refresh"</button>
            </div>
            {trace_form(loader, server)}
            {move || server.message.get().map(|m| view! { <p class="server-message" role="alert">{m}</p> })}
            <LiveView server=server />
            {job_list(loader, server)}
            <h3>"Stored traces"</h3>
            {stored_traces(loader, server)}
        </section>
    }
}
