//! Finding allocations: by address (hex, anywhere inside the block), by stack frame or
//! `file:line`, by module path, or by the text of their user metadata and annotations, as
//! memory_viz searches a snapshot.

use crate::model::{EventType, StrId, Trace};
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
    let ev = &trace.events;
    let start = trace.start_ns();
    let mut matcher = Matcher::new(trace, &q.to_lowercase());
    let mut out = FindResult { query: q.to_owned(), total: 0, matches: Vec::new(), events: Vec::new() };
    if q.is_empty() {
        return out;
    }
    for i in 0..ev.len() {
        if ev.event_type(i) != EventType::Alloc {
            continue;
        }
        let hit = match address {
            Some(a) => (ev.address[i] <= a && a < ev.address[i].saturating_add(ev.size_bytes[i].max(1))).then_some(Hit::Address),
            None => matcher.hit(i),
        };
        let Some(hit) = hit else { continue };
        out.total += 1;
        if out.events.len() < MAX_HIGHLIGHTED {
            out.events.push(i as u32);
        }
        if out.matches.len() < limit {
            let (by, text) = matcher.describe(hit, i);
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

/// What matched an allocation, resolved to text only for the matches listed.
#[derive(Clone, Copy)]
enum Hit {
    Address,
    Layer(StrId),
    /// The stack's matching frame (in [`Matcher::stacks`]).
    Stack(u32),
    Note(StrId),
}

/// Text matching with what was decided cached: each string and each stack is looked at once
/// (a trace repeats its layers and stacks over millions of events).
struct Matcher<'t> {
    trace: &'t Trace,
    needle: String,
    /// By string id: 0 not looked at, 1 no, 2 contains the needle.
    strings: Vec<u8>,
    /// By stack: its first frame (`name file:line`) containing the needle, once looked at.
    stacks: Vec<Option<Option<String>>>,
}

impl<'t> Matcher<'t> {
    fn new(trace: &'t Trace, needle: &str) -> Self {
        Self { trace, needle: needle.to_owned(), strings: vec![0; trace.strings.len()], stacks: vec![None; trace.stacks.stacks.len()] }
    }

    fn has(&mut self, id: StrId) -> bool {
        let Some(slot) = self.strings.get_mut(id.0 as usize).filter(|_| !id.is_none()) else { return false };
        if *slot == 0 {
            *slot = if self.trace.str(id).to_lowercase().contains(&self.needle) { 2 } else { 1 };
        }
        *slot == 2
    }

    /// Allocation `i`'s layer, stack frame or note that contains the needle.
    fn hit(&mut self, i: usize) -> Option<Hit> {
        let trace = self.trace;
        let layer = trace.events.layer[i];
        if self.has(layer) {
            return Some(Hit::Layer(layer));
        }
        let needle = &self.needle;
        if let Some(s) = trace.stacks.stack_of_event(i) {
            let frame = self.stacks[s as usize].get_or_insert_with(|| {
                trace
                    .stacks
                    .stack(s)
                    .map(|f| format!("{} {}:{}", trace.str(f.name), trace.str(f.filename), f.line))
                    .find(|f| f.to_lowercase().contains(needle.as_str()))
            });
            if frame.is_some() {
                return Some(Hit::Stack(s));
            }
        }
        trace.notes_of(i).iter().map(|n| n.text).find(|&t| self.has(t)).map(Hit::Note)
    }

    /// How allocation `i` matched, and the text that did.
    fn describe(&self, hit: Hit, i: usize) -> (MatchedBy, String) {
        let t = self.trace;
        match hit {
            Hit::Address => (MatchedBy::Address, format!("0x{:x}", t.events.address[i])),
            Hit::Layer(id) => (MatchedBy::Layer, t.str(id).to_owned()),
            Hit::Stack(s) => (MatchedBy::Stack, self.stacks[s as usize].clone().flatten().unwrap_or_default()),
            Hit::Note(id) => (MatchedBy::Note, t.str(id).to_owned()),
        }
    }
}
