//! The viewer's Web Worker: reads files (or URLs), imports and analyses them with `shared`, keeps
//! the trace, and answers the page's requests, so the page never freezes on a large file.
//! Several files at once are the ranks of one job and are merged; one more file can be
//! compared with the open trace. The page's messages are `viewer::messages::ToWorker`, the
//! worker's `ToPage`.

use shared::explore::{Opened, Request, Response, Session};
use shared::ranks::merge::MergeOptions;
use shared::units::format_bytes;
use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use viewer::messages::requests::{self, Key};
use viewer::messages::{ChartWidths, ToPage, ToWorker, Unreadable};
use viewer::ring::{Ring, RingReader};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::{DedicatedWorkerGlobalScope, MessageEvent};

thread_local! {
    static SESSION: RefCell<Option<Session>> = const { RefCell::new(None) };
    /// When each stage of the file being opened began ([`Stages`]), for the benchmark's
    /// breakdown; restarted per file.
    static STAGES: RefCell<Stages> = RefCell::new(Stages::default());
    /// The open trace's `coming` requests below its report's first screen, answered when the
    /// page says that screen is painted ([`ToWorker::FirstScreenShown`]); replaced at each open.
    static AFTER_FIRST_SCREEN: RefCell<Vec<(Key, Request)>> = const { RefCell::new(Vec::new()) };
}

/// The stages of opening a file, timed on the worker's own clock (the page's is busy
/// meanwhile and would time its own turns).
#[derive(Default)]
struct Stages {
    /// (stage, ms since the epoch it began), in order.
    begun: Vec<(String, f64)>,
    /// Milliseconds spent reading slices of the file (the browser's round trips and the copy).
    read_ms: f64,
    /// When the importer last asked for bytes: the pickle is parsed then, the replay follows.
    last_read: Option<f64>,
}

/// Milliseconds since the epoch on the worker's clock (the page converts them to its own).
fn epoch_ms() -> f64 {
    scope().performance().map_or(0.0, |p| p.time_origin() + p.now())
}

/// A file begins to open: its stages are timed from here.
fn begin_stages() {
    STAGES.with(|s| *s.borrow_mut() = Stages::default());
    stage("opening");
}

/// Notes that `stage` begins now.
fn stage(stage: &str) {
    let at = epoch_ms();
    STAGES.with(|s| s.borrow_mut().begun.push((stage.to_owned(), at)));
}

/// The stages of the file just opened, the moment its last bytes were read among them.
fn take_stages() -> (Vec<(String, f64)>, f64) {
    let s = STAGES.with(|s| std::mem::take(&mut *s.borrow_mut()));
    let mut begun = s.begun;
    if let Some(at) = s.last_read {
        let k = begun.partition_point(|(_, t)| *t <= at);
        begun.insert(k, ("replaying (the last bytes read)".to_owned(), at));
    }
    (begun, s.read_ms)
}

fn scope() -> DedicatedWorkerGlobalScope {
    js_sys::global().unchecked_into()
}

fn post(msg: &ToPage) {
    // Posting only fails for uncloneable values; a string always clones.
    let _ = scope().post_message(&msg.to_js());
}

fn failed(file_name: &str, message: String) {
    post(&ToPage::Failed { file_name: file_name.to_owned(), message, merge_anyway: false });
}

/// The worker's allocator, counting the bytes it holds ([`held_bytes`]).
struct Counting;

