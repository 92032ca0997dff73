//! The page's side of the worker: starts it, sends it files and requests ([`ToWorker`]), and
//! routes its answers ([`ToPage`]) to callbacks and to the [`Loader`]'s signals. A trace that
//! `collector serve` holds is asked over HTTP instead ([`open_remote`]). Opening, swapping
//! and showing traces all go through here.

pub mod warmup;

use crate::messages::requests::{self, Key};
use crate::messages::{read_answer, ChartWidths, ToPage, ToWorker};
use crate::perf;
use crate::state::{Comparison, Loader};
use leptos::prelude::*;
use shared::explore::{Overview, Request, Response};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;

/// What to do with a request's answer.
type OnAnswer = Box<dyn FnOnce(Response)>;

/// Everything the page keeps about its worker and the trace it shows.
struct Bridge {
    /// `None` until [`start`] (or when it failed: nothing is sent then).
    worker: Option<web_sys::Worker>,
    ready: bool,
    /// Messages sent before the worker said it was ready.
    queued: Vec<ToWorker>,
    next_id: u32,
    /// Callbacks by request id, and whether the warm-up report asked.
    pending: HashMap<u32, (OnAnswer, bool)>,
    /// Requests waiting for the ones in flight ([`ask_when_idle`]), and whether the warm-up
    /// report asked.
    deferred: Vec<(Request, OnAnswer, bool)>,
    /// Answers the worker sent after the overview ([`ToPage::Prefetched`]), by request, until
    /// asked for.
    prefetched: Vec<(Key, String)>,
    /// The requests whose answers the worker is sending after the overview
    /// ([`ToPage::Loaded`]'s `coming`) and has not sent yet.
    coming: Vec<Key>,
    /// Callbacks waiting for one of those answers.
    waiting: Vec<(Key, OnAnswer)>,
    /// The widths of the timeline, active memory and fragmentation charts, as the warm-up
    /// report laid them out (the same width as a report's).
    chart_widths: Option<ChartWidths>,
    /// The stored trace shown, when `collector serve` holds it and answers the requests
    /// ([`open_remote`]); `None`: the worker holds the shown trace.
    remote: Option<String>,
    /// The last files sent to be merged, to merge them anyway when they were refused as
    /// recorded far apart.
    rank_files: Vec<web_sys::File>,
    /// A file too large for the page, waiting for "Upload to the server" ([`upload_offered`]).
    offered: Option<web_sys::File>,
}

thread_local! {
    static BRIDGE: RefCell<Bridge> = RefCell::new(Bridge {
        worker: None,
        ready: false,
        queued: Vec::new(),
        next_id: 1,
        pending: HashMap::new(),
        deferred: Vec::new(),
        prefetched: Vec::new(),
        coming: Vec::new(),
        waiting: Vec::new(),
        chart_widths: None,
        remote: None,
        rank_files: Vec::new(),
        offered: None,
    });
}

/// Runs `f` on the bridge's state. Nothing that can call back into the bridge (an answer's
/// callback) runs inside.
fn with<R>(f: impl FnOnce(&mut Bridge) -> R) -> R {
    BRIDGE.with(|b| f(&mut b.borrow_mut()))
}

/// Starts the clock ([`perf::begin_open`]) and shows `name` loading, the trace shown before
/// staying until it is loaded. A caller that hands the worker its work sends it before this:
/// ending the warm-up and drawing the progress then run while the worker reads.
fn begin_loading(loader: Loader, name: &str) {
    perf::begin_open();
    warmup::end_warmup();
    // Answers kept for a report that was not drawn: another trace is opening.
    with(|b| {
        b.prefetched.clear();
        b.coming.clear();
        b.waiting.clear();
    });
    loader.error.set(None);
    loader.merge_anyway.set(None);
    loader.loading.set(Some((name.to_owned(), "starting".into())));
}

