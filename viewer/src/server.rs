//! Server mode: when `collector serve` serves the page (it adds
//! `<meta name="memory-tracer-server">`), the page lists the server's stored traces, traces
//! models on request, and follows a running trace live through its Server-Sent Events
//! (`/api/trace/{id}/events`): memory totals drawn as they arrive, then the finished trace
//! opened in every view. Two stored traces compare in the Compare view (`POST
//! /api/trace/diff`).
//!
//! A server started with `--token` is reached through `/?token=T`; the token is kept for the
//! tab (sessionStorage) and sent as a bearer header, or as `access_token` where headers cannot
//! be set (EventSource, the worker's fetch).

use crate::http::{call, encode, url_with_token};
use crate::{bridge, perf, query_param, AppState};
use leptos::prelude::*;
use protocol::{HealthResponse, JobAccepted, JobRow, JobState, JobsResponse, ListResponse, LiveEvent, TraceRequest, TraceRow};
use shared::units::{format_bytes, format_seconds};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

/// A trace being followed.
#[derive(Clone, Debug, Default)]
pub struct Live {
    pub trace_id: String,
    pub model: String,
    pub device: String,
    /// queued, running, done or failed.
    pub state: String,
    pub iterations_done: u32,
    pub iterations: u32,
    /// `[ns since start, allocated, reserved]` of a program of one process.
    pub points: Vec<[u64; 3]>,
    /// The same per rank, for a torchrun job (each rank's events carry its rank).
    pub ranks: std::collections::BTreeMap<u32, Vec<[u64; 3]>>,
    pub batches: usize,
    pub error: Option<String>,
}

/// The server panel's state.
#[derive(Clone, Copy)]
pub struct ServerState {
    traces: RwSignal<Vec<TraceRow>>,
    jobs: RwSignal<Vec<JobRow>>,
    health: RwSignal<Option<HealthResponse>>,
    pub live: RwSignal<Option<Live>>,
    message: RwSignal<Option<String>>,
}

impl ServerState {
    fn refresh(self) {
        leptos::task::spawn_local(async move {
            match call("GET", "api/trace/list", None)
                .await
                .and_then(|t| serde_json::from_str::<ListResponse>(&t).map_err(|e| e.to_string()))
            {
                Ok(l) => self.traces.set(l.traces.into_iter().rev().collect()),
                Err(e) => self.message.set(Some(format!("cannot list the server's traces: {e}"))),
            }
            if let Ok(j) =
                call("GET", "api/jobs", None).await.and_then(|t| serde_json::from_str::<JobsResponse>(&t).map_err(|e| e.to_string()))
            {
                self.jobs.set(j.jobs.into_iter().filter(|j| matches!(j.state, JobState::Queued | JobState::Running)).collect());
            }
        });
    }
}

/// A stored trace as the lists name it: its id and model.
fn trace_label(server: ServerState, id: &str) -> String {
    server
        .traces
        .with_untracked(|ts| ts.iter().find(|t| t.trace_id == id).map_or_else(|| id.to_owned(), |t| format!("{id} ({})", t.model_name)))
}

/// Compares two stored traces (the server computes the diff) in the Compare view.
fn compare_stored(state: AppState, server: ServerState, a: String, b: String) {
    server.message.set(None);
    leptos::task::spawn_local(async move {
        let body = serde_json::json!({ "a": a, "b": b }).to_string();
        let diff = call("POST", "api/trace/diff", Some(body)).await.and_then(|t| {
            serde_json::from_str::<shared::analysis::diff::TraceDiff>(&t).map_err(|e| format!("the server's diff is unreadable: {e}"))
        });
        match diff {
            Ok(diff) => {
                let (a, b) = (trace_label(server, &a), trace_label(server, &b));
                state.compare.set(Some(std::sync::Arc::new(crate::compare::Comparison { a, b, diff, of_open_trace: false })));
            }
            Err(e) => server.message.set(Some(format!("cannot compare {a} with {b}: {e}"))),
        }
    });
}

/// Two stored traces to compare.
#[component]
fn StoredCompare(traces: Vec<TraceRow>) -> impl IntoView {
    let state = expect_context::<AppState>();
    let server = expect_context::<ServerState>();
    let options = move |pick: usize| {
        traces
            .iter()
            .enumerate()
            .map(|(k, t)| view! { <option value=t.trace_id.clone() selected=k == pick>{format!("{} ({})", t.trace_id, t.model_name)}</option> })
            .collect_view()
    };
    view! {
        <div class="trace-form" id="srv-compare-form">
            <label>"Compare " <select id="srv-compare-a">{options(0)}</select></label>
            <label>" with " <select id="srv-compare-b">{options(1)}</select></label>
            <button id="srv-compare" on:click=move |_| compare_stored(state, server, select_value("srv-compare-a"), select_value("srv-compare-b"))>"Compare"</button>
        </div>
    }
}

