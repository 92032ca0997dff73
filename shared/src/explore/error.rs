//! Why the explorer could not open a file or answer a question ([`ExploreError`]), and why files
//! could not be opened as the ranks of one job ([`RanksError`]).

use crate::analysis::sweep::SweepError;
use crate::ranks::merge::MergeError;
use crate::whatif::ConfError;
use crate::ImportError;

/// Why a file could not be opened, compared or replayed.
#[derive(Debug, thiserror::Error)]
pub enum ExploreError {
    /// The file is no trace the importers read.
    #[error(transparent)]
    Import(#[from] ImportError),
    /// The file looked like a sweep and is not one.
    #[error(transparent)]
    Sweep(#[from] SweepError),
    #[error("reading {file_name} failed: {source}")]
    Read { file_name: String, source: std::io::Error },
    /// A rank asked for ([`super::Request::ShowRank`]) that the trace does not have.
    #[error("this trace has no rank {rank}: expected one of {known:?}")]
    NoRank { rank: u32, known: Vec<u32> },
    #[error("{file_name} is a batch sweep (curves only); expected a trace to compare with")]
    SweepToCompare { file_name: String },
    /// The shown trace made no allocator requests to replay.
    #[error("no requests")]
    NoRequests,
    /// A `PYTORCH_CUDA_ALLOC_CONF` that does not parse, or that the allocator model cannot
    /// replay.
    #[error(transparent)]
    AllocConf(#[from] ConfError),
    /// `device` (its name) is not a CUDA device's caching allocator.
    #[error("{device} is not a CUDA device's caching allocator: nothing to replay")]
    NotCaching { device: String },
}

/// Why files could not be opened as the ranks of one job.
#[derive(Debug, thiserror::Error)]
pub enum RanksError {
    #[error("{file_name}: {message}")]
    File { file_name: String, message: String },
    /// The files were recorded far apart in time: merging them is possible when asked.
    #[error(
        "{a} ({a_span}) and {b} ({b_span}) were recorded at different times, so they are not ranks of one run; \
         expected the files of one run (or merge them anyway)"
    )]
    Disjoint { a: String, a_span: String, b: String, b_span: String },
    #[error(transparent)]
    Merge(MergeError),
}

impl RanksError {
    /// True when merging with `allow_disjoint` would succeed past this error.
    pub fn can_merge_anyway(&self) -> bool {
        matches!(self, RanksError::Disjoint { .. })
    }
}

impl From<MergeError> for RanksError {
    fn from(e: MergeError) -> Self {
        match e {
            MergeError::Disjoint { a, a_span, b, b_span } => RanksError::Disjoint { a, a_span, b, b_span },
            other => RanksError::Merge(other),
        }
    }
}
