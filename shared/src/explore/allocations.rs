//! Live allocations for the page: the largest at a moment, or one by its event, each with its
//! lifetime, layer, operator, stack, pool, holders and notes.

use super::{Response, Session};
use crate::analysis;
use crate::model::EventType;
use serde::{Deserialize, Serialize};

/// One live allocation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Allocation {
    pub event_index: usize,
    pub address: u64,
    pub size_bytes: u64,
    pub alloc_s: f64,
    /// `None`: never freed in the trace.
    pub free_s: Option<f64>,
    pub layer: Option<String>,
    pub op: Option<String>,
    /// Frames, innermost first.
    pub stack: Vec<String>,
    /// The positions in `stack` of the frames shown by default: the program's, not the
    /// runtime's ([`crate::model::shown_frames`]).
    #[serde(default)]
    pub shown: Vec<u32>,
    /// The private pool it came from (`(0, 1)`); `None` for the default pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// Annotations, user metadata and allocator tags attached to it, as `kind: text`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Its user metadata decoded, when the text is JSON (what `_set_memory_metadata` writes
    /// for a dict).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_metadata: Option<serde_json::Value>,
    /// Who held it, as recorded (`parameter weight in layer1.0.conv1 from 0.12 s`), in the order
    /// they took it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<String>,
}

impl Session {
    /// One allocation event with its free (from the pairs when made, else a scan forward).
    pub(super) fn allocation_at(&self, i: usize) -> Response {
        let ev = &self.trace().events;
        if i >= ev.len() || ev.event_type(i) != EventType::Alloc {
            return Response::Error { message: format!("event {i} is not an allocation") };
        }
        let free = match &self.pairs {
            Some(p) if p.device == ev.device[i] => {
                let k = p.spans.partition_point(|&(a, _)| (a as usize) < i);
                p.spans.get(k).filter(|s| s.0 as usize == i && s.1 != u32::MAX).map(|s| s.1 as usize)
            }
            _ => (i + 1..ev.len())
                .find(|&j| ev.device[j] == ev.device[i] && ev.address[j] == ev.address[i] && ev.event_type(j) == EventType::Free),
        };
        let t_s = self.secs(ev.ts_ns[i]);
        Response::Allocations { t_s, allocations: vec![self.allocation(i, free.map(|j| self.secs(ev.ts_ns[j])))] }
    }

    pub(super) fn allocations(&self, t_s: f64, limit: usize) -> Vec<Allocation> {
        let ev = &self.trace().events;
        let Some(idx) = self.event_at(t_s) else { return Vec::new() };
        let mut live = analysis::live_allocations_at(self.trace(), idx);
        live.retain(|&i| ev.device[i] == self.device);
        live.sort_by_key(|&i| (std::cmp::Reverse(ev.size_bytes[i]), i));
        live.truncate(limit.min(1000));
        // Their frees: one pass forward from the moment.
        let mut want: std::collections::HashMap<u64, usize> = live.iter().map(|&i| (ev.address[i], i)).collect();
        let mut freed: std::collections::HashMap<usize, f64> = std::collections::HashMap::new();
        for j in idx + 1..ev.len() {
            if want.is_empty() {
                break;
            }
            if ev.device[j] == self.device && ev.event_type(j) == EventType::Free {
                if let Some(i) = want.remove(&ev.address[j]) {
                    freed.insert(i, self.secs(ev.ts_ns[j]));
                }
            }
        }
        live.into_iter().map(|i| self.allocation(i, freed.get(&i).copied())).collect()
    }

    /// Allocation event `i` for the page: size, lifetime, layer, operator and stack.
    fn allocation(&self, i: usize, free_s: Option<f64>) -> Allocation {
        let ev = &self.trace().events;
        let frames: Vec<_> = self.trace().stacks.stack_of_event(i).map(|s| self.trace().stacks.stack(s).collect()).unwrap_or_default();
        Allocation {
            event_index: i,
            address: ev.address[i],
            size_bytes: ev.size_bytes[i],
            alloc_s: self.secs(ev.ts_ns[i]),
            free_s,
            layer: self.trace().opt_str(ev.layer[i]).map(str::to_owned),
            op: self.ops_at_event.get(i).and_then(|&o| self.trace().opt_str(o)).map(str::to_owned),
            stack: frames.iter().map(|f| format!("{} {}:{}", self.trace().str(f.name), self.trace().str(f.filename), f.line)).collect(),
            shown: crate::model::shown_frames(frames.iter().map(|f| (self.trace().str(f.name), self.trace().str(f.filename)))),
            pool: self.trace().event_pool(i).and_then(|p| self.trace().pools.get(p as usize)).map(ToString::to_string),
            holders: self
                .trace()
                .holders_of(i)
                .iter()
                .map(|h| {
                    let until = h.released_ns.map(|r| format!(" to {:.3} s", self.secs(r))).unwrap_or_default();
                    format!("{} from {:.3} s{until}", self.trace().describe_holder(h), self.secs(h.taken_ns))
                })
                .collect(),
            notes: self
                .trace()
                .notes_of(i)
                .iter()
                .map(|n| {
                    let kind = match n.kind {
                        crate::model::NoteKind::Annotation => "annotation",
                        crate::model::NoteKind::UserMetadata => "user metadata",
                        crate::model::NoteKind::Internal => "allocator",
                    };
                    format!("{kind}: {}", self.trace().str(n.text))
                })
                .collect(),
            user_metadata: self
                .trace()
                .notes_of(i)
                .iter()
                .filter(|n| n.kind == crate::model::NoteKind::UserMetadata)
                .find_map(|n| serde_json::from_str::<serde_json::Value>(self.trace().str(n.text)).ok())
                .filter(|v| v.is_object() || v.is_array()),
        }
    }
}
