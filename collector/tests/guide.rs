//! The MemoryTracer API guide's own examples (../shared/seeds/000_2181d9a8825ccd47.txt) run
//! against a bound `collector serve`: its Python client example (requests), its JavaScript
//! client example (Node's built-in fetch) and each curl command, with only the base URL and
//! the example models and trace ids adapted. These examples are the contract.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod server;

use serde_json::Value;
use server::{scratch, Server};
use std::path::Path;
use std::process::Command;

fn guide(file: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/guide").join(file).display().to_string()
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{cmd:?} failed: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    stdout
}

#[test]
fn the_python_client_example_works_unchanged() {
    let s = Server::start(&scratch("guide_python"), &[]);
    let python = std::env::var("MEMORY_TRACER_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = run(Command::new(python).arg(guide("python_client.py")).env("BASE_URL", &s.base));
    for line in [
        "Peak Memory: ",
        "Fragmentation: ",
        "Total Layers: ",
        "Active traces: ['trace_",
        "Exported to: /api/trace/download/",
        "File size: ",
        "deleted successfully",
        "GUIDE PYTHON EXAMPLE OK",
    ] {
        assert!(out.contains(line), "{line:?} missing from:\n{out}");
    }
}

#[test]
fn the_javascript_client_example_works_unchanged() {
    let s = Server::start(&scratch("guide_js"), &[]);
    let out = run(Command::new("node").arg(guide("js_client.mjs")).env("BASE_URL", &s.base));
    for line in ["Peak Memory: ", "Layers: ", "Download URL: /api/trace/download/", "Deleted trace: trace_", "GUIDE JS EXAMPLE OK"] {
        assert!(out.contains(line), "{line:?} missing from:\n{out}");
    }
}

/// Runs one of the guide's curl commands with its URL pointed at the server.
fn curl(s: &Server, command: &str) -> Value {
    let command = command.replace("http://localhost:8000", &s.base);
    let out = run(Command::new("sh").args(["-c", &format!("{command} --silent --show-error --fail-with-body")]));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{command}: not JSON ({e}): {out}"))
}

#[test]
fn each_curl_command_of_the_guide_works() {
    let s = Server::start(&scratch("guide_curl"), &[]);
    let health = curl(&s, "curl http://localhost:8000/api/health");
    assert_eq!(health["status"], "healthy");

    let t = curl(
        &s,
        r#"curl -X POST "http://localhost:8000/api/trace/memory" \
  -H "Content-Type: application/json" \
  -d '{
    "model_name": "resnet50",
    "input_shape": [4, 3, 224, 224],
    "batch_size": 4,
    "max_events": 5000
  }'"#,
    );
    assert_eq!(t["model_name"], "resnet50");
    for key in ["total_events", "total_layers"] {
        assert!(t[key].as_u64().is_some_and(|n| n > 0), "{key}: {t}");
    }
    for key in ["peak_allocated_mb", "peak_reserved_mb", "avg_fragmentation", "tracing_time_ms"] {
        assert!(t[key].is_f64() || t[key].is_u64(), "{key}: {t}");
    }
    assert!(t["total_events"].as_u64().unwrap() <= 5000, "max_events 5000 bounds the events kept");
    let conv = &t["layer_stats"]["layer1.0.conv1"];
    assert_eq!(conv["layer_name"], "layer1.0.conv1");
    for key in ["peak_allocated", "peak_reserved", "total_allocations", "total_deallocations"] {
        assert!(conv[key].is_u64(), "{key}: {conv}");
    }
    for key in ["avg_fragmentation", "duration_ms"] {
        assert!(conv[key].is_number(), "{key}: {conv}");
    }
    let id = t["trace_id"].as_str().unwrap();

    let e = curl(
        &s,
        &r#"curl -X POST "http://localhost:8000/api/trace/export" \
  -H "Content-Type: application/json" \
  -d '{
    "trace_id": "trace_1705536000000",
    "format": "speedscope"
  }'"#
        .replace("trace_1705536000000", id),
    );
    assert_eq!((e["trace_id"].as_str(), e["format"].as_str()), (Some(id), Some("speedscope")));
    assert!(e["download_url"].as_str().unwrap().starts_with("/api/trace/download/"));
    assert!(e["file_size_bytes"].as_u64().is_some_and(|n| n > 0));

    let l = curl(&s, r#"curl "http://localhost:8000/api/trace/list""#);
    assert_eq!(l["active_traces"], serde_json::json!([id]));
    assert_eq!(l["count"], 1);

    let d = curl(&s, &r#"curl -X DELETE "http://localhost:8000/api/trace/trace_1705536000000""#.replace("trace_1705536000000", id));
    assert_eq!(d["message"], format!("Trace {id} deleted successfully"));
    assert_eq!(d["remaining_traces"], 0);
}
