//! Opening a trace in a [`Session`]: a file or a reader (a snapshot, a trace, a batch sweep), or
//! several files as the ranks of one job, and the [`Overview`] the page first draws, of the whole
//! job or of one rank.

use super::*;

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
    pub flame: FlameGraph,
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

/// What a file turned out to be.
pub enum Opened {
    Trace(Box<Session>, Box<Overview>),
    /// A sweep file: curves only.
    Sweep(Box<Overview>),
}

pub(super) fn looks_like_sweep(bytes: &[u8]) -> bool {
    let head = &bytes[..bytes.len().min(512)];
    // Lossy: the cut at 512 bytes may split a character.
    bytes.first() == Some(&b'{') && String::from_utf8_lossy(head).contains(SWEEP_FORMAT)
}

/// Everything drawn without asking again; `device` is the peak's ([`analysis::peak_device`]).
pub(super) fn overview_of(trace: &Trace, device: u8, file_name: &str, file_bytes: u64, progress: &mut impl FnMut(&str)) -> Overview {
    progress("summarising");
    let summary = analysis::summary(trace);
    let by_name = analysis::layer_stats(trace);
    let fragmentation = analysis::fragmentation_stats_with_layers(trace, &by_name);
    let layers: Vec<LayerMemoryStats> = by_name.into_values().collect();
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
    progress("building the flame graph");
    let flame = flame_graph(trace, FLAME_MIN_SHARE);
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
    Overview {
        file_name: file_name.to_owned(),
        file_bytes,
        device: trace.devices.get(device as usize).map(|d| d.to_string()).unwrap_or_else(|| "unknown".into()),
        duration_s: duration_s(trace),
        summary,
        layers,
        fragmentation,
        profile,
        profile_error,
        flame,
        phase_bands,
        layer_bands,
        has_segments: analysis::has_segments(trace),
        has_device_samples: !trace.device_samples.is_empty(),
        curves: Vec::new(),
        devices: analysis::device_peaks(trace),
        leaks: analysis::leaks::leaks(trace, 8),
        oom: analysis::oom::oom(trace, 8),
        ranks: None,
        notes: trace.meta.warnings.clone(),
        categories_at_peak: Vec::new(),
        compiled: trace.meta.compiled.clone(),
    }
}