/// Shows `overview`, the trace just opened.
fn finish_loading(loader: Loader, overview: Overview) {
    perf::loaded(&overview);
    loader.loading.set(None);
    // A comparison with the trace that was open is no longer about what is shown.
    if loader.compare.with_untracked(|c| c.as_ref().is_some_and(|c| c.of_open_trace)) {
        loader.compare.set(None);
    }
    loader.overview.set(Some(Arc::new(overview)));
}

/// Opens a trace stored in `collector serve` there: the server imports it natively and answers
/// every request (`/api/trace/{id}/overview`, `/api/trace/{id}/explore`), so a file larger than
/// a page can hold opens all the same. The trace shown before stays if it fails.
pub fn open_remote(loader: Loader, id: &str) {
    begin_loading(loader, id);
    let id = id.to_owned();
    leptos::task::spawn_local(async move {
        let path = format!("api/trace/{}/overview", crate::http::encode(&id));
        let answer = crate::http::call("GET", &path, None).await;
        match answer.and_then(|t| serde_json::from_str::<Overview>(&t).map_err(|e| format!("the server's overview is unreadable: {e}"))) {
            Ok(o) => {
                with(|b| b.remote = Some(id));
                finish_loading(loader, o);
            }
            Err(e) => {
                loader.loading.set(None);
                loader.error.set(Some((id, e)));
            }
        }
    });
}

/// Whether the shown trace is held by the server (explored over HTTP).
pub fn is_remote() -> bool {
    with(|b| b.remote.is_some())
}

/// Starts the worker (`worker_loader.js`, built next to the page).
pub fn start(loader: Loader) -> Result<(), String> {
    // A single-file report sets `window.__mtWorkerUrl` to a Blob holding the worker.
    let url = js_sys::Reflect::get(&js_sys::global(), &"__mtWorkerUrl".into())
        .ok()
        .and_then(|v| v.as_string())
        .unwrap_or_else(|| "./worker_loader.js".into());
    let worker = web_sys::Worker::new(&url).map_err(|e| format!("cannot start the worker: {e:?}"))?;
    let on_message = Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |e: web_sys::MessageEvent| {
        let Some(text) = e.data().as_string() else { return };
        perf::mark(&format!("message of {} bytes", text.len()));
        match ToPage::from_text(&text) {
            Ok(msg) => receive(loader, msg),
            Err(err) => loader.error.set(Some(("worker".into(), err))),
        }
    });
    worker.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    on_message.forget(); // lives as long as the page
    let on_error = Closure::<dyn FnMut(JsValue)>::new(move |_e: JsValue| {
        loader.loading.set(None);
        let why = "the worker stopped, most likely out of memory (a browser gives it 4 GiB). Reload the page to try again; a trace too \
                   large for a page opens through collector serve (its page offers the upload) or with the native tools (collector summary, \
                   advise, convert), which stream it";
        loader.error.set(Some(("worker".into(), why.into())));
    });
    worker.set_onerror(Some(on_error.as_ref().unchecked_ref()));
    on_error.forget();
    with(|b| b.worker = Some(worker));
    Ok(())
}

/// Posts `msg` to the worker, or queues it until the worker is ready.
fn send(msg: ToWorker) {
    with(|b| match &b.worker {
        Some(w) if b.ready => {
            let _ = w.post_message(&msg.to_js());
        }
        Some(_) => b.queued.push(msg),
        None => {}
    });
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
    if let (Some(timeline), Some(active), Some(fragmentation), Some(pools)) =
        (width("timeline-canvas"), width("active-canvas"), width("fragmentation-canvas"), width("pools-canvas"))
    {
        with(|b| b.chart_widths = Some(ChartWidths { timeline, active, fragmentation, pools }));
    }
}

/// Forgets a file offered for upload.
fn end_offer(loader: Loader) {
    with(|b| b.offered.take());
    if loader.offer_upload.with_untracked(Option::is_some) {
        loader.offer_upload.set(None);
    }
}

/// The largest file this page opens itself: [`crate::messages::PAGE_FILE_LIMIT_BYTES`], or
/// `?page_limit_mb=` (a machine with less memory, and the tests).
fn page_limit_bytes() -> f64 {
    crate::dom::query_param("page_limit_mb")
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| *v > 0.0)
        .map_or(crate::messages::PAGE_FILE_LIMIT_BYTES, |mb| mb * 1e6)
}

