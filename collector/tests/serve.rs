//! `collector serve` over real HTTP: every endpoint and error code, live events, restarts,
//! concurrency, limits and security. Models run on the CPU, so this runs in CI.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches fail loudly by design

mod server;

use serde_json::{json, Value};
use server::{scratch, Server};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data").join(name)
}

fn facts(sample: &str, key: &str) -> u64 {
    let f: Value = serde_json::from_slice(&std::fs::read(data("facts.json")).unwrap()).unwrap();
    f["samples"][sample][key].as_u64().unwrap()
}

fn detail(v: &Value) -> &str {
    v["detail"].as_str().unwrap_or_else(|| panic!("no detail in {v}"))
}

/// A small CPU training run: MLP, batch 16, 2 iterations.
fn mlp() -> Value {
    json!({"model_name": "mlp", "input_shape": [16, 784], "batch_size": 16, "iterations": 2})
}

#[test]
fn api_contract_on_cpu() {
    let dir = scratch("serve-contract");
    let s = Server::start(&dir, &[]);
    contract_health(&s);
    let id = contract_trace(&s);
    contract_exports(&s, &id);
    contract_errors(&s);
    contract_downloads_stay_in_store(&s, &id);
    contract_uploads(&s, &dir);
    contract_delete(&s, &dir, &id);
    contract_docs(&s);
}

/// Health: the device, the CUDA facts and tracing.
fn contract_health(s: &Server) {
    let (code, h) = s.get_json("/api/health");
    assert_eq!(code, 200);
    assert_eq!(h["status"], "healthy");
    assert_eq!(h["device"], "cpu");
    assert_eq!(h["cuda_available"], json!(h["cuda_device_count"].as_u64() > Some(0)));
    assert_eq!(h["tracing_available"], true);
    assert!(h["version"].is_string());
}

/// Trace: every field of the seed's answer, and numbers equal to the stored trace's; its id.
fn contract_trace(s: &Server) -> String {
    let (code, r) = s.post_json("/api/trace/memory", &mlp());
    assert_eq!(code, 200, "{r}");
    let id = r["trace_id"].as_str().unwrap().to_owned();
    assert!(id.strip_prefix("trace_").is_some_and(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit())), "{id}");
    assert_eq!(r["model_name"], "mlp");
    for k in ["total_events", "total_layers", "peak_allocated_mb", "peak_reserved_mb", "avg_fragmentation", "tracing_time_ms"] {
        assert!(r[k].is_number(), "{k} missing in {r}");
    }
    assert!(r["tracing_time_ms"].as_f64().unwrap() > 0.0);
    let layers = r["layer_stats"].as_object().unwrap();
    assert!(layers.contains_key("fc1"), "{layers:?}");
    for (name, l) in layers {
        assert_eq!(l["layer_name"], name.as_str());
        for k in ["peak_allocated", "peak_reserved", "total_allocations", "total_deallocations", "avg_fragmentation", "duration_ms"] {
            assert!(l[k].is_number(), "{k} missing in {l}");
        }
    }
    let (code, bytes) = s.get(&format!("/api/trace/{id}"));
    assert_eq!(code, 200);
    let trace = shared::import::import(bytes.as_bytes(), &Default::default()).expect("the stored trace imports");
    let summary = shared::analysis::summary(&trace);
    assert_eq!(r["total_events"].as_u64(), Some(summary.total_events as u64));
    assert_eq!(r["total_layers"].as_u64(), Some(summary.total_layers as u64));
    assert_eq!(r["peak_allocated_bytes"].as_u64(), Some(summary.peak_allocated_bytes));
    assert!((r["peak_allocated_mb"].as_f64().unwrap() - summary.peak_allocated_bytes as f64 / 1048576.0).abs() < 1e-9);
    assert!(summary.peak_allocated_bytes > 16 * 784 * 4, "the batch alone is bigger than the peak");
    let native_layers = shared::analysis::layer_stats(&trace);
    assert_eq!(native_layers.keys().collect::<Vec<_>>(), layers.keys().collect::<Vec<_>>());
    assert_eq!(layers["fc1"]["peak_allocated"].as_u64(), Some(native_layers["fc1"].peak_allocated));

    let (code, list) = s.get_json("/api/trace/list");
    assert_eq!(code, 200);
    assert_eq!(list["active_traces"], json!([id]));
    assert_eq!(list["count"], 1);
    id
}

/// Exports, downloaded byte for byte as announced; unknown formats and traces refused.
fn contract_exports(s: &Server, id: &str) {
    for (format, check) in
        [("speedscope", "speedscope"), ("timeline", "\"events\""), ("chrome", "traceEvents"), ("csv", "layer_name,peak_allocated")]
    {
        let (code, e) = s.post_json("/api/trace/export", &json!({"trace_id": id, "format": format}));
        assert_eq!(code, 200, "{format}: {e}");
        assert_eq!(e["trace_id"], id);
        assert_eq!(e["format"], format);
        let url = e["download_url"].as_str().unwrap();
        assert!(url.starts_with("/api/trace/download/"), "{url}");
        let (code, body) = s.get(url);
        assert_eq!(code, 200);
        assert_eq!(body.len() as u64, e["file_size_bytes"].as_u64().unwrap(), "{format}");
        assert!(body.contains(check), "{format} export lacks {check}");
    }
    // DFTracer is gzip: announced with its suffix and size.
    let (code, e) = s.post_json("/api/trace/export", &json!({"trace_id": id, "format": "dftracer"}));
    assert_eq!(code, 200, "dftracer: {e}");
    assert!(e["download_url"].as_str().unwrap().ends_with(".pfw.gz"), "{e}");
    assert!(e["file_size_bytes"].as_u64().unwrap() > 100, "{e}");
    let (code, e) = s.post_json("/api/trace/export", &json!({"trace_id": id, "format": "pdf"}));
    assert_eq!(code, 422);
    assert!(detail(&e).contains("format") && detail(&e).contains("speedscope"), "{e}");
    let (code, e) = s.post_json("/api/trace/export", &json!({"trace_id": "trace_1", "format": "speedscope"}));
    assert_eq!(code, 404);
    assert_eq!(detail(&e), "Trace trace_1 not found");
}

