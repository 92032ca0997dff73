//! Memory over time: the timeline of a window, the state at a moment, the Active Memory
//! Timeline's bands, and one curve per rank.

use super::overview::duration_s;
use super::{Response, Session};
use crate::analysis::{self, TimelineOptions, TimelinePoint};
use crate::model::Phase;
use serde::{Deserialize, Serialize};

/// The state at one moment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Moment {
    pub t_s: f64,
    /// The last event at or before `t_s`.
    pub event_index: Option<usize>,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    pub layer: Option<String>,
    pub op: Option<String>,
    pub phase: Option<Phase>,
}

/// One rank device's allocated memory over the whole merged trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankCurve {
    pub device_index: u8,
    pub rank: u32,
    pub device: String,
    #[serde(with = "analysis::timeline_columns")]
    pub points: Vec<TimelinePoint>,
}

impl Session {
    pub(super) fn timeline(&self, start_s: f64, end_s: f64, buckets: usize) -> Response {
        let buckets = buckets.clamp(1, 20_000);
        let options =
            TimelineOptions { device: Some(self.device), ..TimelineOptions::default() }.with_buckets(buckets).with_window(start_s, end_s);
        let points = match &self.index {
            Some(index) => index.timeline(self.trace(), &options),
            None => analysis::timeline(self.trace(), &options),
        };
        let start = self.trace().start_ns();
        let driver = self
            .trace()
            .device_samples
            .iter()
            .filter(|s| s.device == self.device)
            .map(|s| (s.ts_ns.saturating_sub(start) as f64 * 1e-9, s.used_bytes))
            .filter(|&(t, _)| t >= start_s && t <= end_s)
            .collect();
        let buckets: Vec<(f64, f64)> = (0..points.len()).map(|i| (points[i].t_s, points.get(i + 1).map_or(end_s, |p| p.t_s))).collect();
        let ledger = analysis::ledger::ledger_bands(self.trace(), self.device, &buckets);
        Response::Timeline { start_s, end_s, points, driver, ledger }
    }

    pub(super) fn moment(&self, t_s: f64) -> Moment {
        let ev = &self.trace().events;
        let idx = self.event_at(t_s);
        let totals = match idx {
            Some(i) => ev.totals_at(i),
            None => ev.base_totals.get(self.device as usize).copied().unwrap_or_default(),
        };
        let ts = self.trace().start_ns().saturating_add((t_s.max(0.0) * 1e9) as u64);
        // The innermost scope and op around the moment itself (not around the last event).
        let layer = self
            .trace()
            .scopes
            .iter()
            .filter(|s| s.start_ns <= ts && ts < s.end_ns && !s.name.is_none())
            .max_by_key(|s| (s.depth, s.start_ns))
            .map(|s| self.trace().str(s.name).to_owned())
            .or_else(|| idx.and_then(|i| self.trace().opt_str(ev.layer[i])).map(str::to_owned));
        let op = self
            .trace()
            .ops
            .iter()
            .filter(|o| o.start_ns <= ts && ts < o.end_ns)
            .max_by_key(|o| o.start_ns)
            .map(|o| self.trace().str(o.name).to_owned());
        Moment {
            t_s,
            event_index: idx,
            allocated_bytes: totals.allocated_bytes,
            reserved_bytes: totals.reserved_bytes,
            layer,
            op,
            phase: idx.map(|i| ev.phase(i)),
        }
    }

    pub(super) fn active(&mut self, start_s: f64, end_s: f64, columns: usize) -> Response {
        let device = self.device;
        if self.pairs.as_ref().is_none_or(|p| p.device != device) {
            self.pairs = Some(analysis::active::Pairs::of(self.trace(), device));
        }
        let Some(pairs) = &self.pairs else { return Response::Error { message: "no allocations".into() } };
        let options = analysis::active::ActiveOptions { start_s, end_s, columns };
        let labels = analysis::active::Labels { ops_at_event: &self.ops_at_event, categories: &self.categories };
        let a = analysis::active::active_timeline(self.trace(), pairs, self.index.as_ref(), &labels, &options);
        Response::Active(Box::new(a))
    }

    pub(super) fn rank_curves(&self, buckets: usize) -> Response {
        let whole = &self.whole;
        let end_s = duration_s(whole);
        let options = TimelineOptions::default().with_buckets(buckets.clamp(1, 20_000)).with_window(0.0, end_s);
        let curves: Vec<RankCurve> = whole
            .devices
            .iter()
            .enumerate()
            .filter_map(|(k, d)| {
                let points = analysis::timeline(whole, &TimelineOptions { device: Some(k as u8), ..options.clone() });
                Some(RankCurve { device_index: k as u8, rank: d.rank?, device: d.to_string(), points })
            })
            .collect();
        if curves.is_empty() {
            return Response::Error { message: "this trace has no ranks: open one file per rank together to merge them".into() };
        }
        Response::RankCurves { end_s, curves }
    }
}
