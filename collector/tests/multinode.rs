//! One job on several nodes, live: each node's `collector trace --serve URL -- torchrun
//! --nnodes 2 --node-rank K ...` joins the job's one live trace, streams its ranks' memory to
//! it, and uploads its part; the server stores the merge of every node's ranks, naming the
//! ranks of a node that failed or never came. Two nodes are simulated as two processes on this
//! machine (gloo, torchrun's static rendezvous).
//!
//! The torchrun tests need the torch venv's Python (`MEMORY_TRACER_PYTHON`, set by `cargo
//! xtask`; else `python3`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod server;

use serde_json::{json, Value};
use server::{scratch, Server};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data").join(name)
}

fn python() -> String {
    std::env::var("MEMORY_TRACER_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn program(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/python/programs").join(name).display().to_string()
}

/// Every event of trace `id` so far, (name, data), up to its end.
fn read_events(s: &Server, id: &str) -> Vec<(String, Value)> {
    let (code, events) = s.events(id);
    assert_eq!(code, 200);
    events
}

/// The stored trace `id`, read back.
fn stored_trace(s: &Server, id: &str, dir: &Path) -> shared::Trace {
    let r = s.agent.get(s.url(&format!("/api/trace/{id}"))).call().unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let file = dir.join(format!("{id}.mtrace.json"));
    std::fs::write(&file, r.into_body().with_config().limit(1 << 30).read_to_vec().unwrap()).unwrap();
    traceio::files::load_trace(&file, &shared::ImportOptions::default()).unwrap()
}

fn detail(v: &Value) -> &str {
    v["detail"].as_str().unwrap_or_else(|| panic!("no detail in {v}"))
}

/// The server side alone: two nodes' parts (one rank's snapshot each) merge into one trace of
/// both ranks; a node that never comes is waited for `node_wait_s`, then named.
#[test]
fn parts_of_several_nodes_merge_into_one_trace_and_absent_nodes_are_named() {
    let dir = scratch("multinode_parts");
    let s = Server::start(&dir.join("data"), &[]);
    let live = |node: u32, wait: u64| json!({"model_name": "ddp", "job": "j1", "nnodes": 2, "node_rank": node, "node_wait_s": wait});
    let (code, a) = s.post_json("/api/trace/live", &live(0, 60));
    assert_eq!(code, 202, "{a}");
    let id = a["trace_id"].as_str().unwrap().to_owned();
    let (code, b) = s.post_json("/api/trace/live", &live(1, 60));
    assert_eq!((code, b["trace_id"].as_str()), (202, Some(id.as_str())), "the second node joins the first's trace");
    let (code, e) = s.post_json("/api/trace/live", &json!({"model_name": "ddp", "job": "j1", "nnodes": 3, "node_rank": 2}));
    assert_eq!(code, 422);
    assert!(detail(&e).contains("runs on 2 nodes"), "{e}");
    let (code, e) = s.post_json("/api/trace/live", &json!({"model_name": "ddp", "job": "j9", "nnodes": 2, "node_rank": 2}));
    assert_eq!(code, 422);
    assert!(detail(&e).contains("node_rank"), "{e}");
    let (code, e) = s.post_bytes(&format!("/api/trace/upload?filename=a.pickle&trace_id={id}"), b"x");
    assert_eq!(code, 422);
    assert!(detail(&e).contains("`node`"), "{e}");

    let part = |id: &str, node: u32, file: &str| {
        s.post_bytes(&format!("/api/trace/upload?filename={file}&trace_id={id}&node={node}"), &std::fs::read(data(file)).unwrap())
    };
    let (code, first) = part(&id, 1, "ddp_rank1.pickle.gz");
    assert_eq!(code, 202, "{first}");
    assert_eq!((first["status"].as_str(), first["waiting_for"].clone()), (Some("waiting"), json!([0])));
    let (code, e) = part(&id, 1, "ddp_rank1.pickle.gz");
    assert_eq!(code, 422);
    assert!(detail(&e).contains("ended already"), "{e}");
    let (code, done) = part(&id, 0, "ddp_rank0.pickle.gz");
    assert_eq!(code, 200, "the last part is answered with the merged trace: {done}");
    assert_eq!(done["trace_id"].as_str(), Some(id.as_str()));
    let t = stored_trace(&s, &id, &dir);
    assert_eq!(shared::ranks::ranks(&t), [0, 1]);
    assert!(t.meta.missing_ranks.is_empty(), "{:?}", t.meta.warnings);
    let kinds: Vec<String> = read_events(&s, &id).into_iter().map(|(k, _)| k).collect();
    assert_eq!(kinds, ["status", "done"]);
    let tmp: Vec<_> = std::fs::read_dir(dir.join("data/tmp")).unwrap().collect();
    assert!(tmp.is_empty(), "the parts are removed: {tmp:?}");

    // Node 1 never comes: node 0's part is stored after the wait, node 1 named.
    let (_, a) = s.post_json("/api/trace/live", &live(0, 1));
    let id = a["trace_id"].as_str().unwrap().to_owned();
    let (code, waiting) = part(&id, 0, "ddp_rank0.pickle.gz");
    assert_eq!((code, waiting["wait_s"].as_u64()), (202, Some(1)), "{waiting}");
    let events = read_events(&s, &id);
    assert_eq!(events.last().map(|(k, _)| k.as_str()), Some("done"), "{events:?}");
    let t = stored_trace(&s, &id, &dir);
    assert_eq!(shared::ranks::ranks(&t), [0]);
    assert!(t.meta.warnings.iter().any(|w| w.contains("node 1 never joined within 1 s")), "{:?}", t.meta.warnings);
    let (code, e) = part(&id, 1, "ddp_rank1.pickle.gz");
    assert_eq!(code, 404, "a part after the merge finds no live trace: {e}");

    // Every node failed: the job fails, saying why.
    let (_, a) = s.post_json("/api/trace/live", &json!({"model_name": "ddp", "job": "j2", "nnodes": 1}));
    let id = a["trace_id"].as_str().unwrap().to_owned();
    let (code, _) =
        s.post_json(&format!("/api/trace/live/{id}?node=0"), &json!({"kind": "error", "class": "invalid", "detail": "nothing was traced"}));
    assert_eq!(code, 200);
    let events = read_events(&s, &id);
    let (kind, last) = events.last().unwrap();
    assert_eq!(kind, "failed");
    assert!(detail(last).contains("node 0 failed: nothing was traced"), "{last}");
}

