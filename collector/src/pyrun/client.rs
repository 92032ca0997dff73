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
    let stored = upload_part(server, token, file, live_id, None)?;
    Ok((stored.id, stored.link))
}

/// What the server did with an uploaded trace.
#[derive(Debug)]
pub struct Uploaded {
    /// The trace's id (a job of several nodes: the one trace all nodes' parts go into).
    pub id: String,
    /// The viewer's link to it (while nodes are awaited: to follow it).
    pub link: String,
    /// The nodes whose parts the server still waits for; empty once the trace is stored.
    pub waiting_for: Vec<u32>,
    /// How long the server waits for them at most, in seconds.
    pub wait_s: u64,
}

/// [`upload`] of node `node`'s part of a job of several nodes (live trace `live_id`): the
/// server keeps it until every node's part came (202, [`protocol::NodePartAccepted`]), and
/// answers the last one with the merged trace.
fn upload_part(server: &str, token: Option<&str>, file: &Path, live_id: Option<&str>, node: Option<u32>) -> anyhow::Result<Uploaded> {
    let base = server_base(server)?;
    let name = file.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_else(|| "trace.mtrace.json".into());
    let body = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let mut req =
        http_agent().post(&format!("{base}/api/trace/upload")).query("filename", &name).header("Content-Type", "application/octet-stream");
    if let Some(id) = live_id {
        req = req.query("trace_id", id);
    }
    if let Some(k) = node {
        req = req.query("node", k.to_string());
    }
    let resp = with_token(req, token).send(&body[..]).with_context(|| format!("cannot reach {base}"))?;
    if resp.status().as_u16() == 202 {
        let part = answer::<protocol::NodePartAccepted>(resp, &base, "the node's part")?;
        let link = viewer_link(&base, token, "follow", &part.trace_id);
        return Ok(Uploaded { id: part.trace_id, link, waiting_for: part.waiting_for, wait_s: part.wait_s });
    }
    let id = answer::<protocol::TraceResponse>(resp, &base, "the trace")?.trace_id;
    let link = viewer_link(&base, token, "trace", &id);
    Ok(Uploaded { id, link, waiting_for: Vec::new(), wait_s: 0 })
}

/// Which node of a job of several nodes a live trace comes from (`collector trace --job`, or
/// torchrun's `--nnodes`, `--node-rank` and rendezvous).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeIdentity {
    /// The name every node of the job gives alike.
    pub job: String,
    /// How many nodes run the job.
    pub nnodes: u32,
    /// This node's rank, 0 to `nnodes` − 1.
    pub node_rank: u32,
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
    /// This node's rank in a job of several nodes (its uploads and errors say it).
    node: Option<u32>,
}

impl LiveClient {
    /// Announces the live trace of `model` (joining the running one of `node`'s job, when
    /// another node announced it first) and starts the thread that posts memory points.
    pub fn start(
        server: &str,
        token: Option<&str>,
        model: &str,
        node: Option<&NodeIdentity>,
        node_wait_s: Option<u64>,
    ) -> anyhow::Result<Self> {
        let base = server_base(server)?;
        let agent = http_agent();
        let request = protocol::LiveRequest {
            model_name: model.to_owned(),
            device: Some("live".into()),
            job: node.map(|n| n.job.clone()),
            nnodes: node.map(|n| n.nnodes),
            node_rank: node.map(|n| n.node_rank),
            node_wait_s: node.and(node_wait_s),
        };
        let resp = with_token(agent.post(&format!("{base}/api/trace/live")), token)
            .send_json(request)
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
        Ok(Self { base, token: token.map(str::to_owned), id, tx: Some(tx), poster: Some(poster), node: node.map(|n| n.node_rank) })
    }

    /// The viewer's link that follows the live trace.
    pub fn viewer_link(&self) -> String {
        viewer_link(&self.base, self.token.as_deref(), "follow", &self.id)
    }

    /// Queues points for the server (never blocks).
    pub fn send(&self, rank: Option<u32>, points: &[LivePoint]) {
        if let Some(tx) = &self.tx {
            let _ = tx.send((rank, points.to_vec()));
        }
    }

    /// Ends the live trace (this node's part of it, in a job of several nodes) with `file`
    /// (uploaded under its id) or, without one, with `error`.
    pub fn finish(mut self, file: Option<&Path>, error: &str) -> anyhow::Result<Uploaded> {
        drop(self.tx.take());
        if let Some(p) = self.poster.take() {
            let _ = p.join();
        }
        match file {
            Some(f) => upload_part(&self.base, self.token.as_deref(), f, Some(&self.id), self.node),
            None => {
                let url = format!("{}/api/trace/live/{}", self.base, self.id);
                let mut req = http_agent().post(&url);
                if let Some(k) = self.node {
                    req = req.query("node", k.to_string());
                }
                let resp = with_token(req, self.token.as_deref())
                    .send_json(protocol::ChildLine::Error { class: protocol::FailureClass::Invalid, detail: error.to_owned() })
                    .with_context(|| format!("cannot reach {}", self.base))?;
                answer::<protocol::LiveAccepted>(resp, &self.base, "the live trace's end")?;
                anyhow::bail!("{error}")
            }
        }
    }
}
