//! The page's side of the worker: starts it, sends it files and requests, and routes its
//! answers to callbacks and to the [`crate::AppState`] signals.

use crate::protocol::ToPage;
use crate::AppState;
use leptos::prelude::*;
use shared::explore::{Request, Response};
use std::cell::RefCell;
use std::collections::HashMap;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

type Callback = Box<dyn FnOnce(Response)>;

struct Bridge {
    worker: web_sys::Worker,
    ready: bool,
    /// Messages sent before the worker said it was ready.
    queued: Vec<JsValue>,
    next_id: u32,
    /// Callbacks by request id, and whether the warm-up report asked.
    pending: HashMap<u32, (Callback, bool)>,
}

thread_local! {
    static BRIDGE: RefCell<Option<Bridge>> = const { RefCell::new(None) };
    /// The last files sent to be merged, to merge them anyway when they were refused as
    /// recorded far apart.
    static RANK_FILES: RefCell<Vec<web_sys::File>> = const { RefCell::new(Vec::new()) };
    /// The stored trace shown, when `collector serve` holds it and answers the requests
    /// ([`open_remote`]); `None`: the worker holds the shown trace.
    static REMOTE: RefCell<Option<String>> = const { RefCell::new(None) };
    /// Answers that came with the overview ([`ToPage::Loaded`]'s `first`), by request JSON.
    static PREFETCHED: RefCell<Vec<(String, Response)>> = const { RefCell::new(Vec::new()) };
    /// The widths of the timeline, active memory and fragmentation charts, as the warm-up
    /// report laid them out (the same width as a report's).
    static CHART_WIDTHS: std::cell::Cell<Option<[u32; 3]>> = const { std::cell::Cell::new(None) };
    /// A file too large for the page, waiting for "Upload to the server" ([`upload_offered`]).
    static OFFERED: RefCell<Option<web_sys::File>> = const { RefCell::new(None) };
    /// Requests waiting for the ones in flight ([`ask_when_idle`]).
    static DEFERRED: RefCell<Vec<(Request, Callback, bool)>> = const { RefCell::new(Vec::new()) };
}

/// Opens a trace stored in `collector serve` there: the server imports it natively and answers
/// every request (`/api/trace/{id}/overview`, `/api/trace/{id}/explore`), so a file larger than
/// a page can hold opens all the same. The trace shown before stays if it fails.
pub fn open_remote(state: AppState, id: &str) {
    state.begin_loading(id);
    let id = id.to_owned();
    leptos::task::spawn_local(async move {
        let path = format!("api/trace/{}/overview", crate::http::encode(&id));
        let answer = crate::http::call("GET", &path, None).await;
        match answer.and_then(|t| {
            serde_json::from_str::<shared::explore::Overview>(&t).map_err(|e| format!("the server's overview is unreadable: {e}"))
        }) {
            Ok(o) => {
                REMOTE.with(|r| *r.borrow_mut() = Some(id));
                state.finish_loading(o);
            }
            Err(e) => {
                state.loading.set(None);
                state.error.set(Some((id, e)));
            }
        }
    });
}

/// Whether the shown trace is held by the server (explored over HTTP).
pub fn is_remote() -> bool {
    REMOTE.with(|r| r.borrow().is_some())
}

/// Starts the worker (`worker_loader.js`, built by Trunk next to the page).
pub fn start(state: AppState) -> Result<(), String> {
    // A single-file report sets `window.__mtWorkerUrl` to a Blob holding the worker.
    let url = js_sys::Reflect::get(&js_sys::global(), &"__mtWorkerUrl".into())
        .ok()
        .and_then(|v| v.as_string())
        .unwrap_or_else(|| "./worker_loader.js".into());
    let worker = web_sys::Worker::new(&url).map_err(|e| format!("cannot start the worker: {e:?}"))?;
    let on_message = Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |e: web_sys::MessageEvent| {
        let Some(text) = e.data().as_string() else { return };
        crate::perf::mark(&format!("message of {} bytes", text.len()));
        match serde_json::from_str::<ToPage>(&text) {
            Ok(msg) => receive(state, msg),
            Err(err) => state.error.set(Some(("worker".into(), format!("unreadable message from the worker: {err}")))),
        }
    });
    worker.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    on_message.forget(); // lives as long as the page
    let on_error = Closure::<dyn FnMut(JsValue)>::new(move |_e: JsValue| {
        state.loading.set(None);
        let why = "the worker stopped, most likely out of memory (a browser gives it 4 GiB). Reload the page to try again; a trace too \
                   large for a page opens through collector serve (its page offers the upload) or with the native tools (collector summary, \
                   advise, convert), which stream it";
        state.error.set(Some(("worker".into(), why.into())));
    });
    worker.set_onerror(Some(on_error.as_ref().unchecked_ref()));
    on_error.forget();
    BRIDGE.with(|b| *b.borrow_mut() = Some(Bridge { worker, ready: false, queued: Vec::new(), next_id: 1, pending: HashMap::new() }));
    Ok(())
}