/// The memory the worker may hold once a file is open: [`crate::messages::WORKER_MEMORY_BYTES`],
/// or `?page_memory_mb=` (a machine with less memory, and the tests).
fn page_memory_bytes() -> f64 {
    crate::dom::query_param("page_memory_mb")
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| *v > 0.0)
        .map_or(crate::messages::WORKER_MEMORY_BYTES as f64, |mb| mb * 1e6)
}

/// Uploads the file kept by [`open_file`] to the server that serves the page, and opens it
/// there: the server imports it natively and answers every view.
pub fn upload_offered(loader: Loader) {
    let Some(file) = with(|b| b.offered.take()) else { return };
    loader.offer_upload.set(None);
    loader.error.set(None);
    let name = file.name();
    loader.loading.set(Some((name.clone(), format!("uploading {} to the server", shared::units::format_bytes(file.size() as u64)))));
    leptos::task::spawn_local(async move {
        match crate::http::upload(&file).await {
            Ok(id) => open_remote(loader, &id),
            Err(e) => {
                loader.loading.set(None);
                loader.error.set(Some((name, format!("the server did not take it: {e}"))));
            }
        }
    });
}

/// Opens a local file: the worker reads and imports it. A file larger than the page holds,
/// on a page `collector serve` serves, is kept to upload there instead (the page says so
/// before reading a byte).
pub fn open_file(loader: Loader, file: web_sys::File) {
    let limit = page_limit_bytes();
    if file.size() > limit && crate::http::base().is_some() {
        end_offer(loader);
        let name = file.name();
        let message = format!(
            "{name} is {}: more than this page holds ({}; a browser gives a page 4 GiB). This page is served by \
             collector serve: upload it there and the server imports it natively and answers every view here.",
            shared::units::format_bytes(file.size() as u64),
            shared::units::format_bytes(limit as u64)
        );
        with(|b| b.offered = Some(file));
        loader.offer_upload.set(Some(name.clone()));
        loader.error.set(Some((name, message)));
        return;
    }
    end_offer(loader);
    if perf::warming() {
        note_chart_widths();
    }
    let name = file.name();
    let widths = with(|b| b.chart_widths);
    // The page reads the file into shared memory as the worker parses it, where it may share
    // memory; elsewhere the worker reads it. Either way while the page drops its warm-up report
    // and shows the progress.
    let ring = crate::ring::Ring::for_file(file.size());
    perf::set_body("data-read", if ring.is_some() { "shared" } else { "worker" });
    send(ToWorker::OpenFile { file: file.clone(), memory_budget_bytes: page_memory_bytes(), widths, ring: ring.clone() });
    if let Some(ring) = ring {
        leptos::task::spawn_local(crate::ring::fill(ring, file));
    }
    begin_loading(loader, &name);
}

/// Opens the files dropped or chosen: one is a trace, several are the ranks of one job (merged
/// into one trace by the worker).
pub fn open_files(loader: Loader, files: Vec<web_sys::File>) {
    match files.as_slice() {
        [] => {}
        [one] => open_file(loader, one.clone()),
        _ => {
            with(|b| b.rank_files = files.clone());
            send_rank_files(loader, files, false);
        }
    }
}

fn send_rank_files(loader: Loader, files: Vec<web_sys::File>, allow_disjoint: bool) {
    let names: Vec<String> = files.iter().map(|f| f.name()).collect();
    send(ToWorker::OpenFiles { files, allow_disjoint });
    begin_loading(loader, &names.join(" + "));
}

/// Merges the last files again, although they were recorded far apart in time.
pub fn merge_anyway(loader: Loader) {
    let files = with(|b| b.rank_files.clone());
    if !files.is_empty() {
        send_rank_files(loader, files, true);
    }
}

