//! Answers about time: the timeline at any zoom, the ranks' curves, the module bands, and what
//! is live at a moment ([`Moment`], [`Allocation`]).

use super::*;

/// One rank device's allocated memory over the whole merged trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankCurve {
    pub device_index: u8,
    pub rank: u32,
    pub device: String,
    #[serde(with = "analysis::timeline_columns")]
    pub points: Vec<TimelinePoint>,
}

/// A labelled stretch of time, seconds since trace start.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Band {
    pub start_s: f64,
    pub end_s: f64,
    pub label: String,
    pub phase: Phase,
}

/// Bands as they are written: one list per field, each label once. A long run's snapshot holds
/// thousands of top-level layer calls under a few names (9 062 in a 57.5 MB one: 979 KB of
/// JSON as a list of objects, most of the overview the page reads when a file opens).
pub(super) mod band_columns {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::Band;
    use crate::hash::FastMap;
    use crate::model::Phase;

    #[derive(Serialize, Deserialize)]
    struct Columns {
        labels: Vec<String>,
        /// Index into `labels` of each band's label.
        label: Vec<u32>,
        phase: Vec<Phase>,
        start_s: Vec<f64>,
        end_s: Vec<f64>,
    }

    pub fn serialize<S: Serializer>(bands: &[Band], s: S) -> Result<S::Ok, S::Error> {
        let mut index: FastMap<&str, u32> = FastMap::default();
        let mut c = Columns {
            labels: Vec::new(),
            label: Vec::with_capacity(bands.len()),
            phase: bands.iter().map(|b| b.phase).collect(),
            start_s: bands.iter().map(|b| b.start_s).collect(),
            end_s: bands.iter().map(|b| b.end_s).collect(),
        };
        for b in bands {
            let next = index.len() as u32;
            let id = *index.entry(b.label.as_str()).or_insert(next);
            if id == next {
                c.labels.push(b.label.clone());
            }
            c.label.push(id);
        }
        c.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Band>, D::Error> {
        let c = Columns::deserialize(d)?;
        let n = c.label.len();
        crate::analysis::same_lengths(
            "a band list",
            &[("label", n), ("phase", c.phase.len()), ("start_s", c.start_s.len()), ("end_s", c.end_s.len())],
        )
        .map_err(serde::de::Error::custom)?;
        (0..n)
            .map(|i| {
                let label = c
                    .labels
                    .get(c.label[i] as usize)
                    .ok_or_else(|| serde::de::Error::custom(format!("band {i} names label {}, of {}", c.label[i], c.labels.len())))?;
                Ok(Band { start_s: c.start_s[i], end_s: c.end_s[i], label: label.clone(), phase: c.phase[i] })
            })
            .collect()
    }
}

/// One memory-vs-rank curve of an overlay.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Curve {
    pub label: String,
    pub points: Vec<RankPoint>,
}

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
    pub(super) fn active(&mut self, start_s: f64, end_s: f64, columns: usize, detail: usize) -> Response {
        let device = self.device;
        if self.pairs.as_ref().is_none_or(|p| p.device != device) {
            self.pairs = Some(analysis::active::Pairs::of(self.trace(), device));
        }
        let Some(pairs) = &self.pairs else { return Response::Error { message: "no allocations".into() } };
        let options = analysis::active::ActiveOptions { start_s, end_s, columns, detail: detail.min(200_000) };
        let mut a = analysis::active::active_timeline(self.trace(), pairs, self.index.as_ref(), &options);
        for b in &mut a.bands {
            b.op = self.ops_at_event.get(b.event_index as usize).and_then(|&o| self.trace().opt_str(o)).map(str::to_owned);
            let k = self.categories.partition_point(|c| c.event < b.event_index);
            b.category = self.categories.get(k).filter(|c| c.event == b.event_index).map(|c| c.category);
        }
        Response::Active(Box::new(a))
    }

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

    pub(super) fn secs(&self, ts_ns: u64) -> f64 {
        ts_ns.saturating_sub(self.trace().start_ns()) as f64 * 1e-9
    }

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
        Response::Timeline { start_s, end_s, points, driver }
    }

    /// The last event at or before `t_s` (any device).
    pub(super) fn event_at(&self, t_s: f64) -> Option<usize> {
        let ts = self.trace().start_ns().saturating_add((t_s.max(0.0) * 1e9) as u64);
        let n = self.trace().events.ts_ns.partition_point(|&t| t <= ts);
        n.checked_sub(1)
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
    pub(super) fn allocation(&self, i: usize, free_s: Option<f64>) -> Allocation {
        let ev = &self.trace().events;
        Allocation {
            event_index: i,
            address: ev.address[i],
            size_bytes: ev.size_bytes[i],
            alloc_s: self.secs(ev.ts_ns[i]),
            free_s,
            layer: self.trace().opt_str(ev.layer[i]).map(str::to_owned),
            op: self.ops_at_event.get(i).and_then(|&o| self.trace().opt_str(o)).map(str::to_owned),
            stack: self
                .trace()
                .stacks
                .stack_of_event(i)
                .map(|s| {
                    self.trace()
                        .stacks
                        .stack(s)
                        .map(|f| format!("{} {}:{}", self.trace().str(f.name), self.trace().str(f.filename), f.line))
                        .collect()
                })
                .unwrap_or_default(),
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