fn send(msg: JsValue) {
    BRIDGE.with(|b| {
        if let Some(b) = b.borrow_mut().as_mut() {
            if b.ready {
                let _ = b.worker.post_message(&msg);
            } else {
                b.queued.push(msg);
            }
        }
    });
}

fn object(pairs: &[(&str, JsValue)]) -> JsValue {
    let o = js_sys::Object::new();
    for (k, v) in pairs {
        let _ = js_sys::Reflect::set(&o, &JsValue::from_str(k), v);
    }
    o.into()
}

/// Notes the widths of the charts a report draws (from the warm-up report), for the first
/// answers the worker sends with an overview.
pub fn note_chart_widths() {
    let doc = document();
    let width = |id: &str| {
        doc.query_selector(&format!(".warmup #{id}"))
            .ok()
            .flatten()
            .and_then(|c| c.dyn_into::<web_sys::HtmlCanvasElement>().ok())
            .map(|c| c.width())
    };
    if let (Some(t), Some(a), Some(f)) = (width("timeline-canvas"), width("active-canvas"), width("fragmentation-canvas")) {
        CHART_WIDTHS.with(|w| w.set(Some([t, a, f])));
    }
}

/// Forgets a file offered for upload.
fn end_offer(state: AppState) {
    OFFERED.with(|o| o.borrow_mut().take());
    if state.offer_upload.with_untracked(Option::is_some) {
        state.offer_upload.set(None);
    }
}

/// Drops answers kept for a report that was not drawn (another trace is opening).
pub fn clear_prefetched() {
    PREFETCHED.with(|p| p.borrow_mut().clear());
}

/// The largest file this page opens itself: [`crate::protocol::PAGE_FILE_LIMIT_BYTES`], or
/// `?page_limit_mb=` (a machine with less memory, and the tests).
fn page_limit_bytes() -> f64 {
    crate::query_param("page_limit_mb")
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| *v > 0.0)
        .map_or(crate::protocol::PAGE_FILE_LIMIT_BYTES, |mb| mb * 1e6)
}

/// The memory the worker may hold once a file is open: [`crate::protocol::WORKER_MEMORY_BYTES`],
/// or `?page_memory_mb=` (a machine with less memory, and the tests).
fn page_memory_bytes() -> f64 {
    crate::query_param("page_memory_mb")
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| *v > 0.0)
        .map_or(crate::protocol::WORKER_MEMORY_BYTES as f64, |mb| mb * 1e6)
}

/// Uploads the file kept by [`open_file`] to the server that serves the page, and opens it
/// there: the server imports it natively and answers every view.
pub fn upload_offered(state: AppState) {
    let Some(file) = OFFERED.with(|o| o.borrow_mut().take()) else { return };
    state.offer_upload.set(None);
    state.error.set(None);
    let name = file.name();
    state.loading.set(Some((name.clone(), format!("uploading {} to the server", shared::units::format_bytes(file.size() as u64)))));
    leptos::task::spawn_local(async move {
        match crate::http::upload(&file).await {
            Ok(id) => open_remote(state, &id),
            Err(e) => {
                state.loading.set(None);
                state.error.set(Some((name, format!("the server did not take it: {e}"))));
            }
        }
    });
}

