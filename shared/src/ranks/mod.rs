//! The ranks of a distributed job: which rank a file holds, the ranks' traces merged into one
//! trace, and one rank taken back out of it.
//!
//! - `files.rs`: which rank a file holds ([`rank_of`]), for merging one file per rank.
//! - `merge.rs`: the ranks' traces joined into one ([`merge::merge_with`]), each taken in
//!   through [`merge::MergeInput::of`].
//! - `split.rs`: the ranks a merged trace holds ([`ranks`]) and one as a trace of its own
//!   ([`rank_trace`]).
//! - `carry.rs`: what merging and cutting share: thread ids that carry their rank, pools, notes
//!   and holders carried over to another trace's events ([`carry_event_extras`]).
//!
//! Merging sits above the analyses (it aligns ranks on their first iteration), which cut ranks
//! out: `merge` is a layer of its own (`xtask/src/layers.rs`), named by its path.

mod carry;
mod files;
pub mod merge;
mod split;

pub use carry::{carry_event_extras, pool_map, IdMap};
pub use files::{assign_ranks, rank_of};
pub use split::{rank_trace, ranks};