/// Opens a stored trace from the server in every view.
fn open_stored(state: AppState, id: &str) {
    bridge::open_url_as(state, &url_with_token(&format!("api/trace/{id}")), id);
}

/// Files the page's worker should not read itself: the server opens them (a snapshot needs
/// about 1.7 times its size in the worker's 4 GiB).
const OPEN_ON_SERVER_BYTES: u64 = 1 << 30;

thread_local! {
    static SOURCE: std::cell::RefCell<Option<web_sys::EventSource>> = const { std::cell::RefCell::new(None) };
}

/// Follows trace `id` live; opens it when done.
pub fn follow(state: AppState, server: ServerState, id: &str) {
    SOURCE.with(|s| {
        if let Some(old) = s.borrow_mut().take() {
            old.close();
        }
    });
    server.live.set(Some(Live { trace_id: id.to_owned(), state: "connecting".into(), ..Live::default() }));
    perf::set_body("data-live-state", "connecting");
    perf::set_body("data-live-batches", "0");
    let Ok(source) = web_sys::EventSource::new(&url_with_token(&format!("api/trace/{}/events", encode(id)))) else {
        server.message.set(Some("this browser cannot follow server events".into()));
        return;
    };
    let set_state = move |s: &str| {
        perf::set_body("data-live-state", s);
        server.live.update(|l| {
            if let Some(l) = l {
                l.state = s.to_owned();
            }
        });
    };
    let shared_source = source.clone();
    // Every event's data is the whole `LiveEvent` (its `kind` is also the SSE event name,
    // which EventSource needs a listener for).
    let handler = move || {
        let source = shared_source.clone();
        Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |e: web_sys::MessageEvent| {
            let Some(data) = e.data().as_string() else { return };
            let Ok(event) = serde_json::from_str::<LiveEvent>(&data) else { return };
            match event {
                LiveEvent::Status { state: job_state, device, model } => {
                    server.live.update(|l| {
                        if let Some(l) = l {
                            l.model = model;
                            l.device = device;
                        }
                    });
                    set_state(job_state.as_str());
                }
                LiveEvent::Started { iterations } => server.live.update(|l| {
                    if let Some(l) = l {
                        l.iterations = iterations;
                    }
                }),
                LiveEvent::Iteration { done, of, .. } => {
                    server.live.update(|l| {
                        if let Some(l) = l {
                            l.iterations_done = done;
                            l.iterations = of;
                        }
                    });
                    // The job list shows progress too (and other users' jobs).
                    server.refresh();
                }
                LiveEvent::Memory { points, rank } => {
                    let (mut batches, mut ranks) = (0, 0);
                    server.live.update(|l| {
                        if let Some(l) = l {
                            match rank {
                                Some(r) => l.ranks.entry(r).or_default().extend(points),
                                None => l.points.extend(points),
                            }
                            l.batches += 1;
                            batches = l.batches;
                            ranks = l.ranks.len();
                        }
                    });
                    perf::set_body("data-live-batches", &batches.to_string());
                    perf::set_body("data-live-ranks", &ranks.to_string());
                }
                LiveEvent::Done { trace } => {
                    source.close();
                    set_state("done");
                    open_stored(state, &trace.trace_id);
                    server.refresh();
                }
                LiveEvent::Failed { detail, .. } => {
                    source.close();
                    server.live.update(|l| {
                        if let Some(l) = l {
                            l.error = Some(detail);
                        }
                    });
                    set_state("failed");
                    server.refresh();
                }
            }
        })
    };
    for kind in ["status", "started", "iteration", "memory", "done", "failed"] {
        let cb = handler();
        let _ = source.add_event_listener_with_callback(kind, cb.as_ref().unchecked_ref());
        cb.forget(); // as long as the source lives; a page follows few traces
    }
    let on_error = Closure::<dyn FnMut(web_sys::Event)>::new(move |_e: web_sys::Event| {
        let running = server.live.with_untracked(|l| l.as_ref().is_some_and(|l| l.state != "done" && l.state != "failed"));
        if running {
            server.message.set(Some("lost the connection to the server's event stream; retrying".into()));
        }
    });
    source.set_onerror(Some(on_error.as_ref().unchecked_ref()));
    on_error.forget();
    SOURCE.with(|s| *s.borrow_mut() = Some(source));
}

fn input_value(id: &str) -> String {
    document().get_element_by_id(id).and_then(|e| e.dyn_into::<web_sys::HtmlInputElement>().ok()).map(|e| e.value()).unwrap_or_default()
}

fn select_value(id: &str) -> String {
    document().get_element_by_id(id).and_then(|e| e.dyn_into::<web_sys::HtmlSelectElement>().ok()).map(|e| e.value()).unwrap_or_default()
}