/// The ranks of `whole` when it has two or more, with `selected` the rank shown.
pub(super) fn rank_set(whole: &Trace, selected: Option<u32>) -> Option<RankSet> {
    if crate::merge::ranks(whole).len() < 2 {
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

impl Session {
    /// Imports `bytes` (any format [`crate::import`] reads, or a sweep file) and computes the
    /// overview. `progress` is told each stage as it starts.
    pub fn open(file_name: &str, bytes: &[u8], mut progress: impl FnMut(&str)) -> Result<Opened, String> {
        if looks_like_sweep(bytes) {
            let sweep = read_sweep(bytes).map_err(|e| e.to_string())?;
            let curves = sweep
                .runs
                .iter()
                .filter(|r| !r.curve.is_empty())
                .map(|r| Curve { label: format!("{} batch {}", sweep.model, r.batch_size), points: r.curve.clone() })
                .collect();
            let empty = Trace::new(crate::model::TraceMeta::new(crate::model::SourceFormat::MemoryTracer));
            let mut overview = overview_of(&empty, 0, file_name, bytes.len() as u64, &mut progress);
            overview.curves = curves;
            overview.profile_error = Some("a sweep file holds curves only; open one of its traces for the other views".into());
            return Ok(Opened::Sweep(Box::new(overview)));
        }
        progress("parsing");
        let trace = crate::import(bytes, &crate::ImportOptions::default()).map_err(|e| e.to_string())?;
        Ok(Self::opened(trace, file_name, bytes.len() as u64, &mut progress))
    }

    /// A trace just imported from `file_name`, with its overview.
    pub(super) fn opened(trace: Trace, file_name: &str, file_bytes: u64, progress: &mut impl FnMut(&str)) -> Opened {
        let stem = file_name.split('.').next().filter(|s| !s.is_empty()).unwrap_or("trace");
        Self::start(trace, file_name, file_bytes, stem, progress)
    }

    /// Like [`Session::open`], with the file read from `reader` as it is imported, so that it
    /// is never held whole; `file_bytes` is its size.
    pub fn open_reader(
        file_name: &str,
        file_bytes: u64,
        mut reader: impl std::io::Read,
        mut progress: impl FnMut(&str),
    ) -> Result<Opened, String> {
        use std::io::Read as _;
        let mut head = Vec::new();
        (&mut reader).take(512).read_to_end(&mut head).map_err(|e| format!("reading {file_name} failed: {e}"))?;
        if looks_like_sweep(&head) {
            // A sweep file is a small JSON document: read it whole.
            reader.read_to_end(&mut head).map_err(|e| format!("reading {file_name} failed: {e}"))?;
            return Self::open(file_name, &head, progress);
        }
        progress("parsing");
        let trace =
            crate::import::import_reader(head.as_slice().chain(reader), &crate::ImportOptions::default()).map_err(|e| e.to_string())?;
        Ok(Self::opened(trace, file_name, file_bytes, &mut progress))
    }

    /// Opens `files` (name, bytes), one trace per rank of a job, merged into one trace. Each
    /// file's rank is the one its process recorded, else `rank<N>` in its name, else its
    /// position ([`crate::rank_files`]), as `collector merge` does.
    pub fn open_ranks(files: &[(String, Vec<u8>)], options: &MergeOptions, mut progress: impl FnMut(&str)) -> Result<Opened, RanksError> {
        let n = files.len();
        let mut traces = Vec::with_capacity(n);
        for (k, (name, bytes)) in files.iter().enumerate() {
            progress(&format!("parsing {name} ({} of {n})", k + 1));
            let failed = |message: String| RanksError::File { file_name: name.clone(), message };
            if looks_like_sweep(bytes) {
                return Err(failed("a batch sweep holds curves, not the trace of a rank; expected one trace per rank".into()));
            }
            traces.push(crate::import(bytes, &crate::ImportOptions::default()).map_err(|e| failed(e.to_string()))?);
        }
        let ranks = crate::rank_files::assign_ranks(files.iter().map(|f| f.0.as_str()).zip(&traces));
        let inputs =
            traces.into_iter().zip(ranks).zip(files).map(|((trace, rank), (name, _))| MergeInput { trace, rank, label: name.clone() });
        progress(&format!("merging {n} ranks"));
        let merged = merge_with(inputs.collect(), options)?;
        let name = files.iter().map(|f| f.0.as_str()).collect::<Vec<_>>().join(" + ");
        let bytes = files.iter().map(|f| f.1.len() as u64).sum();
        Ok(Self::start(merged, &name, bytes, "merged", &mut progress))
    }

    pub(super) fn start(whole: Trace, file_name: &str, file_bytes: u64, export_stem: &str, progress: &mut impl FnMut(&str)) -> Opened {
        let mut session = Session {
            whole,
            rank: None,
            device: 0,
            ops_at_event: Vec::new(),
            file_name: file_name.to_owned(),
            file_bytes,
            export_stem: export_stem.to_owned(),
            index: None,
            pairs: None,
            categories: Vec::new(),
            whatif: None,
        };
        let overview = session.overview(progress);
        Opened::Trace(Box::new(session), Box::new(overview))
    }

    /// Shows `rank` (or the whole trace) from now on; the overview of what is shown.
    pub(super) fn show(&mut self, rank: Option<u32>, progress: &mut impl FnMut(&str)) -> Result<Overview, String> {
        self.rank = match rank {
            None => None,
            Some(r) => {
                let known = crate::merge::ranks(&self.whole);
                let trace = rank_trace(&self.whole, r).ok_or_else(|| format!("this trace has no rank {r}: expected one of {known:?}"))?;
                Some((r, trace))
            }
        };
        Ok(self.overview(progress))
    }

    /// The overview of the trace shown; sets the device and operators later answers use.
    pub(super) fn overview(&mut self, progress: &mut impl FnMut(&str)) -> Overview {
        let rank = self.rank.as_ref().map(|(r, _)| *r);
        let trace = self.trace();
        // One pass finds the peak's device, for the overview and every later answer.
        let device = analysis::peak_device(trace);
        let ops_at_event = innermost_ops(trace);
        let mut overview = overview_of(trace, device, &self.name(), self.file_bytes, progress);
        progress("categorising allocations");
        let categories = analysis::categories::categorize(trace);
        overview.categories_at_peak = analysis::categories::bytes_at(trace, &categories, overview.summary.peak_event_index);
        overview.ranks = rank_set(&self.whole, rank);
        self.categories = categories;
        self.device = device;
        self.ops_at_event = ops_at_event;
        self.index = Some(TimelineIndex::new(self.trace()));
        self.pairs = None;
        self.whatif = None;
        overview
    }
}