/// 422 names the field and why; the guide's shapes; CUDA where there is none; bodies that are
/// not JSON, too big or untyped; unknown routes and methods.
fn contract_errors(s: &Server) {
    // 422 names the field and why.
    for (body, field) in [
        (json!({"input_shape": [16, 784]}), "model_name"),
        (json!({"model_name": "mlp", "input_shape": [784]}), "input_shape"),
        (json!({"model_name": "mlp", "batch_size": "x"}), "batch_size"),
        (json!({"model_name": "mlp", "batch_size": 0}), "batch_size"),
        (json!({"model_name": "mlp", "max_events": 0}), "max_events"),
        (json!({"model_name": "mlp", "max_events": 50_000_000}), "max_events"),
        (json!({"model_name": "resnet18", "input_shape": [1, 3, 100000, 100000], "batch_size": 64}), "input_shape"),
        (json!({"model_name": "resnet18", "input_shape": [1, 3, -1, 8]}), "input_shape"),
        (json!({"model_name": "nope"}), "model_name"),
        (json!({"model_name": "mlp", "iterations": 0}), "iterations"),
        (json!({"model_name": "mlp", "mode": "fly"}), "mode"),
        (json!({"model_name": "mlp", "device": "tpu"}), "device"),
    ] {
        let (code, e) = s.post_json("/api/trace/memory", &body);
        assert_eq!(code, 422, "{body}: {e}");
        assert!(detail(&e).contains(field), "{body}: {e}");
    }
    let (code, e) = s.post_json("/api/trace/memory", &json!({"model_name": "resnet18", "input_shape": [2, 3, 8, 8]}));
    assert_eq!(code, 422, "a shape the model refuses: {e}");
    assert!(detail(&e).contains("at least 32"), "{e}");
    // The guide's way: the full shape, batch first, `batch_size` replacing the first dimension
    // (a mismatch is no error).
    let (code, r) =
        s.post_json("/api/trace/memory", &json!({"model_name": "mlp", "input_shape": [4, 784], "batch_size": 2, "iterations": 1}));
    assert_eq!(code, 200, "{r}");
    let sid = r["trace_id"].as_str().unwrap();
    let stored = s.get_json(&format!("/api/trace/{sid}")).1;
    assert_eq!(stored["trace"]["meta"]["input_shape"], json!([2, 784]));
    assert_eq!(s.delete(&format!("/api/trace/{sid}")).0, 200);
    // CUDA asked for where there is none.
    if s.get_json("/api/health").1["cuda_device_count"] == 0 {
        let (code, e) = s.post_json("/api/trace/memory", &json!({"model_name": "mlp", "device": "cuda"}));
        assert_eq!(code, 503, "{e}");
        assert!(detail(&e).contains("CUDA"), "{e}");
    }
    let (code, e) = s.post_json("/api/trace/memory", &json!({"model_name": "mlp", "device": "cuda:200"}));
    assert_eq!(code, 503, "{e}");
    // Not JSON, too big, no content type.
    let r = s.agent.post(s.url("/api/trace/memory")).header("Content-Type", "application/json").send("{not json").unwrap();
    let (code, t) = server::text(r);
    assert_eq!(code, 422, "{t}");
    let big = json!({"model_name": "mlp", "pad": "x".repeat(100_000)});
    let (code, e) = s.post_json("/api/trace/memory", &big);
    assert_eq!(code, 413, "{e}");
    let r = s.agent.post(s.url("/api/trace/memory")).send("{}").unwrap();
    assert_eq!(r.status().as_u16(), 415);
    let (code, body) = s.get("/api/nothing-here");
    assert_eq!((code, body.as_str()), (404, r#"{"detail":"Not Found"}"#));
    let r = s.agent.put(s.url("/api/trace/list")).send("").unwrap();
    assert_eq!(r.status().as_u16(), 405);
}

/// Downloads cannot leave the store.
fn contract_downloads_stay_in_store(s: &Server, id: &str) {
    let meta_name = format!("{id}.meta.json");
    for path in [
        "/api/trace/download/..%2F..%2F..%2Fetc%2Fpasswd".to_owned(),
        "/api/trace/download/%2Fetc%2Fpasswd".to_owned(),
        format!("/api/trace/download/..%2Ftraces%2F{meta_name}"),
        format!("/api/trace/download/{meta_name}"),
        format!("/api/trace/download/{id}.mtrace.json"),
        "/api/trace/download/..".to_owned(),
        "/api/trace/download/.%2E%2F.%2E%2Ftraces".to_owned(),
        "/api/trace/download/%00".to_owned(),
        "/api/trace/download/../../etc/passwd".to_owned(),
    ] {
        let (code, body) = s.get(&path);
        assert_eq!(code, 404, "{path}: {body}");
        assert!(!body.contains("root:") && !body.contains("layer_stats"), "{path} leaked: {body}");
    }
}

/// Uploads: a snapshot as the raw body, a profiler trace as a form, a bad file; a stored
/// trace's event stream says done at once.
fn contract_uploads(s: &Server, dir: &Path) {
    let snap = std::fs::read(data("resnet18_sgd_2steps.pickle")).unwrap();
    let (code, u) = s.post_bytes("/api/trace/upload?filename=resnet18_sgd_2steps.pickle", &snap);
    assert_eq!(code, 200, "{u}");
    assert_eq!(u["peak_allocated_bytes"].as_u64(), Some(facts("resnet18_sgd_2steps.pickle", "max_allocated")));
    assert_eq!(u["peak_reserved_bytes"].as_u64(), Some(facts("resnet18_sgd_2steps.pickle", "max_reserved")));
    let uid = u["trace_id"].as_str().unwrap().to_owned();
    let r = s.agent.get(s.url(&format!("/api/trace/{uid}"))).call().unwrap();
    let mut r = r;
    let back = r.body_mut().with_config().limit(1 << 30).read_to_vec().unwrap();
    assert!(back == snap, "the stored upload differs from what was sent");
    let profiler = std::fs::read(data("convnet_profiler_trace.json")).unwrap();
    let boundary = "mt-boundary-7";
    let mut form = format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"convnet_profiler_trace.json\"\r\nContent-Type: application/json\r\n\r\n").into_bytes();
    form.extend_from_slice(&profiler);
    form.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let r = s
        .agent
        .post(s.url("/api/trace/upload"))
        .header("Content-Type", format!("multipart/form-data; boundary={boundary}"))
        .send(&form[..])
        .unwrap();
    let (code, t) = server::text(r);
    assert_eq!(code, 200, "{t}");
    let p: Value = serde_json::from_str(&t).unwrap();
    assert_eq!(p["source_format"], "chrome_trace", "{p}");
    let before = s.get_json("/api/trace/list").1["count"].as_u64();
    let (code, e) = s.post_bytes("/api/trace/upload?filename=notes.txt", b"these are not the bytes you are looking for");
    assert_eq!(code, 422);
    assert!(detail(&e).contains("notes.txt") && detail(&e).contains("snapshot"), "{e}");
    let (code, e) = s.post_bytes("/api/trace/upload", b"");
    assert_eq!(code, 422, "{e}");
    assert_eq!(s.get_json("/api/trace/list").1["count"].as_u64(), before, "a bad upload was stored");
    assert_eq!(std::fs::read_dir(dir.join("tmp")).unwrap().count(), 0, "a bad upload left files behind");

    // A stored trace's event stream says done at once.
    let (code, ev) = s.get(&format!("/api/trace/{uid}/events"));
    assert_eq!(code, 200);
    assert!(ev.contains("event: done") && ev.contains(&uid), "{ev}");
    assert_eq!(s.get("/api/trace/trace_42/events").0, 404);
    assert_eq!(s.get("/api/trace/trace_42").0, 404);
}

/// Delete removes the files; a second delete and the trace's events answer 404.
fn contract_delete(s: &Server, dir: &Path, id: &str) {
    let (code, d) = s.delete(&format!("/api/trace/{id}"));
    assert_eq!(code, 200);
    assert_eq!(d["message"], format!("Trace {id} deleted successfully"));
    assert_eq!(d["remaining_traces"], 2);
    let left: Vec<String> = std::fs::read_dir(dir.join("traces"))
        .unwrap()
        .chain(std::fs::read_dir(dir.join("exports")).unwrap())
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(!left.iter().any(|f| f.contains(id)), "files of a deleted trace remain: {left:?}");
    let (code, d) = s.delete(&format!("/api/trace/{id}"));
    assert_eq!(code, 404);
    assert_eq!(detail(&d), format!("Trace {id} not found"));
    assert_eq!(s.get(&format!("/api/trace/{id}/events")).0, 404, "a deleted trace's job still answers events");
}

/// OpenAPI, the docs (served locally) and the viewer.
fn contract_docs(s: &Server) {
    let (code, doc) = s.get_json("/api/openapi.json");
    assert_eq!(code, 200);
    let paths: BTreeSet<String> = doc["paths"].as_object().unwrap().keys().cloned().collect();
    let expected: BTreeSet<String> = [
        "/api/health",
        "/api/jobs",
        "/api/trace/memory",
        "/api/trace/export",
        "/api/trace/list",
        "/api/trace/download/{file}",
        "/api/trace/upload",
        "/api/trace/live",
        "/api/trace/live/{trace_id}",
        "/api/trace/{trace_id}",
        "/api/trace/{trace_id}/events",
        "/api/trace/{trace_id}/leaks",
        "/api/trace/{trace_id}/advice",
        "/api/trace/{trace_id}/overview",
        "/api/trace/{trace_id}/explore",
        "/api/trace/diff",
    ]
    .map(String::from)
    .into();
    assert_eq!(paths, expected);
    assert!(doc["components"]["schemas"]["TraceRequest"]["properties"]["max_events"].is_object());
    for page in ["/api/docs", "/api/redoc"] {
        let (code, html) = s.get(page);
        assert_eq!(code, 200);
        assert!(html.contains("/api/openapi.json") && !html.contains("https://"), "{page} must load nothing from the network");
    }
    for asset in ["swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js"] {
        let (code, body) = s.get(&format!("/api/docs/assets/{asset}"));
        assert_eq!(code, 200);
        assert!(body.len() > 100_000, "{asset}");
    }
    let (code, html) = s.get("/");
    assert_eq!(code, 200);
    assert!(html.contains("memory-tracer-server"), "the viewer is not told it is served");
    let wasm = html.split('"').find(|p| p.ends_with(".wasm") || p.ends_with(".js")).map(|p| p.trim_start_matches("./").to_owned());
    if let Some(asset) = wasm {
        assert_eq!(s.get(&format!("/{asset}")).0, 200, "{asset}");
    }
}

/// Reads a server-sent event stream until its `done` or `failed` event.
fn read_events(s: &Server, id: &str) -> Vec<(String, Value)> {
    let (code, events) = s.events(id);
    assert_eq!(code, 200);
    events
}

#[test]
fn live_events_follow_a_running_trace() {
    let dir = scratch("serve-live");
    let s = Server::start(&dir, &[]);
    let (code, a) = s.post_json(
        "/api/trace/memory?wait=false",
        &json!({"model_name": "resnet18", "input_shape": [2, 3, 64, 64], "batch_size": 2, "iterations": 3}),
    );
    assert_eq!(code, 202, "{a}");
    let id = a["trace_id"].as_str().unwrap().to_owned();
    assert_eq!(a["events_url"], format!("/api/trace/{id}/events"));
    let events = read_events(&s, &id);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"status"));
    assert!(names.contains(&"started"), "{names:?}");
    let done_at = names.iter().position(|n| *n == "done").unwrap_or_else(|| panic!("no done event: {events:?}"));
    assert_eq!(done_at, names.len() - 1);
    let iterations: Vec<u64> = events.iter().filter(|(n, _)| n == "iteration").map(|(_, v)| v["done"].as_u64().unwrap()).collect();
    assert_eq!(iterations, vec![1, 2, 3]);
    // Memory arrives while the model runs, before the last iteration ends.
    let first_memory = names.iter().position(|n| *n == "memory").expect("no memory events");
    let last_iteration = names.iter().rposition(|n| *n == "iteration").unwrap();
    assert!(first_memory < last_iteration);
    assert!(names.iter().filter(|n| **n == "memory").count() >= 6, "{names:?}");
    let points: Vec<[u64; 3]> = events
        .iter()
        .filter(|(n, _)| n == "memory")
        .flat_map(|(_, v)| serde_json::from_value::<Vec<[u64; 3]>>(v["points"].clone()).unwrap())
        .collect();
    assert!(points.windows(2).all(|w| w[0][0] <= w[1][0]), "live points go back in time");
    let done = &events[done_at].1["trace"];
    assert_eq!(done["trace_id"], id.as_str());
    // Decimation keeps each bucket's highest total: the live peak is the trace's peak.
    let live_peak = points.iter().map(|p| p[1]).max().unwrap();
    assert_eq!(Some(live_peak), done["peak_allocated_bytes"].as_u64());
    // A late follower replays the run.
    let again = read_events(&s, &id);
    assert_eq!(again.last().map(|(n, _)| n.as_str()), Some("done"));
    let (_, jobs) = s.get_json("/api/jobs");
    let row = jobs["jobs"].as_array().unwrap().iter().find(|j| j["trace_id"] == id.as_str()).cloned().unwrap();
    assert_eq!(row["state"], "done");
    assert_eq!(row["iterations_done"], 3);
}

