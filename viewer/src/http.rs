//! The page's HTTP client of `collector serve`'s API (below the transport, [`crate::bridge`],
//! and the server panel): the API's base, the token (`/?token=T`, kept for the tab in
//! sessionStorage, sent as a bearer header or as `access_token` where headers cannot be set),
//! calls and uploads.

use crate::dom::query_param;
use leptos::prelude::*;
use protocol::ErrorBody;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;

const TOKEN_KEY: &str = "memory-tracer-token";

/// The API's base URL when served by `collector serve`.
pub fn base() -> Option<String> {
    document().query_selector("meta[name=memory-tracer-server]").ok().flatten().and_then(|m| m.get_attribute("content"))
}

pub(crate) fn token() -> Option<String> {
    let storage = window().session_storage().ok().flatten();
    if let Some(t) = query_param("token").filter(|t| !t.is_empty()) {
        if let Some(s) = &storage {
            let _ = s.set_item(TOKEN_KEY, &t);
        }
        return Some(t);
    }
    storage.and_then(|s| s.get_item(TOKEN_KEY).ok().flatten())
}

pub fn encode(s: &str) -> String {
    js_sys::encode_uri_component(s).as_string().unwrap_or_default()
}

/// `path` under the API base, with the token as a query parameter (for EventSource and the
/// worker's fetch).
pub(crate) fn url_with_token(path: &str) -> String {
    let url = format!("{}{path}", base().unwrap_or_else(|| "./".into()));
    match token() {
        Some(t) => format!("{url}{}access_token={}", if url.contains('?') { '&' } else { '?' }, encode(&t)),
        None => url,
    }
}

/// Calls the API; `Err` holds the server's `detail` (or what went wrong).
pub async fn call(method: &str, path: &str, body: Option<String>) -> Result<String, String> {
    call_with(method, path, body.map(|b| (JsValue::from_str(&b), "application/json"))).await
}

/// Uploads a local file to the server's store (the browser streams the `File`; the page never
/// holds it) and returns its trace id.
pub async fn upload(file: &web_sys::File) -> Result<String, String> {
    let path = format!("api/trace/upload?filename={}", encode(&file.name()));
    let text = call_with("POST", &path, Some((file.into(), "application/octet-stream"))).await?;
    let answer: protocol::TraceResponse = serde_json::from_str(&text).map_err(|e| format!("the server's answer is unreadable: {e}"))?;
    Ok(answer.trace_id)
}

async fn call_with(method: &str, path: &str, body: Option<(JsValue, &str)>) -> Result<String, String> {
    let url = format!("{}{path}", base().unwrap_or_else(|| "./".into()));
    let js = |e: JsValue| format!("{e:?}");
    let init = web_sys::RequestInit::new();
    init.set_method(method);
    let headers = web_sys::Headers::new().map_err(js)?;
    if let Some(t) = token() {
        headers.set("Authorization", &format!("Bearer {t}")).map_err(js)?;
    }
    if let Some((b, content_type)) = body {
        headers.set("Content-Type", content_type).map_err(js)?;
        init.set_body(&b);
    }
    init.set_headers(&headers);
    let req = web_sys::Request::new_with_str_and_init(&url, &init).map_err(js)?;
    let resp: web_sys::Response = JsFuture::from(window().fetch_with_request(&req))
        .await
        .map_err(|_| "the server does not answer (stopped?)".to_owned())?
        .dyn_into()
        .map_err(js)?;
    let text = JsFuture::from(resp.text().map_err(js)?).await.map_err(js)?.as_string().unwrap_or_default();
    if resp.ok() {
        Ok(text)
    } else {
        Err(serde_json::from_str::<ErrorBody>(&text).map_or_else(|_| format!("HTTP {}: {text}", resp.status()), |d| d.detail))
    }
}