/// Opens a local file: the worker reads and imports it. A file larger than the page holds,
/// on a page `collector serve` serves, is kept to upload there instead (the page says so
/// before reading a byte).
pub fn open_file(state: AppState, file: web_sys::File) {
    let limit = page_limit_bytes();
    if file.size() > limit && crate::http::base().is_some() {
        end_offer(state);
        let name = file.name();
        let message = format!(
            "{name} is {}: more than this page holds ({}; a browser gives a page 4 GiB). This page is served by \
             collector serve: upload it there and the server imports it natively and answers every view here.",
            shared::units::format_bytes(file.size() as u64),
            shared::units::format_bytes(limit as u64)
        );
        OFFERED.with(|o| *o.borrow_mut() = Some(file));
        state.offer_upload.set(Some(name.clone()));
        state.error.set(Some((name, message)));
        return;
    }
    end_offer(state);
    if crate::perf::warming() {
        note_chart_widths();
    }
    let name = file.name();
    let mut fields = vec![("kind", JsValue::from("open_file")), ("file", file.into()), ("memory_budget", page_memory_bytes().into())];
    if let Some([t, a, f]) = CHART_WIDTHS.with(|w| w.get()) {
        fields.push(("widths", object(&[("timeline", t.into()), ("active", a.into()), ("fragmentation", f.into())])));
    }
    // The worker reads while the page drops its warm-up report and shows the progress.
    send(object(&fields));
    state.begin_loading(&name);
}

/// Opens the files dropped or chosen: one is a trace, several are the ranks of one job (merged
/// into one trace by the worker).
pub fn open_files(state: AppState, files: Vec<web_sys::File>) {
    match files.as_slice() {
        [] => {}
        [one] => open_file(state, one.clone()),
        _ => {
            RANK_FILES.with(|r| *r.borrow_mut() = files.clone());
            send_rank_files(state, files, false);
        }
    }
}

fn send_rank_files(state: AppState, files: Vec<web_sys::File>, allow_disjoint: bool) {
    let names: Vec<String> = files.iter().map(|f| f.name()).collect();
    let array = files.into_iter().collect::<js_sys::Array>();
    send(object(&[("kind", "open_files".into()), ("files", array.into()), ("allow_disjoint", allow_disjoint.into())]));
    state.begin_loading(&names.join(" + "));
}

/// Merges the last files again, although they were recorded far apart in time.
pub fn merge_anyway(state: AppState) {
    let files = RANK_FILES.with(|r| r.borrow().clone());
    if !files.is_empty() {
        send_rank_files(state, files, true);
    }
}

/// Compares the open trace with `file` (the Compare view).
pub fn compare_file(state: AppState, file: web_sys::File) {
    if is_remote() {
        let why = "comparing with a file needs the shown trace in the page; this one is explored on the server: compare stored traces in the server panel";
        state.error.set(Some((file.name(), why.into())));
        return;
    }
    state.error.set(None);
    state.loading.set(Some((file.name(), "starting the comparison".into())));
    send(object(&[("kind", "compare_file".into()), ("file", file.into())]));
}

/// The files of a file input or a drop.
pub fn files_of(list: Option<web_sys::FileList>) -> Vec<web_sys::File> {
    let Some(list) = list else { return Vec::new() };
    (0..list.length()).filter_map(|i| list.get(i)).collect()
}

/// Opens a trace from a URL (`?trace=`, a report's own trace).
pub fn open_url(state: AppState, url: &str) {
    open_url_as(state, url, url);
}

/// Opens a trace from a URL, showing `name` while it loads (`collector serve`'s traces, whose
/// URLs may carry a token).
pub fn open_url_as(state: AppState, url: &str, name: &str) {
    send(object(&[("kind", "open_url".into()), ("url", url.into())]));
    state.begin_loading(name);
}

/// Opens bytes the page already has (a single-file report's trace).
pub fn open_bytes(state: AppState, name: &str, bytes: js_sys::Uint8Array) {
    send(object(&[("kind", "open_bytes".into()), ("name", name.into()), ("bytes", bytes.into())]));
    state.begin_loading(name);
}

/// Asks whoever holds the shown trace (the worker, or the server); `done` gets the answer.
pub fn ask(request: &Request, done: impl FnOnce(Response) + 'static) {
    let Ok(body) = serde_json::to_string(request) else { return };
    let ready = PREFETCHED.with(|p| {
        let mut p = p.borrow_mut();
        let at = p.iter().position(|(b, _)| *b == body)?;
        Some(p.swap_remove(at).1)
    });
    if let Some(answer) = ready {
        // Answered as the worker would be: after this task's own work, before the next frame.
        crate::perf::mark(&format!("prefetched {}", body.split('"').nth(3).unwrap_or("?")));
        leptos::task::spawn_local(async move { done(answer) });
        return;
    }
    if let Some(id) = REMOTE.with(|r| r.borrow().clone()) {
        leptos::task::spawn_local(async move {
            let path = format!("api/trace/{}/explore", crate::http::encode(&id));
            let response = match crate::http::call("POST", &path, Some(body)).await {
                Ok(text) => serde_json::from_str::<Response>(&text)
                    .unwrap_or_else(|e| Response::Error { message: format!("the server's answer is unreadable: {e}") }),
                Err(message) => Response::Error { message },
            };
            done(response);
        });
        return;
    }
    let id = BRIDGE.with(|b| {
        b.borrow_mut().as_mut().map(|b| {
            let id = b.next_id;
            b.next_id += 1;
            let kind = body.split('"').nth(3).unwrap_or("?").to_owned();
            crate::perf::mark(&format!("ask {kind} #{id}"));
            let done: Callback = Box::new(move |r| {
                crate::perf::mark(&format!("answer {kind} #{id}"));
                done(r);
                crate::perf::mark(&format!("handled {kind} #{id}"));
            });
            b.pending.insert(id, (done, crate::perf::warming()));
            id
        })
    });
    if let Some(id) = id {
        send(object(&[("kind", "request".into()), ("id", id.into()), ("body", body.into())]));
    }
}

