//! The overview: everything the page draws without asking again, sent once a file opens
//! (summary, layers, profile, phase and layer bands, ranks, leaks). The flame graph, most of
//! what a report holds and drawn below the first screen, is asked for ([`super::Request::Flame`]).

use crate::analysis::iterations::is_iteration_scope;
use crate::analysis::profile::{graph_profile, GraphProfile};
use crate::analysis::sweep::RankPoint;
use crate::analysis::{self, FragmentationStats, LayerMemoryStats, Summary};
use crate::model::{Phase, Trace};
use crate::report::TraceReport;
use serde::{Deserialize, Serialize};

/// Subtrees of the flame graph below this share of the root (in both weights) are left out.
pub const FLAME_MIN_SHARE: f64 = 1e-4;

/// Everything the page draws without asking again, sent once after loading.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Overview {
    pub file_name: String,
    pub file_bytes: u64,
    pub summary: Summary,
    pub device: String,
    /// Seconds since trace start of the last event (the timeline's full width).
    pub duration_s: f64,
    pub layers: Vec<LayerMemoryStats>,
    pub fragmentation: FragmentationStats,
    pub profile: Option<GraphProfile>,
    /// Why there is no profile (a snapshot has no operators, ...).
    pub profile_error: Option<String>,
    /// Runs of one phase (forward, backward, optimizer) in time.
    #[serde(with = "band_columns")]
    pub phase_bands: Vec<Band>,
    /// Outermost module scopes in time.
    #[serde(with = "band_columns")]
    pub layer_bands: Vec<Band>,
    pub has_segments: bool,
    pub has_device_samples: bool,
    /// Rank curves to overlay (a sweep); empty for a trace.
    pub curves: Vec<Curve>,
    /// Every device's peaks (one per rank of a merged distributed trace).
    pub devices: Vec<analysis::DevicePeak>,
    /// Growth across iterations and what is never freed.
    pub leaks: analysis::leaks::LeakReport,
    /// Why the run ran out of memory, when it did (shown first).
    #[serde(default)]
    pub oom: Option<analysis::oom::OomReport>,
    /// The ranks of a merged trace of two or more ranks (whichever rank is shown); `None`
    /// otherwise.
    #[serde(default)]
    pub ranks: Option<RankSet>,
    /// What the importer noted about the trace shown (memory allocated before recording,
    /// entries skipped, annotations left out): `collector summary`'s `note:` lines.
    #[serde(default)]
    pub notes: Vec<String>,
    /// Bytes of each allocation category alive at the peak
    /// ([`analysis::categories::bytes_at`]).
    #[serde(default)]
    pub categories_at_peak: Vec<(analysis::categories::Category, u64)>,
    /// Who holds the bytes live at the peak, where the capture recorded holders.
    #[serde(default)]
    pub holders_at_peak: Option<analysis::holders::Why>,
    /// Highest device memory in use as the driver saw it, when sampled.
    #[serde(default)]
    pub driver_used_peak_bytes: Option<u64>,
    /// The CUDA caching allocator's settings the run had, or that they are unknown.
    #[serde(default)]
    pub allocator_settings: Option<crate::whatif::SettingsInfo>,
    /// The device's memory by source at the peak (`collector trace --ledger`).
    #[serde(default)]
    pub ledger_at_peak: Option<analysis::ledger::LedgerAt>,
    /// torch.compile's generated code in the run and the modules it was attributed to.
    #[serde(default)]
    pub compiled: Option<crate::model::CompiledCode>,
}

/// The ranks of a merged trace: what the Ranks view shows, the same whichever rank the other
/// views show.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankSet {
    /// One row per device of a rank (usually one device per rank), in device order.
    pub devices: Vec<RankDevice>,
    /// Ranks of the job (`WORLD_SIZE`) that no file was given for.
    pub missing_ranks: Vec<u32>,
    /// The merged trace's warnings (missing ranks and why, how clocks were aligned).
    pub warnings: Vec<String>,
    /// The rank the other views show; `None`: every rank (the merged trace).
    pub selected: Option<u32>,
    /// Seconds from the merged trace's start to its last event: the curves' shared x axis.
    pub duration_s: f64,
    /// The device (index into the trace's devices) whose allocated peak is the highest.
    pub highest_device: u8,
    /// The two devices of different ranks whose allocated peaks differ most (the highest and
    /// the lowest peak), lower rank first.
    pub most_different: (u8, u8),
}

