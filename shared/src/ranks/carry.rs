//! What merging ranks and cutting one back out share: thread ids that carry their rank, and
//! an event's pools, notes, requested sizes and holders carried over to another trace's events.

use crate::model::{StrId, Trace};

/// Threads of different processes get distinct ids: the rank goes in the top bits.
pub(super) fn thread_of(rank: u32, thread: u64) -> u64 {
    (u64::from(rank) + 1) << 48 | (thread & ((1 << 48) - 1))
}

/// The rank a merged thread id belongs to.
pub(super) fn rank_of_thread(thread: u64) -> Option<u32> {
    u32::try_from(thread >> 48).ok()?.checked_sub(1)
}

/// How one trace's strings and stacks appear in another.
pub trait IdMap {
    fn text(&mut self, out: &mut Trace, id: StrId) -> StrId;
    fn stack(&mut self, out: &mut Trace, stack: u32) -> u32;
    /// A time on the other trace's clock (merged ranks are shifted onto one).
    fn time(&self, ts_ns: u64) -> u64 {
        ts_ns
    }
}

/// Each of `src`'s pools as an index into `out`'s, added there if new: pools are one by id.
pub fn pool_map(out: &mut Trace, src: &Trace) -> Vec<u16> {
    src.pools
        .iter()
        .map(|id| match out.pools.iter().position(|p| p == id) {
            Some(k) => k as u16,
            None => {
                out.pools.push(*id);
                (out.pools.len() - 1) as u16
            }
        })
        .collect()
}

/// Appends to `out` the pools, notes, requested sizes and holders of `src`'s events, where event `i`
/// of `src` became `new_index(i)` (`None`: left out), with strings and stacks mapped by `ids`.
/// Pools are shared by id (a device tells two processes' apart). Leaves the lists unsorted.
pub fn carry_event_extras(out: &mut Trace, src: &Trace, new_index: &dyn Fn(u32) -> Option<u32>, ids: &mut dyn IdMap) {
    let pools = pool_map(out, src);
    for &(e, p) in &src.event_pools {
        if let (Some(n), Some(&p)) = (new_index(e), pools.get(p as usize)) {
            out.event_pools.push((n, p));
        }
    }
    for note in &src.event_notes {
        if let Some(n) = new_index(note.event) {
            let stack = note.stack.map(|s| ids.stack(out, s));
            let text = ids.text(out, note.text);
            let ts_ns = ids.time(note.ts_ns);
            out.event_notes.push(crate::model::EventNote { event: n, text, stack, ts_ns, ..*note });
        }
    }
    out.event_requested.extend(src.event_requested.iter().filter_map(|&(e, bytes)| Some((new_index(e)?, bytes))));
    for h in &src.event_holders {
        if let Some(event) = new_index(h.event) {
            let (name, module) = (ids.text(out, h.name), ids.text(out, h.module));
            let (taken_ns, released_ns) = (ids.time(h.taken_ns), h.released_ns.map(|t| ids.time(t)));
            out.event_holders.push(crate::model::EventHolder { event, name, module, taken_ns, released_ns, ..*h });
        }
    }
}