/// Compares the open trace with `file` (the Compare view).
pub fn compare_file(loader: Loader, file: web_sys::File) {
    if is_remote() {
        let why = "comparing with a file needs the shown trace in the page; this one is explored on the server: compare stored traces in the server panel";
        loader.error.set(Some((file.name(), why.into())));
        return;
    }
    loader.error.set(None);
    loader.loading.set(Some((file.name(), "starting the comparison".into())));
    send(ToWorker::CompareFile { file });
}

/// The report's first screen is painted, or its views below are built without it: the worker
/// sends the answers they wait for ([`ToWorker::FirstScreenShown`]), if any are still coming.
pub fn first_screen_shown() {
    if with(|b| !b.coming.is_empty()) {
        send(ToWorker::FirstScreenShown);
    }
}

/// The files of a file input or a drop.
pub fn files_of(list: Option<web_sys::FileList>) -> Vec<web_sys::File> {
    let Some(list) = list else { return Vec::new() };
    (0..list.length()).filter_map(|i| list.get(i)).collect()
}

/// Opens a trace from a URL (`?trace=`, a report's own trace).
pub fn open_url(loader: Loader, url: &str) {
    open_url_as(loader, url, url);
}

/// Opens a trace from a URL, showing `name` while it loads (`collector serve`'s traces, whose
/// URLs may carry a token).
pub fn open_url_as(loader: Loader, url: &str, name: &str) {
    send(ToWorker::OpenUrl { url: url.to_owned() });
    begin_loading(loader, name);
}

/// Opens bytes the page already has (a single-file report's trace).
pub fn open_bytes(loader: Loader, name: &str, bytes: js_sys::Uint8Array) {
    send(ToWorker::OpenBytes { name: name.to_owned(), bytes });
    begin_loading(loader, name);
}

/// Shows `rank` (or every rank) of a merged trace in every view: the worker swaps traces and
/// answers with the new overview.
pub fn show_rank(loader: Loader, rank: Option<u32>) {
    let what = rank.map_or("every rank".to_owned(), |r| format!("rank {r}"));
    begin_loading(loader, &what);
    loader.loading.set(Some((what.clone(), "analysing".into())));
    ask(&Request::ShowRank { rank }, move |r| match r {
        Response::Overview(o) => finish_loading(loader, *o),
        Response::Error { message } => {
            loader.loading.set(None);
            loader.error.set(Some((what, message)));
        }
        _ => loader.loading.set(None),
    });
}