static HELD: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed to `System` as it came; the count is only read.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { std::alloc::System.alloc(layout) };
        if !p.is_null() {
            HELD.fetch_add(layout.size(), Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { std::alloc::System.alloc_zeroed(layout) };
        if !p.is_null() {
            HELD.fetch_add(layout.size(), Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { std::alloc::System.dealloc(ptr, layout) };
        HELD.fetch_sub(layout.size(), Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let p = unsafe { std::alloc::System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            HELD.fetch_add(new_size, Relaxed);
            HELD.fetch_sub(layout.size(), Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes the worker's allocations hold now. A file's opening is checked against these, not
/// against the wasm memory's size ([`memory_bytes`]): that memory only grows, so after a file
/// stopped for want of memory it stays near the budget, and every file after it would stop at
/// its first byte though the memory is free again.
fn held_bytes() -> u64 {
    HELD.load(Relaxed) as u64
}

/// Bytes of the worker's wasm memory (its high-water mark: it never shrinks).
fn memory_bytes() -> u64 {
    #[cfg(target_arch = "wasm32")]
    return core::arch::wasm32::memory_size(0) as u64 * 65536;
    #[cfg(not(target_arch = "wasm32"))]
    0
}

/// Shows `stage` in the page's progress, once the file has been opening for
/// [`QUIET_PROGRESS_MS`].
fn post_progress(stage: &str) {
    let began = STAGES.with(|s| s.borrow().begun.first().map(|(_, at)| *at));
    if began.is_some_and(|at| epoch_ms() - at < QUIET_PROGRESS_MS) {
        return;
    }
    post(&ToPage::Progress { stage: stage.to_owned() });
}

/// How long a file opens before the page is told each stage: a small file's stages pass in a
/// few ms each, too fast to read, and each message changes the page's progress line, which the
/// page then lays out and paints while the worker opens the file (on two cores, beside it). In
/// 15 interleaved runs of the viewer benchmark (ResNet-18 snapshot) the first screen came at
/// 66 ms against 69 (median) and every chart at 157 against 185.
const QUIET_PROGRESS_MS: f64 = 100.0;

/// A stage of opening a file begins: timed, and shown in the page.
fn progress(name: &str) {
    stage(name);
    post_progress(name);
}

/// The requests a report of `overview` asks first, built as the views build them, for charts
/// `widths` wide.
fn first_requests(overview: &shared::explore::Overview, widths: Option<ChartWidths>) -> Vec<Request> {
    let Some(w) = widths else { return Vec::new() };
    if overview.summary.total_events == 0 {
        return Vec::new();
    }
    let full = requests::full_window(overview);
    let mut first = vec![requests::timeline(full, w.timeline), requests::active(full, w.active), Request::Flame { all_frames: false }];
    if requests::draws_fragmentation(overview) {
        first.push(requests::fragmentation(full, w.fragmentation));
    }
    if overview.has_segments {
        first.push(requests::segments(overview.summary.peak_time_s));
        first.push(requests::pools(w.pools));
    }
    first
}

/// Keeps what was opened and tells the page, with the answer to the report's first request
/// (the timeline's, when the page gave the charts' `widths`); the other first requests are
/// answered once the page has painted its first screen ([`first_screen_shown`]).
fn opened(result: Opened, widths: Option<ChartWidths>) {
    let (overview, coming) = match result {
        Opened::Trace(session, overview) => {
            SESSION.with(|s| *s.borrow_mut() = Some(*session));
            let coming = first_requests(&overview, widths);
            (overview, coming)
        }
        Opened::Sweep(overview) => {
            SESSION.with(|s| *s.borrow_mut() = None);
            (overview, Vec::new())
        }
    };
    progress("overview built");
    // The first screen's (the timeline's) answer goes with the overview; the others when the
    // page has painted that screen. The page looks them up by key (every first request has one).
    let mut coming = coming.into_iter().filter_map(|r| Some((Key::of(&r)?, r)));
    let answered: Vec<(Key, String)> = coming
        .next()
        .map(|(key, first)| {
            stage("the first screen's answer");
            (key, answer_json(&first))
        })
        .into_iter()
        .collect();
    let coming: Vec<(Key, Request)> = coming.collect();
    let keys = coming.iter().map(|(key, _)| *key).collect();
    // Posting includes writing the message (JSON): the page times it to its arrival.
    stage("posting the overview");
    let (stages, read_ms) = take_stages();
    post(&ToPage::Loaded { overview, worker_memory_bytes: memory_bytes(), answered, coming: keys, stages, read_ms });
    AFTER_FIRST_SCREEN.with(|p| *p.borrow_mut() = coming);
}

/// The JSON of the open trace's answer to `request`.
fn answer_json(request: &Request) -> String {
    serde_json::to_string(&session_answer(request)).unwrap_or_else(|e| {
        serde_json::to_string(&Response::Error { message: format!("cannot write the answer: {e}") }).unwrap_or_default()
    })
}

/// Answers a request the page was told is coming ([`ToPage::Loaded`]'s `coming`).
fn prefetch((key, request): (Key, Request)) {
    let response = answer_json(&request);
    post(&ToPage::Prefetched { key, response });
}

/// The page painted its first screen: the answers below it, in the order its views come.
fn first_screen_shown() {
    for request in AFTER_FIRST_SCREEN.with(|p| std::mem::take(&mut *p.borrow_mut())) {
        prefetch(request);
    }
}

fn open(file_name: &str, bytes: &[u8]) {
    begin_stages();
    match Session::open(file_name, bytes, progress) {
        Ok(result) => opened(result, None),
        Err(e) => failed(file_name, e.to_string()),
    }
}

/// The bytes of a local file (the worker may read synchronously).
fn read(file: &web_sys::File) -> Result<Vec<u8>, String> {
    progress(&format!("reading {} ({:.1} MB)", file.name(), file.size() / 1e6));
    web_sys::FileReaderSync::new()
        .and_then(|r| r.read_as_array_buffer(file))
        .map(|buf| js_sys::Uint8Array::new(&buf).to_vec())
        .map_err(|_| "the browser could not read the file".to_owned())
}

/// A local file read as the importer asks for bytes, so that the worker never holds the whole
/// file: from the ring the page reads it into ([`viewer::ring`]), or, on a page that cannot
/// share memory with its worker, in slices ([`web_sys::Blob::slice`]) the worker reads itself.
struct FileSlices {
    file: web_sys::File,
    source: Source,
    offset: f64,
    chunk: Vec<u8>,
    at: usize,
    last_progress: f64,
    /// No progress messages (the warm-up).
    quiet: bool,
    /// Bytes the worker may hold once the file is open ([`FileSlices::check_memory`]).
    memory_budget: f64,
}

/// Bytes read from the file at once. Each read is a round trip to the browser process: on a
/// 295 MB snapshot, 4 MiB slices spent 630 ms of a 1.78 s parse reading, 16 MiB ones 415 ms
/// of 1.49 s. (A second thread reading ahead in 16 MiB slices, through a `SharedArrayBuffer`
/// in a cross-origin isolated page, gained nothing more on two cores; the page's stream into a
/// ring, which the worker takes from as soon as any bytes arrived, does: [`viewer::ring`].)
const SLICE_BYTES: f64 = (16 << 20) as f64;

/// Where [`FileSlices`] gets the file's bytes.
enum Source {
    /// The page reads the file into this ring.
    Ring(RingReader),
    /// The worker reads slices itself.
    Slices(web_sys::FileReaderSync),
}

/// What opening a snapshot holds at its end over what its parse held: the trace's columns
/// (32 bytes an event) and stacks are built while the parsed entries (40 bytes each) are
/// still held. Measured in the page: 1.51 / 0.96 GiB (3.08 GB, 15.4 M entries of real
/// `stacks="all"` structure) and 1.91 / 1.20 GiB (1.46 GB, 19.2 M entries, short stacks).
const OPEN_OVER_PARSE: f64 = 1.6;

impl FileSlices {
    fn new(file: web_sys::File, source: Source, quiet: bool, memory_budget: f64) -> FileSlices {
        FileSlices { file, source, offset: 0.0, chunk: Vec::new(), at: 0, last_progress: 0.0, quiet, memory_budget }
    }

    /// Stops reading once what the worker holds, with what the rest of opening adds, passes
    /// its budget (a browser ends a worker that asks for more than 4 GiB, and what it was
    /// doing is lost with it): the error says where, how much the page holds, and the ways
    /// that open the file. The trace already open stays.
    fn check_memory(&self, size: f64) -> std::io::Result<()> {
        let held = held_bytes();
        if held as f64 * OPEN_OVER_PARSE <= self.memory_budget {
            return Ok(());
        }
        Err(std::io::Error::other(format!(
            "stopped at byte {:.0} of {:.0} ({:.0} %): the page's worker holds {}, and opening the file would take it past the {} a \
             page gets. {}",
            self.offset,
            size,
            self.offset / size.max(1.0) * 100.0,
            format_bytes(held),
            format_bytes(self.memory_budget as u64),
            ways_around(&self.file.name())
        )))
    }
}

impl std::io::Read for FileSlices {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.read_slices(buf);
        if !self.quiet {
            let at = epoch_ms();
            STAGES.with(|s| s.borrow_mut().last_read = Some(at));
        }
        n
    }
}

impl FileSlices {
    fn read_slices(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.at == self.chunk.len() {
            let began = epoch_ms();
            let size = self.file.size();
            if self.offset < size {
                self.check_memory(size)?;
            }
            let n = match &mut self.source {
                Source::Ring(ring) => ring.take(&mut self.chunk, viewer::ring::TAKE_BYTES)?,
                Source::Slices(reader) => read_slice(&self.file, reader, self.offset, size, &mut self.chunk)?,
            };
            self.at = 0;
            self.offset += n as f64;
            if !self.quiet {
                let ms = epoch_ms() - began;
                STAGES.with(|s| s.borrow_mut().read_ms += ms);
            }
            if n == 0 {
                self.chunk.clear();
                return Ok(0);
            }
            let end = self.offset;
            if !self.quiet && size > 0.0 && (end - self.last_progress >= size / 20.0 || end == size) {
                self.last_progress = end;
                // Shown, not timed: the stage is the parse.
                post_progress(&format!(
                    "parsing {} ({:.0} % of {:.1} MB; the page holds {})",
                    self.file.name(),
                    (end / size * 100.0).min(100.0),
                    size / 1e6,
                    format_bytes(memory_bytes())
                ));
            }
        }
        let n = buf.len().min(self.chunk.len() - self.at);
        buf[..n].copy_from_slice(&self.chunk[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// Reads the slice of `file` (`size` bytes) at `offset` into `chunk`: its length, 0 at the
/// file's end (or where it turned out shorter than it said, changed while read).
fn read_slice(
    file: &web_sys::File,
    reader: &web_sys::FileReaderSync,
    offset: f64,
    size: f64,
    chunk: &mut Vec<u8>,
) -> std::io::Result<usize> {
    if offset >= size {
        return Ok(0);
    }
    let end = (offset + SLICE_BYTES).min(size);
    let slice = file.slice_with_f64_and_f64(offset, end).map_err(|_| std::io::Error::other("the browser could not slice the file"))?;
    let buf = reader.read_as_array_buffer(&slice).map_err(|_| std::io::Error::other("the browser could not read the file"))?;
    let view = js_sys::Uint8Array::new(&buf);
    chunk.resize(view.length() as usize, 0);
    view.copy_to(chunk);
    Ok(chunk.len())
}

/// How a file too large for a page opens: on the server, or with the native tools.
fn ways_around(name: &str) -> String {
    format!(
        "Open it through the server, which imports it natively and draws every view here: `collector serve --max-upload-mb 16384`, \
         upload it (`curl -X POST -T {name} 'http://127.0.0.1:8000/api/trace/upload?filename={name}'`) and press \"on server\" in its \
         row. Or use the native tools, which stream it: `collector summary {name}`, `collector advise {name}`, or `collector convert \
         {name} -o out.csv` for the layer table"
    )
}

/// Largest file opened here (a page served by `collector serve` offers the server first).
const MAX_FILE_BYTES: f64 = viewer::messages::PAGE_FILE_LIMIT_BYTES;

fn open_file(file: web_sys::File, memory_budget: f64, widths: Option<ChartWidths>, ring: Option<Ring>) {
    // The ring's reader is dropped on every way out, which tells the page to stop reading.
    let source = match ring.map(RingReader::new) {
        Some(ring) => Ok(Source::Ring(ring)),
        None => web_sys::FileReaderSync::new().map(Source::Slices),
    };
    begin_stages();
    let name = file.name();
    let Ok(source) = source else { return failed(&name, "the browser could not read the file".into()) };
    let size = file.size();
    if size > MAX_FILE_BYTES {
        let message = format!(
            "{name} is {:.1} GB: a page holds traces of files up to about {:.1} GB (a browser gives it 4 GiB). {}",
            size / 1e9,
            MAX_FILE_BYTES / 1e9,
            ways_around(&name)
        );
        return failed(&name, message);
    }
    let slices = FileSlices::new(file, source, false, memory_budget);
    match Session::open_reader(&name, size as u64, slices, progress) {
        Ok(result) => opened(result, widths),
        Err(e) => failed(&name, e.to_string()),
    }
}

/// Several files: the ranks of one job, merged into one trace.
fn open_files(files: Vec<web_sys::File>, allow_disjoint: bool) {
    begin_stages();
    let mut named = Vec::with_capacity(files.len());
    for file in &files {
        match read(file) {
            Ok(bytes) => named.push((file.name(), bytes)),
            Err(message) => return failed(&file.name(), message),
        }
    }
    let options = MergeOptions { allow_disjoint, ..MergeOptions::default() };
    match Session::open_ranks(&named, &options, progress) {
        Ok(result) => opened(result, None),
        Err(e) => {
            let file_name = match &e {
                shared::explore::RanksError::File { file_name, .. } => file_name.clone(),
                _ => named.iter().map(|f| f.0.as_str()).collect::<Vec<_>>().join(" + "),
            };
            // A file's own error already names it in the panel's title.
            let message = match &e {
                shared::explore::RanksError::File { message, .. } => message.clone(),
                _ => e.to_string(),
            };
            post(&ToPage::Failed { file_name, message, merge_anyway: e.can_merge_anyway() });
        }
    }
}

/// Compares the open trace with `file`.
fn compare_file(file: web_sys::File) {
    let name = file.name();
    let bytes = match read(&file) {
        Ok(b) => b,
        Err(message) => return failed(&name, message),
    };
    progress("comparing");
    let result = SESSION.with(|s| match s.borrow().as_ref() {
        Some(session) => session.compare_with(&name, &bytes).map(|d| (session.name(), d)).map_err(|e| e.to_string()),
        None => Err("no trace is open to compare with: open one first".into()),
    });
    match result {
        Ok((a_name, diff)) => post(&ToPage::Compared { a_name, b_name: name, diff: Box::new(diff), worker_memory_bytes: memory_bytes() }),
        Err(message) => failed(&name, message),
    }
}

async fn open_url(url: String) {
    begin_stages();
    let name = url.rsplit('/').next().unwrap_or(&url).split('?').next().unwrap_or("trace").to_owned();
    progress(&format!("downloading {url}"));
    let fetched = async {
        let resp: web_sys::Response = wasm_bindgen_futures::JsFuture::from(scope().fetch_with_str(&url))
            .await
            .map_err(|_| format!("cannot fetch {url}: the server did not answer"))?
            .unchecked_into();
        if !resp.ok() {
            return Err(format!("cannot fetch {url}: HTTP {} {}", resp.status(), resp.status_text()));
        }
        let buf = resp.array_buffer().map_err(|_| format!("cannot read the body of {url}"))?;
        let buf = wasm_bindgen_futures::JsFuture::from(buf).await.map_err(|_| format!("cannot read the body of {url}"))?;
        Ok(js_sys::Uint8Array::new(&buf).to_vec())
    }
    .await;
    match fetched {
        Ok(bytes) => open(&name, &bytes),
        Err(message) => failed(&name, message),
    }
}

/// The open trace's answer to `request`.
fn session_answer(request: &Request) -> Response {
    SESSION.with(|s| match s.borrow_mut().as_mut() {
        Some(session) => session.answer(request),
        None => Response::Error { message: "no trace is open".into() },
    })
}

fn answer(id: u32, request: &Request) {
    let response = session_answer(request);
    post(&ToPage::Answer { id, response: Box::new(response), worker_memory_bytes: memory_bytes() });
}

fn on_message(e: MessageEvent) {
    match ToWorker::from_js(&e.data()) {
        Ok(ToWorker::OpenFile { file, memory_budget_bytes, widths, ring }) => open_file(file, memory_budget_bytes, widths, ring),
        Ok(ToWorker::OpenFiles { files, allow_disjoint }) => open_files(files, allow_disjoint),
        Ok(ToWorker::CompareFile { file }) => compare_file(file),
        Ok(ToWorker::OpenBytes { name, bytes }) => open(&name, &bytes.to_vec()),
        Ok(ToWorker::OpenUrl { url }) => wasm_bindgen_futures::spawn_local(open_url(url)),
        Ok(ToWorker::Request { id, request }) => answer(id, &request),
        Ok(ToWorker::FirstScreenShown) => first_screen_shown(),
        Err(Unreadable { request_id: Some(id), message }) => {
            let response = Response::Error { message: format!("bad request: {message}") };
            post(&ToPage::Answer { id, response: Box::new(response), worker_memory_bytes: memory_bytes() });
        }
        // Nothing the page sends: nobody waits for an answer.
        Err(Unreadable { request_id: None, .. }) => {}
    }
}

/// A real snapshot (an MLP's 3 Adam steps, 110 KB) the worker opens at start.
const WARMUP_SNAPSHOT: &[u8] = include_bytes!("../../../tests/data/mlp_adam_3steps.pickle");

/// Times the worker opens [`WARMUP_SNAPSHOT`] before a chosen file (which waits in the
/// worker's queue meanwhile). V8 optimises a wasm function once it has run enough; a real open
/// needs more than three of these to get there. Under Node's V8 (`open_stages` built for
/// wasm32-wasip1), the ResNet-18 snapshot opened after 3 rounds in 38 ms, after 8 in 27, after
/// 15 in 20 and after 25 in 11 (natively: 5 ms).
///
/// The functions an open calls once and that loop inside (the importer's parse loop
/// `import_reader`, the replay's walk, the overview's analyses) need more: V8 does not replace
/// a running wasm function, so one optimised during an open serves the next open only, and
/// its optimising compile (195 ms for `import_reader`) takes the other core meanwhile. With 20
/// rounds, Chromium 148 (`--js-flags=--trace-wasm-compilation-times`) compiled these during the
/// 57.5 MB snapshot's open; with 60 all but five of them before it, with 100 all but two (the
/// out-of-memory analysis, 29 ms, and one overview function, 6 ms). The first screen of that
/// file came at 300 ms against 420 (docs/benchmarks.md); the page is warm 0.2 s later (0.9 s).
const WARMUP_ROUNDS: usize = 100;

/// Opens [`WARMUP_SNAPSHOT`] [`WARMUP_ROUNDS`] times, read as a `Blob` the way a chosen file
/// is read, and keeps it open for the page's hidden warm-up report ([`ToPage::Warmup`]) until
/// a file is opened: V8 runs wasm in its baseline compiler until a function has run enough to
/// be optimised. With one round, the ResNet-18 snapshot (0.47 MB) was drawn 161-194 ms after
/// it was chosen and 52-97 ms when opened again; with three rounds here and in the page
/// ([`viewer::warmup_drawn`]), 82-118 ms the first time.
fn warm_up() {
    let blob = js_sys::Uint8Array::from(WARMUP_SNAPSHOT);
    let parts = js_sys::Array::of1(&blob);
    let Ok(file) = web_sys::File::new_with_u8_array_sequence(&parts, "warmup.pickle") else { return };
    let size = file.size();
    let memory_budget = viewer::messages::WORKER_MEMORY_BYTES as f64;
    let mut last = None;
    for round in 1..=WARMUP_ROUNDS {
        let Ok(reader) = web_sys::FileReaderSync::new() else { return };
        let slices = FileSlices::new(file.clone(), Source::Slices(reader), true, memory_budget);
        let Ok(Opened::Trace(session, overview)) = Session::open_reader("warmup.pickle", size as u64, slices, |_| {}) else { return };
        if round < WARMUP_ROUNDS {
            // What posting it costs, too (the last round is posted).
            let _ = serde_json::to_string(&ToPage::Warmup { overview: overview.clone() });
        }
        last = Some((session, overview));
    }
    let Some((session, overview)) = last else { return };
    SESSION.with(|s| *s.borrow_mut() = Some(*session));
    post(&ToPage::Warmup { overview });
}

fn main() {
    let handler = Closure::<dyn FnMut(MessageEvent)>::new(on_message);
    scope().set_onmessage(Some(handler.as_ref().unchecked_ref()));
    handler.forget(); // lives as long as the worker
    post(&ToPage::Ready);
    // Files chosen meanwhile wait in the worker's queue.
    warm_up();
}
