//! The HTTP client of `collector trace --serve URL`: a live trace announced when the command
//! starts, memory totals posted while the program runs, and the written trace uploaded at the
//! end (`collector serve`'s API, read and written as `protocol` types).

use anyhow::Context;
use record::live::LivePoint;
use std::path::Path;
use std::time::Duration;

fn http_agent() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(60))).build().into()
}

fn server_base(server: &str) -> anyhow::Result<String> {
    let base = server.trim_end_matches('/');
    if !(base.starts_with("http://") || base.starts_with("https://")) {
        anyhow::bail!("--serve {server}: expected the server's URL, e.g. http://127.0.0.1:8000");
    }
    Ok(base.to_owned())
}

/// The server's answer as `T`, or its refusal (`protocol::ErrorBody`) as an error.
fn answer<T: serde::de::DeserializeOwned>(mut resp: ureq::http::Response<ureq::Body>, base: &str, what: &str) -> anyhow::Result<T> {
    let status = resp.status().as_u16();
    if !(200..300).contains(&status) {
        let detail = resp.body_mut().read_json::<protocol::ErrorBody>().map_or_else(|_| "no detail".to_owned(), |b| b.detail);
        anyhow::bail!("{base} refused {what} ({status}): {detail}");
    }
    resp.body_mut().read_json::<T>().with_context(|| format!("{base} answered {what} with something this collector does not read"))
}

fn with_token<B>(req: ureq::RequestBuilder<B>, token: Option<&str>) -> ureq::RequestBuilder<B> {
    match token {
        Some(t) => req.header("Authorization", &format!("Bearer {t}")),
        None => req,
    }
}

/// The viewer's link to trace `id` (`follow`: while it runs).
fn viewer_link(base: &str, token: Option<&str>, param: &str, id: &str) -> String {
    match token {
        Some(t) => format!("{base}/?{param}={id}&token={t}"),
        None => format!("{base}/?{param}={id}"),
    }
}

/// Stores a written trace in a running `collector serve` (`POST /api/trace/upload`), as the
/// end of live trace `live_id` when given; returns its id and the viewer's link to it.
pub fn upload(server: &str, token: Option<&str>, file: &Path, live_id: Option<&str>) -> anyhow::Result<(String, String)> {
    let base = server_base(server)?;
    let name = file.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_else(|| "trace.mtrace.json".into());
    let body = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let mut req =
        http_agent().post(&format!("{base}/api/trace/upload")).query("filename", &name).header("Content-Type", "application/octet-stream");
    if let Some(id) = live_id {
        req = req.query("trace_id", id);
    }
    let resp = with_token(req, token).send(&body[..]).with_context(|| format!("cannot reach {base}"))?;
    let id = answer::<protocol::TraceResponse>(resp, &base, "the trace")?.trace_id;
    let link = viewer_link(&base, token, "trace", &id);
    Ok((id, link))
}

/// A run followed live in a `collector serve` (`collector trace --serve`): announced when
/// the command starts, memory totals posted as they stream in (from a thread, so the
/// collector's loop never waits on the network), ended by the uploaded trace.
pub struct LiveClient {
    base: String,
    token: Option<String>,
    id: String,
    tx: Option<std::sync::mpsc::Sender<(Option<u32>, Vec<LivePoint>)>>,
    poster: Option<std::thread::JoinHandle<()>>,
}

impl LiveClient {
    pub fn start(server: &str, token: Option<&str>, model: &str) -> anyhow::Result<Self> {
        let base = server_base(server)?;
        let agent = http_agent();
        let resp = with_token(agent.post(&format!("{base}/api/trace/live")), token)
            .send_json(protocol::LiveRequest { model_name: model.to_owned(), device: Some("live".into()) })
            .with_context(|| format!("cannot reach {base}"))?;
        let id = answer::<protocol::JobAccepted>(resp, &base, "the live trace")?.trace_id;
        let (tx, rx) = std::sync::mpsc::channel::<(Option<u32>, Vec<LivePoint>)>();
        let (url, tok) = (format!("{base}/api/trace/live/{id}"), token.map(str::to_owned));
        let poster = std::thread::Builder::new().name("live-poster".into()).spawn(move || {
            while let Ok((rank, points)) = rx.recv() {
                let sent = points.chunks(1024).try_for_each(|chunk| {
                    let line = protocol::ChildLine::Memory { points: chunk.to_vec(), rank };
                    let r = with_token(agent.post(&url), tok.as_deref()).send_json(&line);
                    match r {
                        Ok(resp) if resp.status().is_success() => Ok(()),
                        Ok(resp) => Err(format!("status {}", resp.status())),
                        Err(e) => Err(e.to_string()),
                    }
                });
                if let Err(e) = sent {
                    eprintln!("collector: live updates to the server stopped ({e}); the trace is still uploaded at the end");
                    while rx.recv().is_ok() {}
                    return;
                }
            }
        })?;
        Ok(Self { base, token: token.map(str::to_owned), id, tx: Some(tx), poster: Some(poster) })
    }

    pub fn viewer_link(&self) -> String {
        viewer_link(&self.base, self.token.as_deref(), "follow", &self.id)
    }

    /// Queues points for the server (never blocks).
    pub fn send(&self, rank: Option<u32>, points: &[LivePoint]) {
        if let Some(tx) = &self.tx {
            let _ = tx.send((rank, points.to_vec()));
        }
    }

    /// Ends the live trace with `file` (uploaded under its id) or, without one, with `error`.
    pub fn finish(mut self, file: Option<&Path>, error: &str) -> anyhow::Result<String> {
        drop(self.tx.take());
        if let Some(p) = self.poster.take() {
            let _ = p.join();
        }
        match file {
            Some(f) => upload(&self.base, self.token.as_deref(), f, Some(&self.id)).map(|(_, link)| link),
            None => {
                let url = format!("{}/api/trace/live/{}", self.base, self.id);
                let resp = with_token(http_agent().post(&url), self.token.as_deref())
                    .send_json(protocol::ChildLine::Error { class: protocol::FailureClass::Invalid, detail: error.to_owned() })
                    .with_context(|| format!("cannot reach {}", self.base))?;
                answer::<protocol::LiveAccepted>(resp, &self.base, "the live trace's end")?;
                anyhow::bail!("{error}")
            }
        }
    }
}