#[test]
fn concurrent_requests_get_unique_ids_and_a_bounded_queue() {
    let dir = scratch("serve-concurrent");
    let s = Server::start(&dir, &["--jobs-per-device", "2"]);
    // Traces at once: all answered, ids unique, all stored.
    let ids: Vec<String> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..4).map(|_| sc.spawn(|| s.post_json("/api/trace/memory", &mlp()))).collect();
        handles
            .into_iter()
            .map(|h| {
                let (code, r) = h.join().unwrap();
                assert_eq!(code, 200, "{r}");
                r["trace_id"].as_str().unwrap().to_owned()
            })
            .collect()
    });
    // Uploads at once (cheap, so they really collide in time).
    let mlp_snapshot = std::fs::read(data("mlp_adam_3steps.pickle")).unwrap();
    let uploaded: Vec<String> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..16).map(|_| sc.spawn(|| s.post_bytes("/api/trace/upload", &mlp_snapshot))).collect();
        handles.into_iter().map(|h| h.join().unwrap().1["trace_id"].as_str().unwrap().to_owned()).collect()
    });
    let all: BTreeSet<&String> = ids.iter().chain(&uploaded).collect();
    assert_eq!(all.len(), 20, "ids collided: {ids:?} {uploaded:?}");
    let (_, list) = s.get_json("/api/trace/list");
    assert_eq!(list["count"], 20);
    drop(s);

    // A full queue answers 429 with Retry-After; every accepted job still finishes.
    let s = Server::start(&scratch("serve-queue"), &["--max-queue", "1"]);
    let mut accepted = Vec::new();
    let mut refused = 0;
    for _ in 0..5 {
        let r = s.agent.post(s.url("/api/trace/memory?wait=false")).send_json(mlp()).unwrap();
        match r.status().as_u16() {
            202 => {
                let (_, t) = server::text(r);
                accepted.push(serde_json::from_str::<Value>(&t).unwrap()["trace_id"].as_str().unwrap().to_owned());
            }
            429 => {
                let retry: u64 = r
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse().ok())
                    .expect("429 without Retry-After");
                assert!(retry >= 1);
                let (_, t) = server::text(r);
                assert!(t.contains("queue is full"), "{t}");
                refused += 1;
            }
            other => panic!("unexpected {other}"),
        }
    }
    assert!(refused >= 2, "5 jobs fit in a queue of 1 with 1 slot");
    for id in &accepted {
        let events = read_events(&s, id);
        assert_eq!(events.last().unwrap().0, "done", "{events:?}");
    }
    assert_eq!(s.get_json("/api/health").1["stored_traces"].as_u64(), Some(accepted.len() as u64));
}

#[test]
fn a_failed_job_leaves_the_server_healthy() {
    let dir = scratch("serve-failure");
    let s = Server::start(&dir, &["--job-timeout-s", "8"]);
    // Killed past the time limit: a clear error, nothing stored, no process left.
    let (code, e) = s.post_json("/api/trace/memory", &json!({"model_name": "resnet50", "batch_size": 8, "iterations": 100}));
    assert_eq!(code, 422, "{e}");
    assert!(detail(&e).contains("--job-timeout-s"), "{e}");
    assert_eq!(s.get_json("/api/trace/list").1["count"], 0);
    assert_eq!(std::fs::read_dir(dir.join("tmp")).unwrap().count(), 0);
    let children = std::fs::read_to_string(format!("/proc/{}/task/{}/children", s.pid(), s.pid())).unwrap_or_default();
    assert!(children.trim().is_empty(), "trace processes left running: {children}");
    let (code, h) = s.get_json("/api/health");
    assert_eq!((code, h["jobs_running"].as_u64()), (200, Some(0)));
    let (_, jobs) = s.get_json("/api/jobs");
    assert_eq!(jobs["jobs"][0]["state"], "failed");
    // The next job runs.
    let (code, r) = s.post_json("/api/trace/memory", &json!({"model_name": "mlp", "batch_size": 4, "iterations": 1}));
    assert_eq!(code, 200, "{r}");
}

#[test]
fn the_store_survives_restarts_and_evicts_the_oldest() {
    let dir = scratch("serve-store");
    let snap = std::fs::read(data("mlp_adam_3steps.pickle")).unwrap();
    let s = Server::start(&dir, &["--max-traces", "3"]);
    let ids: Vec<String> =
        (0..4).map(|_| s.post_bytes("/api/trace/upload?filename=mlp.pickle", &snap).1["trace_id"].as_str().unwrap().to_owned()).collect();
    let (_, list) = s.get_json("/api/trace/list");
    assert_eq!(list["active_traces"], json!(ids[1..]), "the oldest is evicted first");
    assert!(!dir.join("traces").join(format!("{}.pickle", ids[0])).exists());
    let (code, e) = s.post_json("/api/trace/export", &json!({"trace_id": ids[1], "format": "timeline"}));
    assert_eq!(code, 200);
    let url = e["download_url"].as_str().unwrap().to_owned();
    let (_, exported) = s.get(&url);
    s.kill();
    // What a crash mid-write leaves: a temporary file and a trace file without its sidecar.
    std::fs::write(dir.join("tmp/7-half.upload"), b"partial").unwrap();
    std::fs::write(dir.join("traces/trace_99.pickle"), b"orphan").unwrap();

    let s = Server::start(&dir, &["--max-traces", "3"]);
    let (_, list) = s.get_json("/api/trace/list");
    assert_eq!(list["active_traces"], json!(ids[1..]), "traces after a restart");
    assert_eq!(list["traces"][0]["peak_allocated_bytes"].as_u64(), Some(facts("mlp_adam_3steps.pickle", "max_allocated")));
    assert_eq!(s.get(&url), (200, exported), "exports after a restart");
    assert_eq!(std::fs::read_dir(dir.join("tmp")).unwrap().count(), 0);
    assert!(!dir.join("traces/trace_99.pickle").exists());
    let (_, u) = s.post_bytes("/api/trace/upload", &snap);
    let new_id = u["trace_id"].as_str().unwrap();
    assert!(store_ms(new_id) > store_ms(&ids[3]), "ids go on increasing after a restart");
    // Export files count towards the bytes limit; a trace over the whole limit is refused.
    drop(s);
    let small = Server::start(&scratch("serve-store-bytes"), &["--max-store-mb", "1"]);
    let big = std::fs::read(data("resnet18_sgd_2steps.pickle")).unwrap();
    let a = small.post_bytes("/api/trace/upload", &big).1["trace_id"].as_str().unwrap().to_owned();
    let b = small.post_bytes("/api/trace/upload", &big).1["trace_id"].as_str().unwrap().to_owned();
    let c = small.post_bytes("/api/trace/upload", &big).1["trace_id"].as_str().unwrap().to_owned();
    assert_eq!(small.get_json("/api/trace/list").1["active_traces"], json!([b, c]), "466 KB files in 1 MiB: {a} is evicted");
    let (code, e) = small.post_bytes("/api/trace/upload", &vec![b'x'; 1_100_000]);
    assert!(code == 413 || code == 422, "{code} {e}");
}

