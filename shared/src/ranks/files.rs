//! Which rank of a distributed job a file holds, for merging one file per rank (`collector
//! merge` and the viewer's drop of several files): the rank the traced process recorded
//! (`RANK`), else `rank<N>` in the file name, else the file's position among those given.

use crate::model::{RankVar, Trace};

/// The rank `trace` says it is ([`RankVar::Rank`]), else the number after `rank` in
/// `file_name` (`rank3.pickle`, `snapshot_rank_12.pickle`, `Rank-0.json`; any folders before
/// the name are ignored). `None` when neither says.
pub fn rank_of(trace: &Trace, file_name: &str) -> Option<u32> {
    if let Some(r) = trace.meta.rank_var(RankVar::Rank) {
        return u32::try_from(r).ok();
    }
    let base = file_name.rsplit(['/', '\\']).next().unwrap_or(file_name).to_ascii_lowercase();
    let at = base.find("rank")? + "rank".len();
    let digits: String = base[at..].chars().skip_while(|c| *c == '_' || *c == '-').take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The rank of each of `files` (name, trace), in order: [`rank_of`], else its position.
pub fn assign_ranks<'a>(files: impl IntoIterator<Item = (&'a str, &'a Trace)>) -> Vec<u32> {
    files.into_iter().enumerate().map(|(k, (name, trace))| rank_of(trace, name).unwrap_or(k as u32)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{SourceFormat, TraceMeta};

    fn trace() -> Trace {
        Trace::new(TraceMeta::new(SourceFormat::PytorchSnapshot))
    }

    #[test]
    fn file_names_give_ranks() {
        let t = trace();
        assert_eq!(rank_of(&t, "rank3.pickle"), Some(3));
        assert_eq!(rank_of(&t, "snapshot_RANK_12.pickle"), Some(12));
        assert_eq!(rank_of(&t, "runs/rank7/trace-rank-1.json"), Some(1));
        assert_eq!(rank_of(&t, "snapshot.pickle"), None);
        assert_eq!(rank_of(&t, "ranked.pickle"), None);
    }

    #[test]
    fn a_recorded_rank_wins_and_positions_fill_in() {
        let mut recorded = trace();
        recorded.meta.report_rank_var(RankVar::Rank, 5);
        assert_eq!(rank_of(&recorded, "rank0.pickle"), Some(5));
        let plain = trace();
        assert_eq!(assign_ranks([("a.pickle", &plain), ("rank1.pickle", &plain), ("c.pickle", &recorded)]), [0, 1, 5]);
    }
}