/// One device of a rank and its peaks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankDevice {
    /// Index into the merged trace's devices.
    pub device_index: u8,
    pub rank: u32,
    /// `cuda:0 (rank 1)`.
    pub device: String,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// Seconds since the merged trace's start at which the allocated peak is first reached.
    pub peak_time_s: f64,
    /// The layer of the allocation that reached the peak; empty when it has none.
    pub peak_layer: String,
    pub events: usize,
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
mod band_columns {
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

/// Everything drawn without asking again; `device` is the peak's ([`analysis::peak_device`]).
/// Its summary, layers, device peaks, leaks, out-of-memory, categories and holders are the
/// trace's [`TraceReport`], as every other summary shows it; the categories come back too.
pub(super) fn overview_of(
    trace: &Trace,
    device: u8,
    file_name: &str,
    file_bytes: u64,
    progress: &mut impl FnMut(&str),
) -> (Overview, Vec<analysis::categories::Categorized>) {
    let (report, categorized) = TraceReport::with_categories(trace, progress);
    progress("fragmentation statistics");
    let fragmentation = analysis::fragmentation_stats_with_layers(trace, &report.layers);
    progress("profiling operators");
    let (profile, profile_error) = if trace.ops.is_empty() {
        (
            None,
            Some(
                "this trace has no operator events (a memory snapshot records allocations only), so there are no ranks or activations"
                    .to_owned(),
            ),
        )
    } else {
        match graph_profile(trace) {
            Ok(p) => (Some(p), None),
            Err(e) => (None, Some(e.to_string())),
        }
    };
    progress("phase and layer bands");
    let ev = &trace.events;
    let start = trace.start_ns();
    let secs = |ns: u64| ns.saturating_sub(start) as f64 * 1e-9;
    let mut phase_bands: Vec<Band> = Vec::new();
    for i in 0..ev.len() {
        let (p, t) = (ev.phase(i), secs(ev.ts_ns[i]));
        match phase_bands.last_mut() {
            Some(b) if b.phase == p => b.end_s = t,
            _ => phase_bands.push(Band { start_s: t, end_s: t, label: p.as_str().into(), phase: p }),
        }
    }
    phase_bands.retain(|b| b.phase != Phase::Other);
    // The shallowest depth with two or more names: below a root module that spans everything.
    let band_depth = (0..=trace.scopes.iter().map(|s| s.depth).max().unwrap_or(0)).find(|&d| {
        let mut names = trace.scopes.iter().filter(|s| s.depth == d && !is_iteration_scope(trace.str(s.name))).map(|s| s.name);
        names.next().is_some_and(|first| names.any(|n| n != first))
    });
    let layer_bands = trace
        .scopes
        .iter()
        .filter(|s| Some(s.depth) == band_depth && !is_iteration_scope(trace.str(s.name)))
        .map(|s| Band { start_s: secs(s.start_ns), end_s: secs(s.end_ns), label: trace.str(s.name).to_owned(), phase: s.phase })
        .collect();
    let overview = Overview {
        file_name: file_name.to_owned(),
        file_bytes,
        device: trace.devices.get(device as usize).map(|d| d.to_string()).unwrap_or_else(|| "unknown".into()),
        duration_s: duration_s(trace),
        summary: report.summary,
        layers: report.layers.into_values().collect(),
        fragmentation,
        profile,
        profile_error,
        phase_bands,
        layer_bands,
        has_segments: analysis::has_segments(trace),
        has_device_samples: !trace.device_samples.is_empty(),
        curves: Vec::new(),
        devices: report.devices,
        leaks: report.leaks,
        oom: report.oom,
        ranks: None,
        notes: trace.meta.warnings.clone(),
        categories_at_peak: report.categories_at_peak,
        holders_at_peak: report.holders_at_peak,
        driver_used_peak_bytes: report.driver_used_peak_bytes,
        allocator_settings: report.allocator_settings,
        ledger_at_peak: report.ledger_at_peak,
        compiled: trace.meta.compiled.clone(),
    };
    (overview, categorized)
}

/// Seconds from the trace's start to its last event.
pub(super) fn duration_s(trace: &Trace) -> f64 {
    // A trace with the device ledger runs on to its last driver allocation or NVML sample: the
    // device's memory goes on after PyTorch's last event (NCCL's setup, a raw block).
    let ledger = trace.ledger.events.iter().map(|e| e.ts_ns).chain(trace.ledger.process.iter().map(|p| p.ts_ns)).max();
    let last = trace.events.ts_ns.last().copied().into_iter().chain(ledger).max();
    last.map_or(0.0, |t| t.saturating_sub(trace.start_ns()) as f64 * 1e-9)
}

/// The ranks of `whole` when it has two or more, with `selected` the rank shown.
pub(super) fn rank_set(whole: &Trace, selected: Option<u32>) -> Option<RankSet> {
    if crate::ranks::ranks(whole).len() < 2 {
        return None;
    }
    let devices: Vec<RankDevice> = analysis::device_peaks(whole)
        .into_iter()
        .enumerate()
        .filter_map(|(k, p)| {
            Some(RankDevice {
                device_index: k as u8,
                rank: p.rank?,
                device: p.device,
                peak_allocated_bytes: p.peak_allocated_bytes,
                peak_reserved_bytes: p.peak_reserved_bytes,
                peak_time_s: p.peak_time_s,
                peak_layer: p.peak_layer,
                events: p.events,
            })
        })
        .collect();
    // Ties go to the first device in order, so the answer does not depend on sort stability.
    let highest = devices.iter().reduce(|best, d| if d.peak_allocated_bytes > best.peak_allocated_bytes { d } else { best })?;
    let lowest = devices.iter().filter(|d| d.rank != highest.rank).reduce(|best, d| {
        if d.peak_allocated_bytes < best.peak_allocated_bytes {
            d
        } else {
            best
        }
    })?;
    let (a, b) =
        if (lowest.rank, lowest.device_index) < (highest.rank, highest.device_index) { (lowest, highest) } else { (highest, lowest) };
    Some(RankSet {
        highest_device: highest.device_index,
        most_different: (a.device_index, b.device_index),
        missing_ranks: whole.meta.missing_ranks.clone(),
        warnings: whole.meta.warnings.clone(),
        selected,
        duration_s: duration_s(whole),
        devices,
    })
}