fn store_ms(id: &str) -> u64 {
    id.trim_start_matches("trace_").parse().unwrap()
}

#[test]
fn tokens_limits_and_cors() {
    // A non-loopback bind without a token does not start.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_collector"))
        .args(["serve", "--host", "0.0.0.0", "--port", "0", "--data-dir"])
        .arg(scratch("serve-open"))
        .env_remove("MEMORY_TRACER_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--token"), "{}", String::from_utf8_lossy(&out.stderr));

    let dir = scratch("serve-token");
    let s = Server::start(&dir, &["--token", "s3cret-token", "--max-upload-mb", "1"]);
    let anonymous = server::agent();
    for path in
        ["/api/health", "/api/trace/list", "/api/jobs", "/api/trace/trace_1", "/api/trace/trace_1/events", "/api/trace/download/x.csv"]
    {
        let r = anonymous.get(s.url(path)).call().unwrap();
        assert_eq!(r.status().as_u16(), 401, "{path}");
        assert_eq!(r.headers().get("www-authenticate").and_then(|v| v.to_str().ok()), Some("Bearer"));
        let (_, t) = server::text(r);
        assert!(t.contains("\"detail\""), "{t}");
    }
    for (method, path) in
        [("POST", "/api/trace/memory"), ("POST", "/api/trace/export"), ("POST", "/api/trace/upload"), ("DELETE", "/api/trace/trace_1")]
    {
        let r = match method {
            "POST" => anonymous.post(s.url(path)).send_json(mlp()).unwrap(),
            _ => anonymous.delete(s.url(path)).call().unwrap(),
        };
        assert_eq!(r.status().as_u16(), 401, "{method} {path}");
    }
    let r = anonymous.get(s.url("/api/health")).header("Authorization", "Bearer wrong").call().unwrap();
    assert_eq!(r.status().as_u16(), 401);
    assert_eq!(s.get_json("/api/health").0, 200, "the right bearer token");
    let r = anonymous.get(s.url("/api/health?access_token=s3cret-token")).call().unwrap();
    assert_eq!(r.status().as_u16(), 200, "the token as a query parameter (EventSource)");
    for public in ["/", "/api/openapi.json", "/api/docs", "/api/redoc"] {
        assert_eq!(anonymous.get(s.url(public)).call().unwrap().status().as_u16(), 200, "{public} holds no data");
    }
    // Upload limit: 413, nothing kept.
    let (code, e) = s.post_bytes("/api/trace/upload", &vec![0u8; (1 << 20) + 10]);
    assert_eq!(code, 413, "{e}");
    assert_eq!(std::fs::read_dir(dir.join("tmp")).unwrap().count(), 0);
    // CORS is off unless asked for.
    let r = s.agent.get(s.url("/api/openapi.json")).header("Origin", "http://evil.example").call().unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());
    drop(s);
    let s = Server::start(&scratch("serve-cors"), &["--cors-origin", "http://viewer.example"]);
    let r = s.agent.get(s.url("/api/health")).header("Origin", "http://viewer.example").call().unwrap();
    assert_eq!(r.headers().get("access-control-allow-origin").and_then(|v| v.to_str().ok()), Some("http://viewer.example"));
    let r = s.agent.get(s.url("/api/health")).header("Origin", "http://evil.example").call().unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());
}

