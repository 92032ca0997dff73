//! The viewer's Web Worker: reads files (or URLs), imports and analyses them with `shared`, keeps
//! the trace, and answers the page's requests, so the page never freezes on a large file.

use shared::explore::{Opened, Request, Response, Session};
use std::cell::RefCell;
use viewer::protocol::ToPage;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::{DedicatedWorkerGlobalScope, MessageEvent};

thread_local! {
    static SESSION: RefCell<Option<Session>> = const { RefCell::new(None) };
}

fn scope() -> DedicatedWorkerGlobalScope {
    js_sys::global().unchecked_into()
}

fn post(msg: &ToPage) {
    let text = serde_json::to_string(msg).unwrap_or_else(|e| format!("{{\"kind\":\"failed\",\"file_name\":\"\",\"message\":\"{e}\"}}"));
    // Posting only fails for uncloneable values; a string always clones.
    let _ = scope().post_message(&JsValue::from_str(&text));
}

/// The worker's wasm memory: it only grows, so this is also its peak.
fn memory_bytes() -> u64 {
    #[cfg(target_arch = "wasm32")]
    return core::arch::wasm32::memory_size(0) as u64 * 65536;
    #[cfg(not(target_arch = "wasm32"))]
    0
}

fn field(obj: &JsValue, name: &str) -> JsValue {
    js_sys::Reflect::get(obj, &JsValue::from_str(name)).unwrap_or(JsValue::UNDEFINED)
}

fn open(file_name: &str, bytes: &[u8]) {
    let result = Session::open(file_name, bytes, |stage| post(&ToPage::Progress { stage: stage.to_owned() }));
    match result {
        Ok(Opened::Trace(session, overview)) => {
            SESSION.with(|s| *s.borrow_mut() = Some(*session));
            post(&ToPage::Loaded { overview, worker_memory_bytes: memory_bytes() });
        }
        Ok(Opened::Sweep(overview)) => {
            SESSION.with(|s| *s.borrow_mut() = None);
            post(&ToPage::Loaded { overview, worker_memory_bytes: memory_bytes() });
        }
        Err(message) => post(&ToPage::Failed { file_name: file_name.to_owned(), message }),
    }
}

fn open_file(file: web_sys::File) {
    let name = file.name();
    post(&ToPage::Progress { stage: format!("reading {:.1} MB", file.size() / 1e6) });
    let bytes = web_sys::FileReaderSync::new()
        .and_then(|r| r.read_as_array_buffer(&file))
        .map(|buf| js_sys::Uint8Array::new(&buf).to_vec());
    match bytes {
        Ok(bytes) => open(&name, &bytes),
        Err(_) => post(&ToPage::Failed { file_name: name, message: "the browser could not read the file".into() }),
    }
}

async fn open_url(url: String) {
    let name = url.rsplit('/').next().unwrap_or(&url).split('?').next().unwrap_or("trace").to_owned();
    post(&ToPage::Progress { stage: format!("downloading {url}") });
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
        Err(message) => post(&ToPage::Failed { file_name: name, message }),
    }
}

fn answer(id: u32, body: &str) {
    let response = match serde_json::from_str::<Request>(body) {
        Ok(req) => SESSION.with(|s| match s.borrow().as_ref() {
            Some(session) => session.answer(&req),
            None => Response::Error { message: "no trace is open".into() },
        }),
        Err(e) => Response::Error { message: format!("bad request: {e}") },
    };
    post(&ToPage::Answer { id, response: Box::new(response), worker_memory_bytes: memory_bytes() });
}

fn on_message(e: MessageEvent) {
    let data = e.data();
    match field(&data, "kind").as_string().as_deref() {
        Some("open_file") => {
            if let Ok(file) = field(&data, "file").dyn_into::<web_sys::File>() {
                open_file(file);
            }
        }
        Some("open_bytes") => {
            let name = field(&data, "name").as_string().unwrap_or_else(|| "trace".into());
            if let Ok(bytes) = field(&data, "bytes").dyn_into::<js_sys::Uint8Array>() {
                open(&name, &bytes.to_vec());
            }
        }
        Some("open_url") => {
            if let Some(url) = field(&data, "url").as_string() {
                wasm_bindgen_futures::spawn_local(open_url(url));
            }
        }
        Some("request") => {
            let id = field(&data, "id").as_f64().unwrap_or(0.0) as u32;
            answer(id, &field(&data, "body").as_string().unwrap_or_default());
        }
        _ => {}
    }
}

fn main() {
    let handler = Closure::<dyn FnMut(MessageEvent)>::new(on_message);
    scope().set_onmessage(Some(handler.as_ref().unchecked_ref()));
    handler.forget(); // lives as long as the worker
    post(&ToPage::Ready);
}
