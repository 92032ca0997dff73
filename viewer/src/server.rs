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
//!
//! This is the panel's logic; its components are `components/server_panel.rs`,
//! `components/live/` and `components/compare/stored.rs`.

use crate::http::{call, encode, url_with_token};
use crate::state::{Comparison, Loader};
use crate::{bridge, perf};
use leptos::prelude::*;
use protocol::{HealthResponse, JobAccepted, JobRow, JobState, JobsResponse, ListResponse, LiveEvent, TraceRequest, TraceRow};
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
    /// The stored traces, newest first.
    pub traces: RwSignal<Vec<TraceRow>>,
    /// The jobs queued or running.
    pub jobs: RwSignal<Vec<JobRow>>,
    /// The server's device, models and whether it can trace.
    pub health: RwSignal<Option<HealthResponse>>,
    /// The trace followed.
    pub live: RwSignal<Option<Live>>,
    /// The panel's last message (a failure).
    pub message: RwSignal<Option<String>>,
}

impl ServerState {
    /// Asks the server for its health and lists; `?follow=ID` follows that trace.
    pub fn start(loader: Loader) -> Self {
        let server = ServerState {
            traces: RwSignal::new(Vec::new()),
            jobs: RwSignal::new(Vec::new()),
            health: RwSignal::new(None),
            live: RwSignal::new(None),
            message: RwSignal::new(None),
        };
        server.refresh();
        leptos::task::spawn_local(async move {
            match call("GET", "api/health", None).await.and_then(|t| serde_json::from_str::<HealthResponse>(&t).map_err(|e| e.to_string()))
            {
                Ok(h) => server.health.set(Some(h)),
                Err(e) => server.message.set(Some(format!("cannot reach the server: {e}"))),
            }
        });
        if let Some(id) = crate::dom::query_param("follow") {
            follow(loader, server, &id);
        }
        server
    }

    /// Reloads the stored traces and the jobs.
    pub fn refresh(self) {
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
pub fn compare_stored(loader: Loader, server: ServerState, a: String, b: String) {
    server.message.set(None);
    leptos::task::spawn_local(async move {
        let request = protocol::DiffRequest { a: a.clone(), b: b.clone(), device_a: None, device_b: None };
        let body = serde_json::to_string(&request).unwrap_or_default();
        let diff = call("POST", "api/trace/diff", Some(body)).await.and_then(|t| {
            serde_json::from_str::<shared::analysis::diff::TraceDiff>(&t).map_err(|e| format!("the server's diff is unreadable: {e}"))
        });
        match diff {
            Ok(diff) => {
                let (a, b) = (trace_label(server, &a), trace_label(server, &b));
                loader.compare.set(Some(std::sync::Arc::new(Comparison { a, b, diff, of_open_trace: false })));
            }
            Err(e) => server.message.set(Some(format!("cannot compare {a} with {b}: {e}"))),
        }
    });
}

/// Opens a stored trace from the server in every view.
pub fn open_stored(loader: Loader, id: &str) {
    bridge::open_url_as(loader, &url_with_token(&format!("api/trace/{id}")), id);
}

/// Files the page's worker should not read itself: the server opens them (a snapshot needs
/// about 1.7 times its size in the worker's 4 GiB).
pub const OPEN_ON_SERVER_BYTES: u64 = 1 << 30;

thread_local! {
    static SOURCE: std::cell::RefCell<Option<web_sys::EventSource>> = const { std::cell::RefCell::new(None) };
}

/// Follows trace `id` live; opens it when done.
pub fn follow(loader: Loader, server: ServerState, id: &str) {
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
                    open_stored(loader, &trace.trace_id);
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

pub fn select_value(id: &str) -> String {
    document().get_element_by_id(id).and_then(|e| e.dyn_into::<web_sys::HtmlSelectElement>().ok()).map(|e| e.value()).unwrap_or_default()
}

/// The request the form describes, or what is wrong with it.
pub fn form_request() -> Result<TraceRequest, String> {
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

/// Asks the server to trace what the form describes, and follows the job.
pub fn submit_form(loader: Loader, server: ServerState) {
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
                follow(loader, server, &a.trace_id);
                server.refresh();
            }
            Err(e) => server.message.set(Some(e)),
        }
    });
}

/// Deletes stored trace `id`.
pub fn delete_stored(server: ServerState, id: String) {
    leptos::task::spawn_local(async move {
        match call("DELETE", &format!("api/trace/{}", encode(&id)), None).await {
            Ok(_) => server.refresh(),
            Err(e) => server.message.set(Some(e)),
        }
    });
}