/// The seed's Python client flow, with `requests` from the test venv.
#[test]
fn python_requests_client_flow() {
    let s = Server::start(&scratch("serve-python"), &["--token", "py-token"]);
    let script = r#"
import sys, requests
base, token = sys.argv[1], sys.argv[2]
h = {"Authorization": f"Bearer {token}"}
r = requests.post(f"{base}/api/trace/memory", json={"model_name": "mlp", "input_shape": [8, 784], "batch_size": 8, "max_events": 10000, "enable_fragmentation": True, "iterations": 1}, headers=h)
r.raise_for_status()
t = r.json()
tid = t["trace_id"]
assert t["peak_allocated_mb"] > 0 and t["total_events"] > 0 and "fc1" in t["layer_stats"], t
assert tid in requests.get(f"{base}/api/trace/list", headers=h).json()["active_traces"]
e = requests.post(f"{base}/api/trace/export", json={"trace_id": tid, "format": "speedscope"}, headers=h).json()
d = requests.get(base + e["download_url"], headers=h)
d.raise_for_status()
assert len(d.content) == e["file_size_bytes"] and "speedscope" in d.json()["$schema"]
x = requests.delete(f"{base}/api/trace/{tid}", headers=h).json()
assert x["message"] == f"Trace {tid} deleted successfully", x
r = requests.delete(f"{base}/api/trace/{tid}", headers=h)
assert r.status_code == 404 and r.json()["detail"] == f"Trace {tid} not found"
assert requests.get(f"{base}/api/trace/list").status_code == 401
print("python flow ok", tid)
"#;
    let python = std::env::var("MEMORY_TRACER_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = std::process::Command::new(&python)
        .args(["-c", script, &s.base, "py-token"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
    assert!(
        out.status.success(),
        "python flow failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("python flow ok"));
}

/// TorchScript models from `--models-dir`, by name: a real one traces; a broken file is a
/// clear 422 and the server goes on; names cannot reach outside the folder.
#[test]
fn torchscript_models_from_the_models_dir() {
    let dir = scratch("serve-torchscript");
    let models = dir.join("models");
    std::fs::create_dir_all(&models).unwrap();
    let script = "import sys, torch, torch.nn as nn\n\
class Net(nn.Module):\n    def __init__(s):\n        super().__init__()\n        s.features = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())\n        s.head = nn.Linear(8, 4)\n    def forward(s, x):\n        return s.head(s.features(x).mean((2, 3)))\n\
torch.jit.script(Net()).save(sys.argv[1])\n";
    let python = std::env::var("MEMORY_TRACER_PYTHON").unwrap_or_else(|_| "python3".into());
    // A file, not `-c`: torch.jit.script reads the class's source.
    std::fs::write(dir.join("make.py"), script).unwrap();
    let status = std::process::Command::new(&python).arg(dir.join("make.py")).arg(models.join("net.pt")).status().unwrap();
    assert!(status.success(), "{python} could not script the model");
    std::fs::write(models.join("broken.pt"), b"PK\x03\x04 not a TorchScript archive").unwrap();
    let s = Server::start(&dir.join("data"), &["--models-dir", models.to_str().unwrap()]);
    let (_, h) = s.get_json("/api/health");
    let names: Vec<&str> = h["models"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(names.contains(&"resnet18") && names.contains(&"net") && names.contains(&"broken"), "{names:?}");

    let (code, r) =
        s.post_json("/api/trace/memory", &json!({"model_name": "net", "input_shape": [2, 3, 16, 16], "batch_size": 2, "iterations": 2}));
    assert_eq!(code, 200, "{r}");
    let layers = r["layer_stats"].as_object().unwrap();
    assert!(layers.contains_key("features.0") && layers.contains_key("head"), "{:?}", layers.keys());

    let (code, e) = s.post_json("/api/trace/memory", &json!({"model_name": "broken", "input_shape": [2, 3, 16, 16]}));
    assert_eq!(code, 422, "{e}");
    assert!(detail(&e).contains("TorchScript"), "{e}");
    let (code, e) = s.post_json("/api/trace/memory", &json!({"model_name": "net"}));
    assert_eq!(code, 422);
    assert!(detail(&e).contains("input_shape"), "{e}");
    for name in ["../models/net", "/etc/passwd", ".hidden", "net.pt"] {
        let (code, e) = s.post_json("/api/trace/memory", &json!({"model_name": name, "input_shape": [2, 3, 16, 16]}));
        assert_eq!(code, 422, "{name}: {e}");
        assert!(detail(&e).contains("unknown model"), "{name}: {e}");
    }
    assert_eq!(s.get_json("/api/health").1["status"], "healthy");
    assert_eq!(s.get_json("/api/trace/list").1["count"], 1);
}

/// A trace recorded elsewhere (`collector trace --serve`): announced, followed while its
/// recorder posts progress, ended by the upload of its trace or by an error line.
#[test]
fn live_traces_from_elsewhere_are_followed_and_completed_by_their_upload() {
    let s = Server::start(&scratch("live_external"), &[]);
    let (code, e) = s.post_json("/api/trace/live", &json!({"model_name": ""}));
    assert_eq!(code, 422);
    assert!(detail(&e).contains("model_name"));
    let (code, e) = s.post_json("/api/trace/live/trace_1", &json!({"kind": "memory", "points": [[1, 2, 3]]}));
    assert_eq!((code, detail(&e)), (404, "Trace trace_1 not found"));

    let (code, a) = s.post_json("/api/trace/live", &json!({"model_name": "train.py", "device": "cuda:0"}));
    assert_eq!(code, 202, "{a}");
    let id = a["trace_id"].as_str().unwrap().to_owned();
    let (code, _) =
        s.post_json(&format!("/api/trace/live/{id}"), &json!({"kind": "memory", "points": [[1000, 512, 2048], [2000, 1024, 2048]]}));
    assert_eq!(code, 200);
    let too_many: Vec<[u64; 3]> = vec![[1, 1, 1]; 1025];
    let (code, e) = s.post_json(&format!("/api/trace/live/{id}"), &json!({"kind": "memory", "points": too_many}));
    assert_eq!(code, 422);
    assert!(detail(&e).contains("points"));
    // Refused before the body is read, so a body small enough to be sent whole: a large one
    // may meet a closed connection instead of the answer.
    let (code, e) = s.post_bytes("/api/trace/upload?filename=x.pickle&trace_id=trace_404", b"not read");
    assert_eq!((code, detail(&e)), (404, "Trace trace_404 not found"));
    let (code, stored) = s.post_bytes(
        &format!("/api/trace/upload?filename=run.pickle&trace_id={id}"),
        &std::fs::read(data("mlp_adam_3steps.pickle")).unwrap(),
    );
    assert_eq!(code, 200, "{stored}");
    assert_eq!(stored["trace_id"], id.as_str());
    let events = read_events(&s, &id);
    let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds, ["status", "memory", "done"]);
    assert_eq!(events[1].1["points"][1], json!([2000, 1024, 2048]));
    let (code, _) = s.post_json(&format!("/api/trace/live/{id}"), &json!({"kind": "memory", "points": []}));
    assert_eq!(code, 404, "an ended live trace takes no more lines");

    let (_, a) = s.post_json("/api/trace/live", &json!({"model_name": "crash.py"}));
    let id = a["trace_id"].as_str().unwrap().to_owned();
    let (code, a) =
        s.post_json(&format!("/api/trace/live/{id}"), &json!({"kind": "error", "class": "invalid", "detail": "nothing was traced"}));
    assert_eq!((code, a["status"].as_str()), (200, Some("failed")));
    let events = read_events(&s, &id);
    assert_eq!(events.last().map(|(k, v)| (k.as_str(), v["detail"].clone())), Some(("failed", json!("nothing was traced"))));
}

/// SIGTERM, as systemd, Docker and Kubernetes stop a service: an answer in flight finishes,
/// a trace still running after the grace period is killed and reaped, `tmp/` is left empty,
/// and the server exits 0.
#[test]
fn sigterm_stops_the_server_gracefully() {
    use std::time::{Duration, Instant};
    let dir = scratch("sigterm_answer");
    let s = Server::start(&dir, &["--shutdown-grace-s", "60"]);
    let (base, agent) = (s.url("/api/trace/memory"), s.agent.clone());
    let request = std::thread::spawn(move || {
        let r = agent.post(&base).send_json(json!({"model_name": "mlp", "input_shape": [16, 784], "iterations": 1})).unwrap();
        server::text(r)
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while s.children().is_empty() {
        assert!(Instant::now() < deadline, "no trace process started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = s.terminate(Duration::from_secs(60));
    let (code, body) = request.join().unwrap();
    assert_eq!(code, 200, "the answer in flight finished: {body}");
    assert_eq!(status.code(), Some(0));

    let dir = scratch("sigterm_kill");
    let s = Server::start(&dir, &["--shutdown-grace-s", "1"]);
    let (code, a) =
        s.post_json("/api/trace/memory?wait=false", &json!({"model_name": "resnet18", "input_shape": [8, 3, 224, 224], "iterations": 100}));
    assert_eq!(code, 202, "{a}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let children: Vec<(u32, u64)> = loop {
        let c: Vec<(u32, u64)> = s.children().into_iter().filter_map(|pid| Some((pid, start_time(pid)?))).collect();
        if !c.is_empty() {
            break c;
        }
        assert!(Instant::now() < deadline, "no trace process started");
        std::thread::sleep(Duration::from_millis(20));
    };
    let tmp = s.data_dir.join("tmp");
    let status = s.terminate(Duration::from_secs(30));
    assert_eq!(status.code(), Some(0));
    for (pid, started) in children {
        // The same pid with the same start time is the same process (pids get reused).
        assert_ne!(start_time(pid), Some(started), "trace process {pid} outlived the server");
    }
    assert_eq!(std::fs::read_dir(&tmp).unwrap().count(), 0, "temporary files left in {}", tmp.display());
}

/// `--open` hands the viewer's URL to the user's browser (`$BROWSER`, else the desktop's
/// opener), which the server starts as its child. Stopping the server kills and reaps its
/// traces, not that browser: it keeps running, and the server says no trace was stopped (it
/// killed the browser, and counted it as a trace).
#[test]
fn stopping_the_server_leaves_the_browser_it_opened_running() {
    use std::os::unix::fs::PermissionsExt;
    use std::time::{Duration, Instant};
    let dir = scratch("serve_open_browser");
    let (browser, pid_file) = (dir.join("browser.sh"), dir.join("browser.pid"));
    // A browser that stays: it writes its pid and the URL it was given, then waits.
    std::fs::write(&browser, format!("#!/bin/sh\necho \"$$ $1\" > {}\nsleep 60\n", pid_file.display())).unwrap();
    std::fs::set_permissions(&browser, std::fs::Permissions::from_mode(0o755)).unwrap();
    let s = Server::start_env(env!("CARGO_BIN_EXE_collector"), &dir.join("data"), &["--open"], &[("BROWSER", browser.to_str().unwrap())]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let said = loop {
        match std::fs::read_to_string(&pid_file) {
            Ok(t) if t.ends_with('\n') => break t,
            _ => {
                assert!(Instant::now() < deadline, "the server started no browser");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    let (pid, url) = said.trim().split_once(' ').unwrap();
    let pid: u32 = pid.parse().unwrap();
    assert!(url.starts_with(&format!("{}/", s.base)), "the browser got {url}");
    assert!(s.children().contains(&pid), "the browser is the server's child");
    let started = start_time(pid);
    let log = s.log.clone();
    let status = s.terminate(Duration::from_secs(30));
    assert_eq!(status.code(), Some(0));
    let alive = start_time(pid) == started;
    // The fake browser's `sleep`, then the browser itself.
    let mut ours = collector::serve::child_pids(pid);
    ours.push(pid);
    for p in ours {
        // SAFETY: kill(2) of the test's own fake browser and its child, found by pid.
        unsafe { libc::kill(p as libc::pid_t, libc::SIGKILL) };
    }
    assert!(alive, "the browser the server opened did not outlive it");
    let log = log.lock().unwrap();
    assert!(!log.iter().any(|l| l.contains("running trace(s)")), "no trace ran: {log:?}");
}

/// A process's start time (clock ticks since boot, field 22 of /proc/PID/stat), if it exists.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.split_whitespace().nth(19)?.parse().ok()
}

/// `GET /api/trace/{id}/leaks` answers what `collector leaks --json` says.
#[test]
fn leaks_of_a_stored_trace() {
    let s = Server::start(&scratch("leaks_api"), &[]);
    let (code, stored) = s.post_bytes("/api/trace/upload?filename=mlp.pickle", &std::fs::read(data("mlp_adam_3steps.pickle")).unwrap());
    assert_eq!(code, 200, "{stored}");
    let (code, r) = s.get_json(&format!("/api/trace/{}/leaks", stored["trace_id"].as_str().unwrap()));
    assert_eq!(code, 200, "{r}");
    assert_eq!((r["iterations"].as_u64(), r["leaking"].as_bool()), (Some(3), Some(false)), "{r}");
    assert!(r["verdict"].as_str().unwrap().starts_with("no steady growth"));
    assert_eq!(s.get("/api/trace/trace_404/leaks").0, 404);
}

/// `POST /api/trace/diff` answers what `collector diff --json` says of the same files; an
/// unknown id is a 404 naming it and its field, a device that does not exist a 422.
#[test]
fn diff_of_two_stored_traces() {
    let s = Server::start(&scratch("diff_api"), &[]);
    let upload = |name: &str| {
        let (code, stored) = s.post_bytes(&format!("/api/trace/upload?filename={name}"), &std::fs::read(data(name)).unwrap());
        assert_eq!(code, 200, "{stored}");
        stored["trace_id"].as_str().unwrap().to_owned()
    };
    let (a, b) = (upload("resnet18_sgd_2steps.pickle"), upload("mlp_adam_3steps.pickle"));
    let (code, d) = s.post_json("/api/trace/diff", &json!({"a": a, "b": b}));
    assert_eq!(code, 200, "{d}");
    assert_eq!(d["a"]["peak_allocated_bytes"].as_u64(), Some(facts("resnet18_sgd_2steps.pickle", "max_allocated")));
    assert_eq!(d["b"]["peak_allocated_bytes"].as_u64(), Some(facts("mlp_adam_3steps.pickle", "max_allocated")));
    assert_eq!(d["layers_match"], false);
    let cli = std::process::Command::new(env!("CARGO_BIN_EXE_collector"))
        .args([
            "diff".as_ref(),
            data("resnet18_sgd_2steps.pickle").as_os_str(),
            data("mlp_adam_3steps.pickle").as_os_str(),
            "--json".as_ref(),
        ])
        .output()
        .unwrap();
    assert_eq!(d, serde_json::from_slice::<Value>(&cli.stdout).unwrap());

    let (code, same) = s.post_json("/api/trace/diff", &json!({"a": b, "b": b, "device_a": 0}));
    assert_eq!(code, 200, "{same}");
    assert_eq!((same["peak_allocated_delta_bytes"].as_i64(), same["layers_match"].as_bool()), (Some(0), Some(true)));

    let (code, e) = s.post_json("/api/trace/diff", &json!({"a": a, "b": "trace_404"}));
    assert_eq!((code, detail(&e)), (404, "Trace trace_404 not found (field `b`)"));
    let (code, e) = s.post_json("/api/trace/diff", &json!({"a": a, "b": b, "device_b": 1}));
    assert_eq!((code, detail(&e)), (422, "field `device_b`: device 1 of B does not exist: B has 1 device, so the index must be below 1"));
    let (code, e) = s.post_json("/api/trace/diff", &json!({"a": a, "b": b, "device_a": 300}));
    assert!(code == 422 && detail(&e).contains("device_a"), "{code} {e}");
    let (code, e) = s.post_json("/api/trace/diff", &json!({"a": a}));
    assert!(code == 422 && detail(&e).contains("`b`"), "{code} {e}");
}

/// `GET /api/trace/{id}/advice` answers what `collector advise --json` says of the same file,
/// with a budget as bytes or a size; an unknown id is a 404, a budget that is not a size a 422
/// saying what one looks like.
#[test]
fn advice_of_a_stored_trace() {
    let s = Server::start(&scratch("advice_api"), &[]);
    let (code, stored) = s.post_bytes("/api/trace/upload?filename=r18.pickle", &std::fs::read(data("resnet18_sgd_2steps.pickle")).unwrap());
    assert_eq!(code, 200, "{stored}");
    let id = stored["trace_id"].as_str().unwrap();
    let (code, r) = s.get_json(&format!("/api/trace/{id}/advice?budget=200MiB"));
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["baseline"]["peak_allocated_bytes"].as_u64(), Some(facts("resnet18_sgd_2steps.pickle", "max_allocated")));
    assert_eq!(r["budget_bytes"].as_u64(), Some(200 << 20));
    let cli = std::process::Command::new(env!("CARGO_BIN_EXE_collector"))
        .arg("advise")
        .arg(data("resnet18_sgd_2steps.pickle"))
        .args(["--json", "--budget", "209715200"])
        .output()
        .unwrap();
    assert_eq!(r, serde_json::from_slice::<Value>(&cli.stdout).unwrap());
    let (code, e) = s.get_json("/api/trace/trace_404/advice");
    assert_eq!((code, detail(&e)), (404, "Trace trace_404 not found"));
    let (code, e) = s.get_json(&format!("/api/trace/{id}/advice?budget=12parsecs"));
    assert_eq!(code, 422, "{e}");
    assert_eq!(detail(&e), "query parameter `budget`: expected a size such as 6GiB, 512MiB, 1.5GB or 1073741824 (bytes), got `12parsecs`: unknown unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
    let (code, e) = s.get_json(&format!("/api/trace/{id}/advice?top=-1"));
    assert!(code == 422 && detail(&e).starts_with("invalid query"), "{code} {e}");
}

/// Writes `files` (name → Python expression of the bytes) with Python's gzip and pickle.
fn python_files(dir: &Path, files: &[(&str, &str)]) {
    let mut script = String::from("import gzip, pickle, sys\n");
    for (name, expr) in files {
        script.push_str(&format!("open({:?}, 'wb').write({expr})\n", dir.join(name).display().to_string()));
    }
    let python = std::env::var("MEMORY_TRACER_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = std::process::Command::new(python).args(["-c", &script]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn hostile_uploads_cost_a_bounded_child_not_the_server() {
    let dir = scratch("serve-hostile");
    let files = scratch("serve-hostile-files");
    python_files(
        &files,
        &[
            // 512 MiB of one JSON string behind 0.5 MB of gzip: a parser must hold the string.
            ("string-bomb.json.gz", "gzip.compress(b'{\"traceEvents\": [{\"name\": \"' + b'A' * (512 << 20), 9)"),
            // 10^9 blocks from 200 KB: one segment referenced 10^4 times, its block 10^5 times.
            (
                "shared-refs.pickle",
                "pickle.dumps({'segments': [{'device': 0, 'address': 0, 'total_size': 512, 'allocated_size': 512, 'active_size': 512, 'requested_size': 512, 'stream': 0, 'segment_type': 'small', 'blocks': [{'size': 512, 'requested_size': 512, 'address': 0, 'state': 'active_allocated', 'frames': []}] * 100000}] * 10000, 'device_traces': [[]]}, protocol=2)",
            ),
            ("deep.json", "b'{\"traceEvents\": ' + b'[' * 1000000"),
            ("deep.pickle", "b'\\x80\\x02' + b']' * 1000000 + b'.'"),
            ("mark-pop.pickle", "b'\\x80\\x02(0.'"),
        ],
    );
    let s = Server::start(&dir, &["--import-memory-mb", "64"]);
    let (_, hwm_before) = s.memory_kib();
    for name in ["string-bomb.json.gz", "shared-refs.pickle", "deep.json", "deep.pickle", "mark-pop.pickle"] {
        let bytes = std::fs::read(files.join(name)).unwrap();
        let started = std::time::Instant::now();
        let (code, e) = s.post_bytes(&format!("/api/trace/upload?filename={name}"), &bytes);
        let took = started.elapsed();
        let (rss, hwm) = s.memory_kib();
        eprintln!(
            "{name} ({} bytes): {code} in {took:?}; server RSS {} MiB, peak {} MiB: {}",
            bytes.len(),
            rss >> 10,
            hwm >> 10,
            detail(&e)
        );
        assert_eq!(code, 422, "{name}: {e}");
        assert!(took < std::time::Duration::from_secs(60), "{name} took {took:?}");
        assert_eq!(s.get_json("/api/health").0, 200, "the server is unwell after {name}");
    }
    let (_, hwm_after) = s.memory_kib();
    assert!(hwm_after < hwm_before + (64 << 10), "the server's peak RSS grew from {hwm_before} KiB to {hwm_after} KiB");
    let (code, e) =
        s.post_bytes("/api/trace/upload?filename=string-bomb.json.gz", &std::fs::read(files.join("string-bomb.json.gz")).unwrap());
    assert_eq!(code, 422);
    assert!(detail(&e).contains("--import-memory-mb"), "the memory limit is named: {e}");
    assert_eq!(s.get_json("/api/trace/list").1["count"], 0, "a hostile upload was stored");
    assert_eq!(std::fs::read_dir(dir.join("tmp")).unwrap().count(), 0, "a hostile upload left files behind");
    // A good file still imports, and exports run in the same kind of child.
    let snap = std::fs::read(data("resnet18_sgd_2steps.pickle")).unwrap();
    let (code, u) = s.post_bytes("/api/trace/upload?filename=resnet18_sgd_2steps.pickle", &snap);
    assert_eq!(code, 200, "{u}");
    let (code, e) = s.post_json("/api/trace/export", &json!({"trace_id": u["trace_id"], "format": "chrome"}));
    assert_eq!(code, 200, "{e}");
}

#[test]
fn imports_and_exports_run_a_bounded_number_at_once() {
    let s = Server::start(&scratch("serve-import-slots"), &["--max-imports", "1", "--import-queue", "0"]);
    let snap = std::fs::read(data("resnet18_sgd_2steps.pickle")).unwrap();
    let codes: Vec<(u16, Option<String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                scope.spawn(|| {
                    let r = s
                        .agent
                        .post(s.url("/api/trace/upload?filename=r.pickle"))
                        .header("Content-Type", "application/octet-stream")
                        .send(&snap[..])
                        .unwrap();
                    let retry = r.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_owned);
                    (r.status().as_u16(), retry)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(codes.iter().all(|(c, _)| *c == 200 || *c == 429), "{codes:?}");
    assert!(codes.iter().any(|(c, _)| *c == 200), "{codes:?}");
    assert!(codes.iter().any(|(c, r)| *c == 429 && r.is_some()), "no upload was turned away with Retry-After: {codes:?}");
}

#[test]
fn pages_of_other_sites_cannot_reach_a_loopback_server() {
    let s = Server::start(&scratch("serve-browsers"), &[]);
    let port = s.addr().rsplit(':').next().unwrap().to_owned();
    // DNS rebinding: a page whose name now resolves to 127.0.0.1.
    for host in ["evil.example", &format!("evil.example:{port}"), "localhost.evil.example", "127.0.0.1.nip.io"] {
        let (code, body) = s.raw(format!("GET /api/trace/list HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes());
        assert_eq!(code, 403, "{host}: {body}");
        assert!(body.contains("Host") && body.contains("DNS rebinding"), "{body}");
    }
    for host in [format!("127.0.0.1:{port}"), format!("localhost:{port}"), format!("[::1]:{port}"), "localhost".to_owned()] {
        let (code, body) = s.raw(format!("GET /api/trace/list HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes());
        assert_eq!(code, 200, "{host}: {body}");
    }
    // CSRF: forms (text/plain, multipart) need no preflight, so the server refuses them.
    let snap = std::fs::read(data("resnet18_sgd_2steps.pickle")).unwrap();
    let form = |origin: &str| {
        let boundary = "mt-csrf";
        let mut body = format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"r.pickle\"\r\n\r\n").into_bytes();
        body.extend_from_slice(&snap);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let mut req = format!(
            "POST /api/trace/upload HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{origin}Content-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(&body);
        req
    };
    let text_plain = |origin: &str, path: &str| {
        let body = r#"{"model_name": "mlp", "input_shape": [2, 784], "iterations": 1}"#;
        format!("POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{origin}Content-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).into_bytes()
    };
    for origin in [
        "Origin: http://evil.example\r\n",
        "Origin: null\r\n",
        "Sec-Fetch-Site: cross-site\r\n",
        &format!("Origin: http://localhost:{port}\r\n"),
    ] {
        for (what, req) in [
            ("multipart upload", form(origin)),
            ("text/plain upload", text_plain(origin, "/api/trace/upload")),
            ("text/plain trace", text_plain(origin, "/api/trace/memory")),
        ] {
            let (code, body) = s.raw(&req);
            assert_eq!(code, 403, "{what} with {origin:?}: {body}");
            assert!(body.contains("cross-origin POST refused"), "{body}");
        }
        let (code, body) =
            s.raw(format!("DELETE /api/trace/trace_1 HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{origin}Connection: close\r\n\r\n").as_bytes());
        assert_eq!(code, 403, "DELETE with {origin:?}: {body}");
    }
    assert_eq!(s.get_json("/api/trace/list").1["count"], 0, "a cross-origin upload was stored");
    // The server's own page (same origin), and clients that send no Origin, keep working.
    let (code, body) = s.raw(&form(&format!("Origin: http://127.0.0.1:{port}\r\nSec-Fetch-Site: same-origin\r\n")));
    assert_eq!(code, 200, "{body}");
    let (code, body) = s.raw(&form(""));
    assert_eq!(code, 200, "{body}");
    assert_eq!(s.get_json("/api/trace/list").1["count"], 2);
    // --cors-origin lets that origin in.
    let s = Server::start(&scratch("serve-browsers-cors"), &["--cors-origin", "http://viewer.example"]);
    let body = r#"{"model_name": "script.py"}"#;
    let allowed = format!("POST /api/trace/live HTTP/1.1\r\nHost: {}\r\nOrigin: http://viewer.example\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", s.addr(), body.len());
    assert_eq!(s.raw(allowed.as_bytes()).0, 202);
    let refused = allowed.replace("viewer.example", "evil.example");
    assert_eq!(s.raw(refused.as_bytes()).0, 403);
}

#[test]
fn slow_clients_and_connection_floods_are_cut_off() {
    use std::io::{Read, Write};
    let s = Server::start(&scratch("serve-slow"), &["--header-timeout-s", "2", "--body-timeout-s", "2", "--max-connections", "8"]);
    // Slowloris: headers dripped a line a second are cut off at the header timeout.
    let mut c = std::net::TcpStream::connect(s.addr()).unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_millis(200))).unwrap();
    let started = std::time::Instant::now();
    c.write_all(b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\n").unwrap();
    let closed = loop {
        assert!(started.elapsed() < std::time::Duration::from_secs(20), "a slowloris client is still connected after 20 s");
        if c.write_all(b"X-Slow: 1\r\n").is_err() {
            break started.elapsed();
        }
        let mut buf = [0u8; 256];
        match c.read(&mut buf) {
            Ok(0) => break started.elapsed(),
            Ok(_) => panic!("the server answered a request whose headers never ended"),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => break started.elapsed(), // reset: closed
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
    };
    eprintln!("slowloris cut off after {closed:?}");
    assert!(closed < std::time::Duration::from_secs(6), "{closed:?}");
    // A body that stops arriving: 408, nothing stored.
    let mut c = std::net::TcpStream::connect(s.addr()).unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(20))).unwrap();
    let started = std::time::Instant::now();
    c.write_all(b"POST /api/trace/upload HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\n0123456789").unwrap();
    let mut answer = Vec::new();
    let _ = c.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    eprintln!("stalled body answered after {:?}", started.elapsed());
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(started.elapsed() < std::time::Duration::from_secs(6));
    assert_eq!(std::fs::read_dir(s.data_dir.join("tmp")).unwrap().count(), 0, "a stalled upload left files behind");
    // Idle connections are closed at the header timeout.
    let mut idle = std::net::TcpStream::connect(s.addr()).unwrap();
    idle.set_read_timeout(Some(std::time::Duration::from_secs(20))).unwrap();
    let started = std::time::Instant::now();
    assert!(matches!(idle.read(&mut [0u8; 16]), Ok(0) | Err(_)));
    assert!(started.elapsed() < std::time::Duration::from_secs(6), "an idle connection stayed {:?}", started.elapsed());
    drop(s);
    // More connections than --max-connections: the next one gets 503 with Retry-After (a
    // header timeout long enough that the idle ones stay open under load).
    let s = Server::start(&scratch("serve-flood"), &["--header-timeout-s", "60", "--max-connections", "8"]);
    let idle: Vec<_> = (0..8).map(|_| std::net::TcpStream::connect(s.addr()).unwrap()).collect();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let r = s.raw(b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    assert_eq!(r.0, 503, "{r:?}");
    assert!(r.1.contains("--max-connections"), "{r:?}");
    // Once they close, the server answers again.
    drop(idle);
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(s.get_json("/api/health").0, 200);
}

#[test]
fn huge_inputs_are_refused_with_default_shapes_too() {
    let s = Server::start(&scratch("serve-default-shape"), &[]);
    let started = std::time::Instant::now();
    for (model, batch) in [("resnet50", 4096), ("vgg16", 2000), ("gpt", 4096 * 64)] {
        let (code, e) = s.post_json("/api/trace/memory", &json!({"model_name": model, "batch_size": batch}));
        assert_eq!(code, 422, "{model}: {e}");
        assert!(detail(&e).contains("batch_size"), "{e}");
    }
    let (code, e) = s.post_json("/api/trace/memory", &json!({"model_name": "resnet50", "batch_size": 4096}));
    assert!(code == 422 && detail(&e).contains("268435456 elements"), "{e}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "refusals must not run the model");
    assert_eq!(s.get_json("/api/jobs").1["jobs"], json!([]), "a refused request made a job");
}

#[test]
fn cpu_trace_processes_run_under_a_memory_limit() {
    // 1 MiB beyond libtorch's mappings: an input of 3 GB cannot be allocated, and the job says so.
    let s = Server::start(&scratch("serve-trace-limit"), &["--trace-memory-mb", "1", "--max-input-elements", "1000000000"]);
    let (code, e) = s.post_json("/api/trace/memory", &json!({"model_name": "mlp", "input_shape": [1000000, 784], "iterations": 1}));
    assert_eq!(code, 422, "{e}");
    eprintln!("{}", detail(&e));
    assert_eq!(s.get_json("/api/health").0, 200);
    let (code, r) = s.post_json("/api/trace/memory", &json!({"model_name": "mlp", "input_shape": [2, 784], "iterations": 1}));
    assert_eq!(code, 200, "a small trace fits: {r}");
}

/// What the server printed at start, once it has printed the viewer's URL.
fn startup_lines(s: &Server) -> String {
    for _ in 0..200 {
        let log = s.log.lock().unwrap().join("\n");
        if log.contains("viewer:") {
            return log;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("the server printed no viewer URL: {:?}", s.log.lock().unwrap());
}

#[test]
fn tokens_from_a_file_or_the_environment_are_never_shown() {
    let token = "file-token-0123456789abcdef";
    let dir = scratch("serve-token-file");
    let file = dir.join("token");
    std::fs::write(&file, format!("{token}\n")).unwrap();
    let file_arg = file.display().to_string();
    let exe = env!("CARGO_BIN_EXE_collector");
    for (args, env) in [(vec!["--token-file", file_arg.as_str()], vec![]), (vec![], vec![("MEMORY_TRACER_TOKEN", token)])] {
        let s = Server::start_env(exe, &dir.join("data"), &args, &env);
        assert_eq!(s.token.as_deref(), Some(token));
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", s.pid())).unwrap();
        assert!(!String::from_utf8_lossy(&cmdline).contains(token), "the token is in the process's arguments");
        assert_eq!(s.get_json("/api/health").0, 200, "the right token");
        let anonymous = server::agent();
        for wrong in ["", "x", &token[..token.len() - 1], &format!("{token}x"), &"f".repeat(token.len()), &"y".repeat(10_000)] {
            let r = anonymous.get(s.url("/api/health")).header("Authorization", format!("Bearer {wrong}")).call().unwrap();
            assert_eq!(r.status().as_u16(), 401, "a wrong token of {} bytes", wrong.len());
        }
        let log = startup_lines(&s);
        assert!(!log.contains(token), "the startup lines show the token: {log}");
    }
    // --show-token asks for the URL with it.
    let s = Server::start_env(exe, &dir.join("data"), &["--token-file", &file_arg, "--show-token"], &[]);
    let log = startup_lines(&s);
    assert!(log.contains(&format!("?token={token}")), "{log}");
    // A token is still required off loopback, and an empty token file is refused.
    std::fs::write(&file, "\n").unwrap();
    let out = std::process::Command::new(exe)
        .args(["serve", "--port", "0", "--token-file", &file_arg, "--data-dir"])
        .arg(dir.join("data"))
        .output()
        .unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("empty"), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A stored trace explored over HTTP (what the page does for files larger than it can hold):
/// the overview and every answer come from the server's own import, with PyTorch's peak; a
/// session stays open for the next request and closes with the trace.
#[test]
fn stored_traces_are_explored_over_http() {
    let s = Server::start(&scratch("explore"), &[]);
    let name = "resnet18_sgd_2steps.pickle";
    let bytes = std::fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data").join(name)).unwrap();
    let (code, stored) = s.post_bytes(&format!("/api/trace/upload?filename={name}"), &bytes);
    assert_eq!(code, 200, "{stored}");
    let id = stored["trace_id"].as_str().unwrap().to_owned();
    let facts: Value =
        serde_json::from_slice(&std::fs::read(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/facts.json")).unwrap())
            .unwrap();
    let peak = facts["samples"][name]["max_allocated"].as_u64().unwrap();

    let (code, o) = s.get_json(&format!("/api/trace/{id}/overview"));
    assert_eq!(code, 200, "{o}");
    let overview: protocol::Overview = serde_json::from_value(o).unwrap();
    assert_eq!(overview.summary.peak_allocated_bytes, peak);
    let ask = |r: &protocol::ExploreRequest| -> protocol::ExploreResponse {
        let (code, v) = s.post_json(&format!("/api/trace/{id}/explore"), &serde_json::to_value(r).unwrap());
        assert_eq!(code, 200, "{v}");
        serde_json::from_value(v).unwrap()
    };
    let end_s = overview.duration_s;
    let protocol::ExploreResponse::Timeline { points, .. } = ask(&protocol::ExploreRequest::Timeline { start_s: 0.0, end_s, buckets: 500 })
    else {
        panic!("not a timeline")
    };
    assert_eq!(points.iter().map(|p| p.allocated_max_bytes).max(), Some(peak));
    let active = ask(&protocol::ExploreRequest::Active { start_s: 0.0, end_s, columns: 300 });
    let protocol::ExploreResponse::Active(a) = active else { panic!("not the active view") };
    assert_eq!(a.totals.iter().max().copied(), Some(peak));
    assert!(!a.bands.is_empty());
    let protocol::ExploreResponse::Allocations { allocations, .. } =
        ask(&protocol::ExploreRequest::Allocation { event_index: a.bands.event_index[0] as usize })
    else {
        panic!("not an allocation")
    };
    assert_eq!(allocations[0].size_bytes, a.bands.size_bytes[0]);
    // The flame graph, asked apart from the overview: its root holds the peak's bytes.
    let protocol::ExploreResponse::Flame { graph: flame } = ask(&protocol::ExploreRequest::Flame { all_frames: false }) else {
        panic!("not a flame graph")
    };
    assert_eq!(flame.nodes[0].live_at_peak_bytes, peak);
    // Bad requests: 422 naming what is wrong; an unknown trace: 404.
    let (code, e) = s.post_json(&format!("/api/trace/{id}/explore"), &json!({"kind": "nonsense"}));
    assert_eq!(code, 422, "{e}");
    let (code, _) = s.post_json("/api/trace/t-none/explore", &json!({"kind": "at", "t_s": 0.0}));
    assert_eq!(code, 404);
    // Deleted: the session goes with it.
    let (code, _) = s.delete(&format!("/api/trace/{id}"));
    assert_eq!(code, 200);
    let (code, _) = s.post_json(&format!("/api/trace/{id}/explore"), &json!({"kind": "at", "t_s": 0.0}));
    assert_eq!(code, 404);
    let (code, _) = s.get_json(&format!("/api/trace/{id}/overview"));
    assert_eq!(code, 404);
}

/// A torch 2.15 snapshot over HTTP: the overview has its pools, pinned host memory and the
/// categories at the peak; the explore API finds an annotation and draws the pools.
#[test]
fn pools_categories_and_search_over_http() {
    let s = Server::start(&scratch("pools"), &[]);
    let name = "layout_2_15.pickle";
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data").join(name);
    let bytes = std::fs::read(&path).unwrap();
    let (code, stored) = s.post_bytes(&format!("/api/trace/upload?filename={name}"), &bytes);
    assert_eq!(code, 200, "{stored}");
    let id = stored["trace_id"].as_str().unwrap().to_owned();
    let trace = shared::import::snapshot::import(&bytes).unwrap();
    let (code, o) = s.get_json(&format!("/api/trace/{id}/overview"));
    assert_eq!(code, 200, "{o}");
    let overview: protocol::Overview = serde_json::from_value(o).unwrap();
    assert_eq!(overview.summary.pools, shared::analysis::pools::pool_totals(&trace));
    assert_eq!(overview.summary.pinned_host, shared::analysis::summary(&trace).pinned_host);
    let sum: u64 = overview.categories_at_peak.iter().map(|&(_, b)| b).sum();
    assert_eq!(sum, overview.summary.peak_allocated_bytes);
    let (code, v) = s.post_json(&format!("/api/trace/{id}/explore"), &json!({"kind": "find", "query": "graph input", "limit": 5}));
    assert_eq!(code, 200, "{v}");
    let protocol::ExploreResponse::Found(f) = serde_json::from_value(v).unwrap() else { panic!("not a search") };
    assert_eq!((f.total, f.matches[0].text.as_str()), (1, "graph input"));
    let (code, v) = s.post_json(&format!("/api/trace/{id}/explore"), &json!({"kind": "pools", "buckets": 200}));
    assert_eq!(code, 200, "{v}");
    let protocol::ExploreResponse::Pools { curves, .. } = serde_json::from_value(v).unwrap() else { panic!("not the pools") };
    // Times cross JSON (parsed to the nearest few ulps): compare the panels and their bytes.
    let key = |c: &shared::analysis::pools::PoolCurve| {
        let bytes: Vec<(u64, u64)> = c.points.iter().map(|p| (p.allocated_max_bytes, p.reserved_max_bytes)).collect();
        (c.device.clone(), c.pool.clone(), c.stream.clone(), c.peak_allocated_bytes, c.peak_reserved_bytes, bytes)
    };
    let want = shared::analysis::pools::pool_curves(&trace, 200);
    assert_eq!(curves.iter().map(key).collect::<Vec<_>>(), want.iter().map(key).collect::<Vec<_>>());
    assert!(curves.iter().any(|c| c.private));
    // An allocation made under dict metadata: its metadata decoded.
    let n = trace
        .event_notes
        .iter()
        .find(|n| {
            trace.str(n.text).starts_with("{\"step\"") && trace.events.event_type(n.event as usize) == shared::model::EventType::Alloc
        })
        .unwrap();
    let (code, v) = s.post_json(&format!("/api/trace/{id}/explore"), &json!({"kind": "allocation", "event_index": n.event}));
    assert_eq!(code, 200, "{v}");
    let protocol::ExploreResponse::Allocations { allocations, .. } = serde_json::from_value(v).unwrap() else {
        panic!("not an allocation")
    };
    assert_eq!(allocations[0].user_metadata.as_ref().and_then(|m| m.get("step")), Some(&json!(3)), "{:?}", allocations[0]);
}