/// Asks once the requests in flight are answered, so that work nobody waits for (the advice)
/// does not hold up the charts: a report being built asks for its charts first.
pub fn ask_when_idle(request: Request, done: impl FnOnce(Response) + 'static) {
    if is_remote() {
        return ask(&request, done);
    }
    DEFERRED.with(|d| d.borrow_mut().push((request, Box::new(done), crate::perf::warming())));
    // After this task, whose effects ask for the charts.
    crate::after_this_task(flush_deferred);
}

/// Forgets the warm-up report's requests: their answers, if they come, go nowhere.
pub fn forget_warmup_requests() {
    BRIDGE.with(|b| {
        if let Some(b) = b.borrow_mut().as_mut() {
            b.pending.retain(|_, (_, warm)| !*warm);
        }
    });
    DEFERRED.with(|d| d.borrow_mut().retain(|(_, _, warm)| !*warm));
}

/// Sends the deferred requests if nothing is in flight.
fn flush_deferred() {
    let idle = BRIDGE.with(|b| b.borrow().as_ref().is_some_and(|b| b.pending.is_empty()));
    if idle {
        for (request, done, _) in DEFERRED.with(|d| std::mem::take(&mut *d.borrow_mut())) {
            ask(&request, done);
        }
    }
}

fn receive(state: AppState, msg: ToPage) {
    match msg {
        ToPage::Ready => BRIDGE.with(|b| {
            if let Some(b) = b.borrow_mut().as_mut() {
                b.ready = true;
                for m in b.queued.drain(..) {
                    let _ = b.worker.post_message(&m);
                }
            }
        }),
        ToPage::Progress { stage } => {
            crate::perf::mark(&stage);
            state.loading.update(|l| {
                if let Some(l) = l {
                    l.1 = stage;
                }
            })
        }
        ToPage::Loaded { overview, worker_memory_bytes, first } => {
            let first = first.into_iter().filter_map(|(r, a)| Some((serde_json::to_string(&r).ok()?, a))).collect();
            PREFETCHED.with(|p| *p.borrow_mut() = first);
            // The worker holds the shown trace again.
            REMOTE.with(|r| *r.borrow_mut() = None);
            state.worker_memory.set(worker_memory_bytes);
            crate::perf::set_body("data-worker-memory", &worker_memory_bytes.to_string());
            crate::perf::mark("overview received");
            state.finish_loading(*overview);
            crate::perf::mark("overview set");
        }
        ToPage::Failed { file_name, message, merge_anyway } => {
            state.loading.set(None);
            state.merge_anyway.set(merge_anyway.then(|| file_name.clone()));
            state.error.set(Some((file_name, message)));
        }
        ToPage::Compared { a_name, b_name, diff, worker_memory_bytes } => {
            state.worker_memory.set(worker_memory_bytes);
            state.loading.set(None);
            state.compare.set(Some(std::sync::Arc::new(crate::compare::Comparison {
                a: a_name,
                b: b_name,
                diff: *diff,
                of_open_trace: true,
            })));
        }
        ToPage::Warmup { overview } => crate::begin_warmup(*overview),
        ToPage::Answer { id, response, worker_memory_bytes } => {
            state.worker_memory.set(worker_memory_bytes);
            let cb = BRIDGE.with(|b| b.borrow_mut().as_mut().and_then(|b| b.pending.remove(&id)));
            if let Some((cb, _)) = cb {
                cb(*response);
            }
            flush_deferred();
        }
    }
}
