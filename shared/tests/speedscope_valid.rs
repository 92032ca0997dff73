//! The speedscope export obeys https://www.speedscope.app/file-format-schema.json (required
//! fields, types and enums, checked here field by field) and the rules speedscope's importer
//! enforces beyond the schema: frame indices exist, evented `at` values never go back, every
//! close matches the innermost open frame, samples and weights pair up.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches fail loudly by design

use serde_json::Value;
use shared::export::{export, ExportFormat};
use shared::{import, ImportOptions};
use std::path::PathBuf;

fn validate(doc: &Value) -> Result<(), String> {
    let obj = doc.as_object().ok_or("file is not an object")?;
    if obj.get("$schema").and_then(Value::as_str) != Some("https://www.speedscope.app/file-format-schema.json") {
        return Err("$schema missing or wrong".into());
    }
    let frames = obj["shared"]["frames"].as_array().ok_or("shared.frames missing")?;
    for (i, f) in frames.iter().enumerate() {
        f["name"].as_str().ok_or(format!("frames[{i}].name not a string"))?;
        for (k, ty) in [("file", "string"), ("line", "number"), ("col", "number")] {
            if let Some(v) = f.get(k) {
                let ok = if ty == "string" { v.is_string() } else { v.is_number() };
                if !ok {
                    return Err(format!("frames[{i}].{k} is not a {ty}"));
                }
            }
        }
    }
    for k in ["name", "exporter"] {
        if obj.get(k).is_some_and(|v| !v.is_string()) {
            return Err(format!("{k} is not a string"));
        }
    }
    let units = ["bytes", "microseconds", "milliseconds", "nanoseconds", "none", "seconds"];
    let profiles = obj["profiles"].as_array().ok_or("profiles missing")?;
    let nframes = frames.len() as u64;
    for (p, prof) in profiles.iter().enumerate() {
        prof["name"].as_str().ok_or(format!("profiles[{p}].name"))?;
        let unit = prof["unit"].as_str().ok_or(format!("profiles[{p}].unit"))?;
        if !units.contains(&unit) {
            return Err(format!("profiles[{p}].unit {unit} not allowed"));
        }
        let start = prof["startValue"].as_f64().ok_or(format!("profiles[{p}].startValue"))?;
        let end = prof["endValue"].as_f64().ok_or(format!("profiles[{p}].endValue"))?;
        match prof["type"].as_str() {
            Some("evented") => {
                let mut stack: Vec<u64> = Vec::new();
                let mut last = start;
                for (i, e) in prof["events"].as_array().ok_or("events")?.iter().enumerate() {
                    let at = e["at"].as_f64().ok_or(format!("profiles[{p}].events[{i}].at"))?;
                    let frame = e["frame"].as_u64().ok_or(format!("profiles[{p}].events[{i}].frame"))?;
                    if frame >= nframes {
                        return Err(format!("profiles[{p}].events[{i}] frame {frame} out of range"));
                    }
                    if at < last || at > end {
                        return Err(format!("profiles[{p}].events[{i}] at {at} out of order"));
                    }
                    last = at;
                    match e["type"].as_str() {
                        Some("O") => stack.push(frame),
                        Some("C") => {
                            if stack.pop() != Some(frame) {
                                return Err(format!("profiles[{p}].events[{i}] closes a frame that is not innermost"));
                            }
                        }
                        _ => return Err(format!("profiles[{p}].events[{i}].type")),
                    }
                }
                if !stack.is_empty() {
                    return Err(format!("profiles[{p}] leaves {} frames open", stack.len()));
                }
            }
            Some("sampled") => {
                let samples = prof["samples"].as_array().ok_or("samples")?;
                let weights = prof["weights"].as_array().ok_or("weights")?;
                if samples.len() != weights.len() {
                    return Err(format!("profiles[{p}] samples and weights differ in length"));
                }
                let mut total = 0.0;
                for (s, w) in samples.iter().zip(weights) {
                    for f in s.as_array().ok_or("sample not an array")? {
                        if f.as_u64().is_none_or(|f| f >= nframes) {
                            return Err(format!("profiles[{p}] sample frame {f} out of range"));
                        }
                    }
                    total += w.as_f64().ok_or("weight not a number")?;
                }
                if (total - (end - start)).abs() > 0.5 {
                    return Err(format!("profiles[{p}] weights sum to {total}, not endValue − startValue"));
                }
            }
            other => return Err(format!("profiles[{p}].type {other:?}")),
        }
    }
    Ok(())
}

#[test]
fn speedscope_export_is_valid_for_every_sample() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data");
    for sample in ["mlp_adam_3steps.pickle", "resnet18_sgd_2steps.pickle", "convnet_profiler_trace.json", "dftracer_sample.pfw.gz"] {
        let trace = import(&std::fs::read(dir.join(sample)).unwrap(), &ImportOptions::default()).unwrap();
        let mut out = Vec::new();
        export(&trace, ExportFormat::Speedscope, &mut out).unwrap();
        let doc: Value = serde_json::from_slice(&out).unwrap();
        validate(&doc).unwrap_or_else(|e| panic!("{sample}: {e}"));
        let profiles = doc["profiles"].as_array().unwrap();
        let sampled = profiles.iter().find(|p| p["type"] == "sampled").unwrap();
        if sample.ends_with(".pickle") {
            // The live bytes at the peak, by stack, are the memory allocated during recording.
            let s = shared::analysis::summary(&trace);
            let pre: u64 = trace.events.base_totals.iter().map(|t| t.allocated_bytes).sum();
            assert_eq!(sampled["endValue"].as_u64().unwrap(), s.peak_allocated_bytes - pre, "{sample}");
        }
    }
}

#[test]
fn validator_rejects_broken_files() {
    let bad = serde_json::json!({"$schema": "https://www.speedscope.app/file-format-schema.json",
        "shared": {"frames": [{"name": "a"}]},
        "profiles": [{"type": "evented", "name": "x", "unit": "nanoseconds", "startValue": 0, "endValue": 10,
                      "events": [{"type": "O", "frame": 0, "at": 5}, {"type": "C", "frame": 0, "at": 2}]}]});
    assert!(validate(&bad).is_err());
}
