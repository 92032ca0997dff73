//! What walking the snapshot may cost, so that shared references cannot make a few bytes of
//! pickle expand into more segments, blocks and entries than its length allows.

use super::view::{Loc, View};
use crate::import::pickle::{Value, ValueId};
use crate::import::ImportError;

/// What walking the snapshot may cost: one unit per segment, block, trace entry and
/// annotation and one per item of their dicts. Without shared references each unit has bytes
/// of its own (a dict is at least one opcode, an item at least two), so a budget of the input's
/// length never refuses a real snapshot; with them (`[L]*N`, a list referenced N times through
/// the memo) a few bytes would expand to N copies of L, and are counted as such.
pub(super) struct WalkBudget {
    left: usize,
    input_bytes: usize,
}

impl WalkBudget {
    /// A budget of one unit per byte of a pickle of `input_bytes`.
    pub(super) fn new(input_bytes: usize) -> Self {
        Self { left: input_bytes, input_bytes }
    }

    pub(super) fn charge(&mut self, v: &View, id: ValueId, path: &(impl Loc + ?Sized)) -> Result<(), ImportError> {
        let items = match v.p.get(id) {
            Value::Dict(d) => d.len(),
            _ => 0,
        };
        self.charge_items(items, path)
    }

    pub(super) fn charge_items(&mut self, items: usize, path: &(impl Loc + ?Sized)) -> Result<(), ImportError> {
        match self.left.checked_sub(1 + items) {
            Some(left) => {
                self.left = left;
                Ok(())
            }
            None => Err(ImportError::Snapshot {
                path: path.loc(),
                reason: format!(
                    "the snapshot's shared references expand to more segments, blocks and entries than a pickle of {} bytes can hold; expected each to be its own object",
                    self.input_bytes
                ),
            }),
        }
    }
}
