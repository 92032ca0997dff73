//! speedscope JSON (https://www.speedscope.app/file-format-schema.json): one evented profile
//! per thread with layer scopes and operators over time, and a sampled profile in bytes of the
//! memory live at the allocated peak, by allocation stack (or by device, phase and layer when
//! the source has no stacks).

use super::ExportError;
use crate::analysis::{live_allocations_at, nested_spans, summary};
use crate::model::{StrId, Trace};
use serde::Serialize;
use std::collections::HashMap;
use std::io::Write;

#[derive(Serialize)]
struct File<'a> {
    #[serde(rename = "$schema")]
    schema: &'static str,
    shared: Shared,
    profiles: Vec<Profile>,
    name: &'a str,
    #[serde(rename = "activeProfileIndex")]
    active_profile_index: usize,
    exporter: String,
}

#[derive(Serialize)]
struct Shared {
    frames: Vec<FrameOut>,
}

#[derive(Serialize)]
struct FrameOut {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    line: Option<u32>,
}

#[derive(Serialize)]
#[serde(tag = "type")]
enum Profile {
    #[serde(rename = "evented")]
    Evented {
        name: String,
        unit: &'static str,
        #[serde(rename = "startValue")]
        start_value: u64,
        #[serde(rename = "endValue")]
        end_value: u64,
        events: Vec<OpenClose>,
    },
    #[serde(rename = "sampled")]
    Sampled {
        name: String,
        unit: &'static str,
        #[serde(rename = "startValue")]
        start_value: u64,
        #[serde(rename = "endValue")]
        end_value: u64,
        samples: Vec<Vec<usize>>,
        weights: Vec<u64>,
    },
}

#[derive(Serialize)]
struct OpenClose {
    #[serde(rename = "type")]
    kind: &'static str,
    frame: usize,
    at: u64,
}

#[derive(Default)]
struct Frames {
    out: Vec<FrameOut>,
    index: HashMap<(String, Option<String>, Option<u32>), usize>,
}

impl Frames {
    fn get(&mut self, name: &str, file: Option<&str>, line: Option<u32>) -> usize {
        let key = (name.to_owned(), file.map(str::to_owned), line);
        if let Some(&i) = self.index.get(&key) {
            return i;
        }
        self.out.push(FrameOut { name: name.to_owned(), file: file.map(str::to_owned), line });
        self.index.insert(key, self.out.len() - 1);
        self.out.len() - 1
    }
}

pub fn write(trace: &Trace, out: impl Write) -> Result<(), ExportError> {
    let start = trace.start_ns();
    let end = trace.end_ns().max(start);
    let mut frames = Frames::default();
    let mut profiles = Vec::new();
    let mut name_frames: HashMap<StrId, usize> = HashMap::new();
    for (tid, spans) in nested_spans(trace) {
        let mut events = Vec::with_capacity(spans.len() * 2);
        let mut open: Vec<(u64, usize)> = Vec::new(); // (end, frame)
        for s in &spans {
            while let Some(&(e, f)) = open.last() {
                if e > s.start_ns {
                    break;
                }
                events.push(OpenClose { kind: "C", frame: f, at: e - start });
                open.pop();
            }
            let f = *name_frames.entry(s.name).or_insert_with(|| frames.get(trace.str(s.name), None, None));
            events.push(OpenClose { kind: "O", frame: f, at: s.start_ns - start });
            open.push((s.end_ns, f));
        }
        while let Some((e, f)) = open.pop() {
            events.push(OpenClose { kind: "C", frame: f, at: e - start });
        }
        profiles.push(Profile::Evented {
            name: format!("layers and operators, thread {tid}"),
            unit: "nanoseconds",
            start_value: 0,
            end_value: end - start,
            events,
        });
    }

    // Live memory at the peak, by stack.
    let sum = summary(trace);
    let mut by_stack: HashMap<Vec<usize>, u64> = HashMap::new();
    if let Some(peak) = sum.peak_event_index {
        let ev = &trace.events;
        for i in live_allocations_at(trace, peak) {
            let stack: Vec<usize> = match trace.stacks.stack_of_event(i) {
                Some(sid) => {
                    let fs: Vec<_> = trace.stacks.stack(sid).copied().collect();
                    fs.iter().rev().map(|f| frames.get(trace.str(f.name), Some(trace.str(f.filename)), Some(f.line))).collect()
                }
                None => {
                    let dev = trace.devices.get(ev.device[i] as usize).map(|d| d.to_string()).unwrap_or_default();
                    let mut s = vec![frames.get(&dev, None, None), frames.get(ev.phase(i).as_str(), None, None)];
                    if let Some(l) = trace.opt_str(ev.layer[i]) {
                        s.push(frames.get(l, None, None));
                    }
                    s
                }
            };
            *by_stack.entry(stack).or_default() += ev.size_bytes[i];
        }
    }
    let mut stacks: Vec<(Vec<usize>, u64)> = by_stack.into_iter().collect();
    stacks.sort();
    let total: u64 = stacks.iter().map(|s| s.1).sum();
    profiles.push(Profile::Sampled {
        name: "live memory at peak (bytes)".into(),
        unit: "bytes",
        start_value: 0,
        end_value: total,
        samples: stacks.iter().map(|s| s.0.clone()).collect(),
        weights: stacks.iter().map(|s| s.1).collect(),
    });
    let name = trace.meta.model.as_deref().unwrap_or("memory trace");
    let file = File {
        schema: "https://www.speedscope.app/file-format-schema.json",
        shared: Shared { frames: frames.out },
        profiles,
        name,
        active_profile_index: 0,
        exporter: format!("memory-tracer {}", env!("CARGO_PKG_VERSION")),
    };
    let mut w = std::io::BufWriter::new(out);
    serde_json::to_writer(&mut w, &file)?;
    w.write_all(b"\n")?;
    w.flush()?;
    Ok(())
}