/// The request the form describes, or what is wrong with it.
fn form_request() -> Result<TraceRequest, String> {
    let number = |id: &str, what: &str| -> Result<Option<u64>, String> {
        let v = input_value(id);
        let v = v.trim();
        if v.is_empty() {
            return Ok(None);
        }
        v.parse::<u64>().map(Some).map_err(|_| format!("{what} must be a whole number, not `{v}`"))
    };
    let too_big = |what: &str| format!("{what} is too large");
    let shape = input_value("srv-shape");
    let input_shape = if shape.trim().is_empty() {
        None
    } else {
        let dims: Result<Vec<i64>, _> = shape.split([',', 'x', ' ']).filter(|s| !s.is_empty()).map(str::parse::<i64>).collect();
        Some(dims.map_err(|_| format!("input shape must be numbers separated by commas, not `{shape}`"))?)
    };
    let device = select_value("srv-device");
    let world_size = number("srv-world", "world size")?.filter(|&w| w > 1);
    Ok(TraceRequest {
        model_name: select_value("srv-model"),
        mode: Some(select_value("srv-mode")),
        batch_size: number("srv-batch", "batch size")?.map(|b| i64::try_from(b).map_err(|_| too_big("batch size"))).transpose()?,
        iterations: number("srv-iterations", "iterations")?.map(|i| u32::try_from(i).map_err(|_| too_big("iterations"))).transpose()?,
        max_events: number("srv-max-events", "max events")?.unwrap_or(TraceRequest::DEFAULT_MAX_EVENTS),
        input_shape,
        device: (!device.is_empty()).then_some(device),
        world_size: world_size.map(|w| u32::try_from(w).map_err(|_| too_big("world size"))).transpose()?,
        strategy: world_size.map(|_| select_value("srv-strategy")),
        optimizer: None,
        enable_fragmentation: true,
    })
}

/// The server panel: trace a model, running jobs, stored traces, and the live view.
#[component]
pub fn ServerPanel() -> impl IntoView {
    let state = expect_context::<AppState>();
    let server = ServerState {
        traces: RwSignal::new(Vec::new()),
        jobs: RwSignal::new(Vec::new()),
        health: RwSignal::new(None),
        live: RwSignal::new(None),
        message: RwSignal::new(None),
    };
    provide_context(server);
    server.refresh();
    leptos::task::spawn_local(async move {
        match call("GET", "api/health", None).await.and_then(|t| serde_json::from_str::<HealthResponse>(&t).map_err(|e| e.to_string())) {
            Ok(h) => server.health.set(Some(h)),
            Err(e) => server.message.set(Some(format!("cannot reach the server: {e}"))),
        }
    });
    if let Some(id) = query_param("follow") {
        follow(state, server, &id);
    }
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        server.message.set(None);
        let req = match form_request() {
            Ok(r) => r,
            Err(e) => return server.message.set(Some(e)),
        };
        leptos::task::spawn_local(async move {
            let body = serde_json::to_string(&req).unwrap_or_default();
            match call("POST", "api/trace/memory?wait=false", Some(body))
                .await
                .and_then(|t| serde_json::from_str::<JobAccepted>(&t).map_err(|e| e.to_string()))
            {
                Ok(a) => {
                    follow(state, server, &a.trace_id);
                    server.refresh();
                }
                Err(e) => server.message.set(Some(e)),
            }
        });
    };
    let delete = move |id: String| {
        leptos::task::spawn_local(async move {
            match call("DELETE", &format!("api/trace/{}", encode(&id)), None).await {
                Ok(_) => server.refresh(),
                Err(e) => server.message.set(Some(e)),
            }
        });
    };
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
            <form class="trace-form" on:submit=submit>
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
            </form>
            {move || server.message.get().map(|m| view! { <p class="server-message" role="alert">{m}</p> })}
            <LiveView />
            {move || {
                let jobs = server.jobs.get();
                (!jobs.is_empty()).then(|| view! {
                    <h3>"Running and queued"</h3>
                    <ul class="jobs">
                        {jobs.into_iter().map(|j| {
                            let id = j.trace_id.clone();
                            view! { <li>
                                <code>{j.trace_id.clone()}</code> " " {j.model_name} " on " {j.device} " · " {j.state.as_str()} " · "
                                {format!("{}/{} iterations", j.iterations_done, j.iterations)} " "
                                <button on:click=move |_| follow(state, server, &id)>"Follow"</button>
                            </li> }
                        }).collect_view()}
                    </ul>
                })
            }}
            <h3>"Stored traces"</h3>
            {move || {
                let traces = server.traces.get();
                if traces.is_empty() {
                    return view! { <p class="hint">"None yet: trace a model above, or POST a file to /api/trace/upload."</p> }.into_any();
                }
                let traces_for_compare = traces.clone();
                view! {
                    <table class="data" id="server-traces">
                        <thead><tr><th>"Trace"</th><th>"Model"</th><th>"Origin"</th><th>"Device"</th><th>"Peak allocated"</th><th>"Events"</th><th>"Size"</th><th></th></tr></thead>
                        <tbody>
                            {traces.into_iter().map(|t| {
                                let (open_id, del_id) = (t.trace_id.clone(), t.trace_id.clone());
                                view! { <tr>
                                    <td><code>{t.trace_id.clone()}</code></td>
                                    <td>{t.model_name}</td>
                                    <td>{t.origin.as_str()}</td>
                                    <td>{t.device.unwrap_or_default()}</td>
                                    <td class="num">{format_bytes(t.peak_allocated_bytes)}</td>
                                    <td class="num">{t.total_events}</td>
                                    <td class="num">{format_bytes(t.file_size_bytes)}</td>
                                    <td>
                                        {if t.file_size_bytes > OPEN_ON_SERVER_BYTES {
                                            view! { <button class="open" title="Too large for the page: the server imports it and answers every view" on:click=move |_| bridge::open_remote(state, &open_id)>"Open on the server"</button> }.into_any()
                                        } else {
                                            let here_id = open_id.clone();
                                            view! {
                                                <button class="open" on:click=move |_| open_stored(state, &open_id)>"Open"</button>
                                                " "
                                                <button class="explore-remote" title="The server imports it and answers every view (for files larger than the page holds)" on:click=move |_| bridge::open_remote(state, &here_id)>"on server"</button>
                                            }.into_any()
                                        }}
                                        " "
                                        <button on:click=move |_| delete(del_id.clone())>"Delete"</button>
                                    </td>
                                </tr> }
                            }).collect_view()}
                        </tbody>
                    </table>
                    {(traces_for_compare.len() >= 2).then(|| view! { <StoredCompare traces=traces_for_compare /> })}
                }.into_any()
            }}
        </section>
    }
}

