//! The memory a snapshot says exists when it was taken: its root's two lists, and the final
//! segments and blocks (`segments`, `host_segments`) from which the start state is recovered.

use super::budget::WalkBudget;
use super::extras::Extras;
use super::view::View;
use super::HOST_DEVICE;
use crate::allocator::SMALL_SEGMENT_BYTES;
use crate::import::pickle::{Pickle, Value, ValueId};
use crate::import::ImportError;
use crate::model::Pool;

/// The two keys a snapshot's root dict must have.
pub(super) struct RootIds {
    pub(super) segments: ValueId,
    pub(super) device_traces: ValueId,
}

impl RootIds {
    /// Takes the parsed pickle; gives its `segments` and `device_traces`, or what was found
    /// instead of a snapshot.
    pub(super) fn find(p: &Pickle) -> Result<Self, ImportError> {
        let root = p.root;
        let Value::Dict(items) = p.get(root) else {
            return Err(ImportError::NotASnapshot { found: format!("a pickled {}", p.get(root).type_name()) });
        };
        let (Some(segments), Some(device_traces)) = (p.dict_get(root, "segments"), p.dict_get(root, "device_traces")) else {
            let keys: Vec<String> = items
                .iter()
                .take(8)
                .map(|(k, _)| match p.get(*k) {
                    Value::Str(s) => format!("'{s}'"),
                    other => other.type_name().to_owned(),
                })
                .collect();
            return Err(ImportError::NotASnapshot { found: format!("a dict with keys [{}]", keys.join(", ")) });
        };
        Ok(Self { segments, device_traces })
    }
}

/// A segment of the final state (`segments`).
pub(super) struct FinalSeg {
    pub(super) address: u64,
    pub(super) size: u64,
    pub(super) device: usize,
    pub(super) stream: i64,
    pub(super) pool: Pool,
    /// Its private pool (index into [`Extras::pools`]), from `segment_pool_id`.
    pub(super) private_pool: Option<u16>,
    pub(super) blocks: Vec<FinalBlock>,
}

/// A block of a final segment.
pub(super) struct FinalBlock {
    pub(super) address: u64,
    pub(super) size_bytes: u64,
    /// Taken (its state is `active_*`).
    pub(super) active: bool,
    /// Freed, waiting for other streams (`active_pending_free`): not counted as allocated.
    pub(super) pending: bool,
}

/// Takes the `segments` list (or `host_segments`, when `host`); gives the final state it
/// describes.
pub(super) fn final_segments(
    v: &View,
    segments_id: ValueId,
    host: bool,
    extras: &mut Extras,
    budget: &mut WalkBudget,
) -> Result<Vec<FinalSeg>, ImportError> {
    let mut finals = Vec::new();
    let name = if host { "host_segments" } else { "segments" };
    for (i, &s) in v.list(segments_id, name)?.iter().enumerate() {
        let path = format!("{name}[{i}]");
        budget.charge(v, s, &path)?;
        let address = v.size(s, "address", &path)?;
        let size = v.size(s, "total_size", &path)?;
        let device = if host { HOST_DEVICE as u64 } else { v.size(s, "device", &path)? };
        if !host && device >= HOST_DEVICE as u64 {
            return Err(v.err(&format!("{path}.device"), format!("device index {device} is out of range (at most {})", HOST_DEVICE - 1)));
        }
        let device = device as usize;
        let stream = v.opt_int(s, "stream").unwrap_or(0);
        let pool = match v.opt_str(s, "segment_type") {
            Some("small") => Pool::Small,
            Some("large") => Pool::Large,
            _ => pool_for_segment(size),
        };
        let private_pool = v.p.dict_get(s, "segment_pool_id").and_then(|id| extras.segment_pool(&v.p.arena, id));
        let mut blocks = Vec::new();
        let blocks_id = v.field(s, "blocks", &path)?;
        for (j, &b) in v.list(blocks_id, &format!("{path}.blocks"))?.iter().enumerate() {
            let bpath = format!("{path}.blocks[{j}]");
            budget.charge(v, b, &bpath)?;
            let state = v.str(b, "state", &bpath)?;
            let address = v.opt_int(b, "address").map(|a| a as u64);
            let size_bytes = v.size(b, "size", &bpath)?;
            // Older snapshots omit block addresses; blocks are contiguous from the segment start.
            let address = address.unwrap_or_else(|| address_from_previous(&blocks, s, v));
            blocks.push(FinalBlock { address, size_bytes, active: state.starts_with("active"), pending: state == "active_pending_free" });
        }
        finals.push(FinalSeg { address, size, device, stream, pool, private_pool, blocks });
    }
    Ok(finals)
}

fn address_from_previous(blocks: &[FinalBlock], seg: ValueId, v: &View) -> u64 {
    match blocks.last() {
        Some(b) => b.address.saturating_add(b.size_bytes),
        None => v.opt_int(seg, "address").unwrap_or(0) as u64,
    }
}

/// The pool of a segment that names none, by its size: the small pool's segments are 2 MiB.
pub(super) fn pool_for_segment(size: u64) -> Pool {
    if size == SMALL_SEGMENT_BYTES {
        Pool::Small
    } else {
        Pool::Large
    }
}