/// A free loopback port (for torchrun's rendezvous).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `collector trace --serve URL -- torchrun --nnodes 2 --node-rank K ... ddp_nodes.py ARGS`
/// started in `dir/nodeK`.
fn node(s: &Server, dir: &Path, k: u32, port: u16, args: &[&str], flags: &[&str]) -> Child {
    let work = dir.join(format!("node{k}"));
    std::fs::create_dir_all(&work).unwrap();
    let (k, port) = (k.to_string(), port.to_string());
    Command::new(env!("CARGO_BIN_EXE_collector"))
        .current_dir(&work)
        .env_remove("MEMORY_TRACER_PYTHONPATH")
        .args(["trace", "-q", "--serve", &s.base])
        .args(flags)
        .args(["--", &python(), "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", &k, "--nproc-per-node", "2"])
        .args(["--master-addr", "127.0.0.1", "--master-port", &port, &program("ddp_nodes.py")])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The live trace's id from the server's job list (the one job of these nodes).
fn the_one_job(s: &Server) -> String {
    let (_, jobs) = s.get_json("/api/jobs");
    let rows = jobs["jobs"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "one job for both nodes: {jobs}");
    rows[0]["trace_id"].as_str().unwrap().to_owned()
}

/// Two nodes of two ranks each stream into one live trace: every rank's memory arrives before
/// the end, and the stored trace has all four ranks.
#[test]
fn two_torchrun_nodes_stream_every_rank_into_one_live_trace() {
    let dir = scratch("multinode_torchrun");
    let s = Server::start(&dir.join("data"), &[]);
    let port = free_port();
    let nodes: Vec<Child> = (0..2).map(|k| node(&s, &dir, k, port, &[], &[])).collect();
    let outs: Vec<_> = nodes.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
    for (k, o) in outs.iter().enumerate() {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "node {k}: {err}");
        assert!(err.contains("of job torchrun:127.0.0.1:"), "node {k} says its job: {err}");
        assert!(!err.contains("is missing from the merged trace"), "the other node's ranks are not missing here: {err}");
    }
    let said = |k: usize| String::from_utf8_lossy(&outs[k].stderr).into_owned();
    assert!(said(0).contains("stored in") || said(1).contains("stored in"), "the last node is answered with the trace");
    let id = the_one_job(&s);
    let events = read_events(&s, &id);
    let end = events.iter().position(|(k, _)| k == "done").unwrap_or_else(|| panic!("{events:?}"));
    let mut ranks: Vec<u64> = events[..end].iter().filter(|(k, _)| k == "memory").filter_map(|(_, v)| v["rank"].as_u64()).collect();
    ranks.sort_unstable();
    ranks.dedup();
    assert_eq!(ranks, [0, 1, 2, 3], "every rank's memory arrives before the end");
    let t = stored_trace(&s, &id, &dir);
    assert_eq!(shared::ranks::ranks(&t), [0, 1, 2, 3]);
    assert!(t.meta.missing_ranks.is_empty(), "{:?}", t.meta.warnings);
    assert_eq!(t.iterations.len(), 4);
}

/// Node 1's program fails before importing torch: node 0's ranks give up waiting for it, node 0
/// uploads its part, and the stored trace has ranks 0 and 1, naming 2 and 3 and why.
#[test]
fn a_failed_node_leaves_its_ranks_named_missing() {
    let dir = scratch("multinode_failed");
    let s = Server::start(&dir.join("data"), &[]);
    let port = free_port();
    let args = ["--fail-node", "1", "--init-timeout", "15"];
    let nodes: Vec<Child> = (0..2).map(|k| node(&s, &dir, k, port, &args, &["--node-wait-s", "120"])).collect();
    let outs: Vec<_> = nodes.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
    assert!(outs.iter().all(|o| !o.status.success()), "both torchruns fail");
    let id = the_one_job(&s);
    let events = read_events(&s, &id);
    assert_eq!(events.last().map(|(k, _)| k.as_str()), Some("done"), "{events:?}");
    let t = stored_trace(&s, &id, &dir);
    assert_eq!(shared::ranks::ranks(&t), [0, 1]);
    assert_eq!(t.meta.missing_ranks, [2, 3]);
    let named = t.meta.warnings.iter().filter(|w| w.contains("is missing") && w.contains("node 1 failed: nothing was traced")).count();
    assert_eq!(named, 2, "{:?}", t.meta.warnings);
}