/// The followed trace: state, iterations, and allocated/reserved so far.
#[component]
fn LiveView() -> impl IntoView {
    let state = expect_context::<AppState>();
    let server = expect_context::<ServerState>();
    let canvas = NodeRef::<leptos::html::Canvas>::new();
    Effect::new(move |_| {
        let pal = state.palette();
        let Some(c) = canvas.get() else { return };
        server.live.with(|l| {
            if let Some(l) = l {
                crate::fit_canvas(&c, 220);
                let drawn = if l.ranks.is_empty() {
                    crate::charts::draw_live(&c, &pal, &l.points).is_ok().then_some(l.points.len())
                } else {
                    crate::charts::draw_live_ranks(&c, &pal, &l.ranks).is_ok().then(|| l.ranks.values().map(Vec::len).sum())
                };
                if let Some(n) = drawn.filter(|&n| n > 0) {
                    perf::set_body("data-live-drawn", &n.to_string());
                }
            }
        });
    });
    move || {
        server.live.get().map(|l| {
            let peak = l.points.iter().map(|p| p[1]).max().unwrap_or(0);
            let now = l.points.last().copied().unwrap_or([0; 3]);
            let rank_peaks: Vec<String> =
                l.ranks.iter().map(|(r, p)| format!("rank {r} peak {}", format_bytes(p.iter().map(|p| p[1]).max().unwrap_or(0)))).collect();
            let finished = l.state == "done" || l.state == "failed";
            view! {
                <div class="live" id="live">
                    <p>
                        <b>{if finished { "Followed " } else { "Following " }}</b> <code>{l.trace_id.clone()}</code>
                        {(!l.model.is_empty()).then(|| format!(" · {} on {}", l.model, l.device))}
                        " · " <span class=format!("live-state {}", l.state)>{l.state.clone()}</span>
                        {(l.iterations > 0).then(|| format!(" · iteration {}/{}", l.iterations_done, l.iterations))}
                        {(!l.points.is_empty()).then(|| format!(
                            " · allocated {} (peak {}) at {} · {} updates",
                            format_bytes(now[1]), format_bytes(peak), format_seconds(now[0] as f64 / 1e9), l.batches
                        ))}
                        {(!rank_peaks.is_empty()).then(|| format!(" · {} ranks: {} · {} updates", rank_peaks.len(), rank_peaks.join(", "), l.batches))}
                    </p>
                    {l.error.clone().map(|e| view! { <p class="server-message" role="alert">{e}</p> })}
                    // Drawn while it runs; the finished trace opens in the views below.
                    {(!finished).then(|| view! { <canvas node_ref=canvas id="live-canvas" class="live-chart" height="220"></canvas> })}
                </div>
            }
        })
    }
}
