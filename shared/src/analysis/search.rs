//! Finding allocations: by address (hex, anywhere inside the block), by stack frame or
//! `file:line`, by module path, or by the text of their user metadata and annotations, as
//! memory_viz searches a snapshot.

use crate::model::{EventType, Trace};
use serde::{Deserialize, Serialize};

/// Why an allocation matched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MatchedBy {
    /// The address lies inside the block.
    Address,
    /// Its module path (layer).
    Layer,
    /// A frame of its stack (`name file:line`).
    Stack,
    /// Its user metadata, annotation or allocator tag.
    Note,
}

/// One allocation found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Found {
    pub event_index: usize,
    /// Seconds since the trace's start.
    pub t_s: f64,
    pub size_bytes: u64,
    pub address: u64,
    pub device: String,
    pub layer: Option<String>,
    pub by: MatchedBy,
    /// What matched: the frame, the layer or the note's text.
    pub text: String,
}

/// What a search found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FindResult {
    pub query: String,
    /// Every allocation that matches.
    pub total: usize,
    /// The first `limit`, in time order.
    pub matches: Vec<Found>,
    /// Every matching allocation's event index, in order (for highlighting), up to
    /// [`MAX_HIGHLIGHTED`].
    pub events: Vec<u32>,
}

/// Most event indices a search answers with.
pub const MAX_HIGHLIGHTED: usize = 200_000;

/// The allocations `query` finds. A query of `0x` and hex digits is an address (the block
/// holding it); anything else is looked for, case-insensitively, in the module path, the stack
/// frames (`name file:line`) and the notes of each allocation.
pub fn find(trace: &Trace, query: &str, limit: usize) -> FindResult {
    let q = query.trim();
    let address = q.strip_prefix("0x").or_else(|| q.strip_prefix("0X")).and_then(|h| u64::from_str_radix(h, 16).ok());
    let needle = q.to_lowercase();
    let ev = &trace.events;
    let start = trace.start_ns();
    // Each stack's matching frame, decided once per stack.
    let mut stack_hit: Vec<Option<Option<String>>> = vec![None; trace.stacks.stacks.len()];
    let mut out = FindResult { query: q.to_owned(), total: 0, matches: Vec::new(), events: Vec::new() };
    if q.is_empty() {
        return out;
    }
    for i in 0..ev.len() {
        if ev.event_type(i) != EventType::Alloc {
            continue;
        }
        let hit = match address {
            Some(a) => (ev.address[i] <= a && a < ev.address[i].saturating_add(ev.size_bytes[i].max(1)))
                .then(|| (MatchedBy::Address, format!("0x{:x}", ev.address[i]))),
            None => match_text(trace, i, &needle, &mut stack_hit),
        };
        let Some((by, text)) = hit else { continue };
        out.total += 1;
        if out.events.len() < MAX_HIGHLIGHTED {
            out.events.push(i as u32);
        }
        if out.matches.len() < limit {
            out.matches.push(Found {
                event_index: i,
                t_s: ev.ts_ns[i].saturating_sub(start) as f64 * 1e-9,
                size_bytes: ev.size_bytes[i],
                address: ev.address[i],
                device: trace.devices.get(ev.device[i] as usize).map(ToString::to_string).unwrap_or_default(),
                layer: trace.opt_str(ev.layer[i]).map(str::to_owned),
                by,
                text,
            });
        }
    }
    out
}

/// Allocation `i`'s layer, stack frame or note that contains `needle` (lower case).
fn match_text(trace: &Trace, i: usize, needle: &str, stack_hit: &mut [Option<Option<String>>]) -> Option<(MatchedBy, String)> {
    let contains = |s: &str| s.to_lowercase().contains(needle);
    if let Some(layer) = trace.opt_str(trace.events.layer[i]).filter(|l| contains(l)) {
        return Some((MatchedBy::Layer, layer.to_owned()));
    }
    if let Some(s) = trace.stacks.stack_of_event(i) {
        let hit = stack_hit[s as usize].get_or_insert_with(|| {
            trace.stacks.stack(s).map(|f| format!("{} {}:{}", trace.str(f.name), trace.str(f.filename), f.line)).find(|f| contains(f))
        });
        if let Some(frame) = hit {
            return Some((MatchedBy::Stack, frame.clone()));
        }
    }
    trace.notes_of(i).iter().map(|n| trace.str(n.text)).find(|t| contains(t)).map(|t| (MatchedBy::Note, t.to_owned()))
}