/// Asks whoever holds the shown trace (the worker, or the server); `done` gets the answer.
pub fn ask(request: &Request, done: impl FnOnce(Response) + 'static) {
    let kind = requests::kind(request);
    let ready = Key::of(request).and_then(|key| {
        with(|b| {
            let at = b.prefetched.iter().position(|(k, _)| *k == key)?;
            Some(b.prefetched.swap_remove(at).1)
        })
    });
    if let Some(answer) = ready {
        let answer = read_answer(&answer);
        // Answered as the worker would be: after this task's own work, before the next frame.
        perf::mark(&format!("prefetched {kind}"));
        leptos::task::spawn_local(async move { done(answer) });
        return;
    }
    // The worker is sending this answer already: wait for it rather than ask again.
    if let Some(key) = Key::of(request).filter(|key| with(|b| b.coming.contains(key))) {
        perf::mark(&format!("awaits {kind}"));
        with(|b| b.waiting.push((key, Box::new(done))));
        return;
    }
    if let Some(id) = with(|b| b.remote.clone()) {
        let Ok(body) = serde_json::to_string(request) else { return };
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
    let id = with(|b| {
        b.worker.as_ref()?;
        let id = b.next_id;
        b.next_id += 1;
        perf::mark(&format!("ask {kind} #{id}"));
        let done: OnAnswer = Box::new(move |r| {
            perf::mark(&format!("answer {kind} #{id}"));
            done(r);
            perf::mark(&format!("handled {kind} #{id}"));
        });
        b.pending.insert(id, (done, perf::warming()));
        Some(id)
    });
    if let Some(id) = id {
        send(ToWorker::Request { id, request: request.clone() });
    }
}

/// Asks once the requests in flight are answered, so that work nobody waits for (the advice)
/// does not hold up the charts: a report being built asks for its charts first.
pub fn ask_when_idle(request: Request, done: impl FnOnce(Response) + 'static) {
    if is_remote() {
        return ask(&request, done);
    }
    with(|b| b.deferred.push((request, Box::new(done), perf::warming())));
    // After this task, whose effects ask for the charts.
    crate::dom::after_this_task(flush_deferred);
}

/// Forgets the warm-up report's requests: their answers, if they come, go nowhere.
pub fn forget_warmup_requests() {
    with(|b| {
        b.pending.retain(|_, (_, warm)| !*warm);
        b.deferred.retain(|(_, _, warm)| !*warm);
    });
}

/// Sends the deferred requests if nothing is in flight.
fn flush_deferred() {
    let idle = |b: &Bridge| b.worker.is_some() && b.pending.is_empty() && b.waiting.is_empty();
    let deferred = with(|b| if idle(b) { std::mem::take(&mut b.deferred) } else { Vec::new() });
    for (request, done, _) in deferred {
        ask(&request, done);
    }
}

fn receive(loader: Loader, msg: ToPage) {
    match msg {
        ToPage::Ready => with(|b| {
            b.ready = true;
            if let Some(w) = &b.worker {
                for m in b.queued.drain(..) {
                    let _ = w.post_message(&m.to_js());
                }
            }
        }),
        ToPage::Progress { stage } => {
            perf::mark(&stage);
            loader.loading.update(|l| {
                if let Some(l) = l {
                    l.1 = stage;
                }
            })
        }
        ToPage::Loaded { overview, worker_memory_bytes, answered, coming, stages, read_ms } => {
            perf::worker_stages(&stages, read_ms);
            with(|b| {
                // Kept for the view that asks (the report is built after this task).
                for (key, response) in answered {
                    b.prefetched.retain(|(k, _)| *k != key);
                    b.prefetched.push((key, response));
                }
                b.coming = coming;
                // The worker holds the shown trace again.
                b.remote = None;
            });
            loader.worker_memory.set(worker_memory_bytes);
            perf::set_body("data-worker-memory", &worker_memory_bytes.to_string());
            perf::mark("overview received");
            finish_loading(loader, *overview);
            perf::mark("overview set");
        }
        ToPage::Prefetched { key, response } => prefetched(key, response),
        ToPage::Failed { file_name, message, merge_anyway } => {
            loader.loading.set(None);
            loader.merge_anyway.set(merge_anyway.then(|| file_name.clone()));
            loader.error.set(Some((file_name, message)));
        }
        ToPage::Compared { a_name, b_name, diff, worker_memory_bytes } => {
            loader.worker_memory.set(worker_memory_bytes);
            loader.loading.set(None);
            loader.compare.set(Some(Arc::new(Comparison { a: a_name, b: b_name, diff: *diff, of_open_trace: true })));
        }
        ToPage::Warmup { overview } => warmup::begin_warmup(*overview),
        ToPage::Answer { id, response, worker_memory_bytes } => {
            loader.worker_memory.set(worker_memory_bytes);
            let cb = with(|b| b.pending.remove(&id));
            if let Some((cb, _)) = cb {
                cb(*response);
            }
            flush_deferred();
        }
    }
}

/// An answer the worker sent after the overview: to the view waiting for it, else kept until
/// a view asks. One for a trace no longer opening (another was chosen) is dropped.
fn prefetched(key: Key, response: String) {
    let waiting = with(|b| {
        let at = b.coming.iter().position(|k| *k == key)?;
        b.coming.swap_remove(at);
        Some(b.waiting.iter().position(|(k, _)| *k == key).map(|w| b.waiting.swap_remove(w).1))
    });
    match waiting {
        None => {}
        Some(None) => {
            perf::mark(&format!("prefetched {} (kept)", key.kind()));
            with(|b| b.prefetched.push((key, response)));
        }
        Some(Some(done)) => {
            perf::mark(&format!("prefetched {} (awaited)", key.kind()));
            done(read_answer(&response));
            flush_deferred();
        }
    }
}
