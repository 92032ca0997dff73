//! Holders joined to the allocations they hold (`collector trace --holders`), and who saved
//! each tensor for backward.

use super::{device_of, scope_of_sequence, Captured, OpTmp, SeqScope, Strings};
use crate::layout::MtHolder;
use shared::model::{EventHolder, EventType, HolderKind};
use shared::Trace;
use std::collections::HashMap;

/// Each holder joined to the allocation live at its address when it took or let go of it (a
/// pending free: the allocation last freed there).
/// A saved tensor's holder is named by the forward operator that made its autograd node, and
/// its module is that operator's (else the scope's whose forward made the node); it holds the
/// block from when the node was made, not from the look that found it.
pub(super) fn push_holders(trace: &mut Trace, strings: &mut Strings, c: &Captured, savers: &Savers) {
    if c.holders.is_empty() {
        return;
    }
    let rel = |ts: u64| ts.saturating_sub(c.start_ns);
    let mut order: Vec<&MtHolder> = c.holders.iter().collect();
    order.sort_by_key(|h| h.ts_ns);
    let mut live: HashMap<(u8, u64), u32> = HashMap::new();
    // The block last freed at each address: a pending free's (its free waits for another stream).
    let mut freed: HashMap<(u8, u64), u32> = HashMap::new();
    let mut open: HashMap<(u32, u8, u32, u32), usize> = HashMap::new();
    let mut out: Vec<EventHolder> = Vec::new();
    let (mut next, mut unmatched) = (0usize, 0u64);
    for h in order {
        let t = rel(h.ts_ns);
        let ev = &trace.events;
        while next < ev.len() && ev.ts_ns[next] <= t {
            match ev.event_type(next) {
                EventType::Alloc => {
                    let key = (ev.device[next], ev.address[next]);
                    freed.remove(&key);
                    live.insert(key, next as u32);
                }
                EventType::Free => {
                    let key = (ev.device[next], ev.address[next]);
                    if let Some(event) = live.remove(&key) {
                        freed.insert(key, event);
                    }
                }
                _ => {}
            }
            next += 1;
        }
        let device = device_of(h.device_type, h.device_index);
        let Some(kind) = HolderKind::from_code(h.kind) else { continue };
        // A pending free's block was freed by the program already: the one last freed there.
        let blocks = if kind == HolderKind::PendingFree { &freed } else { &live };
        let block = trace.devices.iter().position(|d| *d == device).and_then(|d| blocks.get(&(d as u8, h.ptr)).copied());
        let Some(event) = block else {
            // A pending free let go of once its block was taken again: the reuse ended it.
            if !(kind == HolderKind::PendingFree && h.take == 0) {
                unmatched += 1;
            }
            continue;
        };
        let key = (event, h.kind, h.name, h.module);
        if h.take == 0 {
            if let Some(k) = open.remove(&key) {
                out[k].released_ns = Some(t);
            }
            continue;
        }
        let (mut name, mut module) = (h.name, h.module);
        if let Some((op, layer)) = savers.of(h.seq).filter(|_| kind == HolderKind::SavedForBackward) {
            (name, module) = (if op != 0 { op } else { name }, if layer != 0 { layer } else { module });
        }
        let (name, module) = (strings.get(trace, name), strings.get(trace, module));
        // Saved tensors are found by a look at the backward's start, but were held since their
        // node was made in the forward (or since the block's allocation, if later; the block's
        // allocation where the node's operator was not recorded).
        // Gradients and optimizer state are found when the backward or step ends, but were
        // held since their allocation if that step made them (autograd's output for the
        // parameter, the state's first zeros).
        let allocated = trace.events.ts_ns[event as usize];
        let taken_ns = match kind {
            HolderKind::SavedForBackward => t.min(savers.made_at(h.seq).map_or(allocated, |m| m.max(allocated))),
            HolderKind::Gradient | HolderKind::OptimizerState if h.seq >= 0 && allocated >= rel(h.seq as u64) => allocated.min(t),
            _ => t,
        };
        open.insert(key, out.len());
        out.push(EventHolder { event, kind, name, module, taken_ns, released_ns: None });
    }
    out.sort_by_key(|h| (h.event, h.taken_ns));
    trace.event_holders = out;
    if unmatched > 0 {
        trace.meta.warnings.push(format!(
            "{unmatched} holder records named no allocation live at their address (storages allocated before the trace, or whose allocation was dropped)"
        ));
    }
}

/// Who saved tensors for backward, by autograd sequence number: the forward operator that
/// made the node and its layer (the shim's string ids; 0: unknown), else the scope whose
/// forward made it.
pub(super) struct Savers<'a> {
    /// Sequence number → the forward operator that made the node, its layer, and its start.
    by_op: HashMap<i64, (u32, u32, u64)>,
    seq_scopes: &'a HashMap<u64, Vec<SeqScope>>,
}

impl Savers<'_> {
    fn of(&self, seq: i64) -> Option<(u32, u32)> {
        if seq < 0 {
            return None;
        }
        self.by_op
            .get(&seq)
            .map(|&(op, layer, _)| (op, layer))
            .or_else(|| self.seq_scopes.values().find_map(|l| scope_of_sequence(Some(l), seq)).map(|s| (0, s)))
    }

    /// When the node of sequence number `seq` was made, where its forward operator was recorded.
    fn made_at(&self, seq: i64) -> Option<u64> {
        self.by_op.get(&seq).map(|&(_, _, start)| start)
    }
}

pub(super) fn savers<'a>(ops: &[OpTmp], layer: &[u32], seq_scopes: &'a HashMap<u64, Vec<SeqScope>>) -> Savers<'a> {
    let mut by_op: HashMap<i64, (u32, u32, u64)> = HashMap::new();
    for (k, o) in ops.iter().enumerate() {
        // Later entries are inner operators sharing the number; the innermost made the node.
        if !o.backward_node && o.seq_nr >= 0 {
            by_op.insert(o.seq_nr, (o.name, layer.get(k).copied().unwrap_or(0), o.start_ns));
        }
    }
    Savers { by_op, seq_scopes }
}
