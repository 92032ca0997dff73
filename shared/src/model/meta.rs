//! Facts about a run ([`TraceMeta`]): where the trace came from, the counters PyTorch reported
//! ([`Counter`]), a distributed job's rank and size ([`RankVar`]), what torch.compile's
//! generated code was attributed to.

use serde::{Deserialize, Serialize};

/// Which importer produced a trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceFormat {
    /// Memory Tracer's own format (native capture or a conversion).
    MemoryTracer,
    /// `torch.cuda.memory._dump_snapshot` pickle.
    PytorchSnapshot,
    /// torch.profiler Chrome trace.
    ChromeTrace,
    /// DFTracer `.pfw`.
    Dftracer,
}

impl SourceFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            SourceFormat::MemoryTracer => "memory_tracer",
            SourceFormat::PytorchSnapshot => "pytorch_snapshot",
            SourceFormat::ChromeTrace => "chrome_trace",
            SourceFormat::Dftracer => "dftracer",
        }
    }
}

/// Facts about the run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceMeta {
    pub model: Option<String>,
    pub input_shape: Option<Vec<i64>>,
    pub batch_size: Option<u64>,
    pub device_name: Option<String>,
    pub device_total_memory_bytes: Option<u64>,
    pub pytorch_version: Option<String>,
    pub source_format: SourceFormat,
    /// Wall-clock start of the trace in nanoseconds since the Unix epoch, when known.
    pub start_unix_ns: Option<u64>,
    /// The caching allocator's settings the run started under, as a memory snapshot's
    /// `allocator_settings` dict (its `PYTORCH_CUDA_ALLOC_CONF` string and effective values);
    /// `None`: the source did not record them (then PyTorch's defaults are assumed, and said).
    #[serde(default)]
    pub allocator_settings: Option<AllocatorSettings>,
    /// Changes the program made to the allocator while it ran (`_set_allocator_settings`,
    /// `set_per_process_memory_fraction`), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allocator_changes: Vec<AllocatorChange>,
    /// Why allocations outside every module were not named by the line that made them (a
    /// Python before 3.12); their layer is then `unattributed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lines_unnamed: Option<String>,
    /// What the importer could not take at face value (skipped entries, estimated sizes).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Counters PyTorch itself reported during the run, by name
    /// (`cuda.max_memory_allocated`, ...), to check the trace against. Read and written
    /// through [`TraceMeta::counter`] and [`TraceMeta::report`] ([`Counter`] names them);
    /// also the traced process's numeric torchrun variables (`env.RANK`, ...: [`RankVar`],
    /// [`TraceMeta::report_env`]).
    #[serde(default)]
    pub reported: std::collections::BTreeMap<String, u64>,
    /// False when the recorder was asked not to track fragmentation: analyses then report a
    /// fragmentation of 0, as the MemoryTracer API does.
    #[serde(default = "yes")]
    pub fragmentation_tracked: bool,
    /// Which distributed job the process belonged to (torchrun's run id and rendezvous
    /// address), so that `merge` refuses ranks of different jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// Ranks of the job that a merged trace lacks (their reasons are in `warnings`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing_ranks: Vec<u32>,
    /// Which capture recorded a traced program (`native (torch 2.11, library built for torch
    /// 2.11.0)`, or PyTorch's recorder with why and what it lacks); None for imported files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<String>,
    /// Devices (indices into [`Trace::devices`](super::Trace::devices)) whose reserved memory
    /// is unknown: a snapshot names none of their segments, or its segments cannot hold its
    /// allocations. Their reserved totals read 0 and mean "unknown"; `warnings` says why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reserved_unknown: Vec<u8>,
    /// What the capture made of torch.compile's generated code, when the program ran some.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compiled: Option<CompiledCode>,
}

/// A caching allocator's settings as PyTorch reports them (a memory snapshot's
/// `allocator_settings`): a free-form map of PyTorch's own key names.
pub type AllocatorSettings = serde_json::Value;

/// The settings of a run known only by its `PYTORCH_CUDA_ALLOC_CONF` string (empty: PyTorch's
/// defaults), in the shape a snapshot gives them.
pub fn allocator_settings_of_string(alloc_conf: &str) -> AllocatorSettings {
    serde_json::json!({ "PYTORCH_CUDA_ALLOC_CONF": alloc_conf })
}

/// One change the program made to the CUDA caching allocator while it ran.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AllocatorChange {
    /// When, on the trace's clock.
    pub ts_ns: u64,
    /// A `PYTORCH_CUDA_ALLOC_CONF` string given to `torch.cuda.memory._set_allocator_settings`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<String>,
    /// A fraction given to `torch.cuda.set_per_process_memory_fraction`, for `device`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_fraction: Option<f64>,
    /// The CUDA device index the fraction is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<i32>,
}

/// Inductor's generated code in a traced run: its allocations are attributed to the modules
/// whose FX nodes they come from (`nn_module_stack`), which the capture reads as PyTorch loads
/// each generated module.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CompiledCode {
    /// Generated modules (a forward, a backward, each recompilation) that were attributed.
    pub graphs: u32,
    /// Statements of theirs that allocate a buffer.
    pub sites: u32,
    /// Of those, the ones no module metadata names: their allocations stay on the module the
    /// compiled code runs in.
    pub unresolved: u32,
    /// The module paths compiled allocations were attributed to.
    pub modules: Vec<String>,
    /// Generated modules that could not be read, and why (at most five).
    pub failures: Vec<String>,
}

impl CompiledCode {
    /// Adds another process's (a rank's) compiled code.
    pub fn absorb(&mut self, other: &CompiledCode) {
        self.graphs += other.graphs;
        self.sites += other.sites;
        self.unresolved += other.unresolved;
        self.modules.extend(other.modules.iter().cloned());
        self.modules.sort();
        self.modules.dedup();
        self.failures.extend(other.failures.iter().cloned());
        self.failures.truncate(5);
    }

    /// One line for summaries: `2 Inductor graphs: 39 of 39 allocation sites attributed to 9 modules`.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "{} Inductor graph{}: {} of {} allocation sites attributed to {} module{}",
            self.graphs,
            if self.graphs == 1 { "" } else { "s" },
            self.sites - self.unresolved.min(self.sites),
            self.sites,
            self.modules.len(),
            if self.modules.len() == 1 { "" } else { "s" }
        );
        if self.unresolved > 0 {
            s.push_str(&format!("; {} without module metadata stay on the compiled module (a compiled function with no module in it, or backward code an untraced run compiled and AOTAutograd's cache handed back: TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 for one traced run attributes that)", self.unresolved));
        }
        if !self.failures.is_empty() {
            s.push_str(&format!("; {} generated module(s) not read: {}", self.failures.len(), self.failures.join("; ")));
        }
        s
    }
}

fn yes() -> bool {
    true
}

/// A counter of PyTorch's CUDA caching allocator (`torch.cuda.memory_stats`) that a traced
/// process reports at its end, kept in [`TraceMeta::reported`] under [`Counter::key`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// `torch.cuda.max_memory_allocated()`.
    MaxMemoryAllocated,
    /// `torch.cuda.max_memory_reserved()`.
    MaxMemoryReserved,
    /// `torch.cuda.memory_allocated()` at the end.
    MemoryAllocated,
    /// `torch.cuda.memory_reserved()` at the end.
    MemoryReserved,
    /// Allocations retried after freeing the cache (`num_alloc_retries`).
    NumAllocRetries,
    /// Out-of-memory errors raised (`num_ooms`).
    NumOoms,
}

impl Counter {
    pub const ALL: [Counter; 6] = [
        Counter::MaxMemoryAllocated,
        Counter::MaxMemoryReserved,
        Counter::MemoryAllocated,
        Counter::MemoryReserved,
        Counter::NumAllocRetries,
        Counter::NumOoms,
    ];

    /// Its name in [`TraceMeta::reported`] (and in the own format and `collector ingest`'s
    /// JSON, which keep that map as it is).
    pub fn key(self) -> &'static str {
        match self {
            Counter::MaxMemoryAllocated => "cuda.max_memory_allocated",
            Counter::MaxMemoryReserved => "cuda.max_memory_reserved",
            Counter::MemoryAllocated => "cuda.memory_allocated",
            Counter::MemoryReserved => "cuda.memory_reserved",
            Counter::NumAllocRetries => "cuda.num_alloc_retries",
            Counter::NumOoms => "cuda.num_ooms",
        }
    }
}

/// Where a traced process of a distributed job stood in it: torchrun's variables that merging
/// ranks reads, kept in [`TraceMeta::reported`] under [`RankVar::key`] (the collector keeps every
/// numeric variable of the process's torchrun environment there, [`TraceMeta::report_env`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RankVar {
    /// `RANK`: the process's rank in the job.
    Rank,
    /// `WORLD_SIZE`: how many ranks the job has.
    WorldSize,
}

impl RankVar {
    pub const ALL: [RankVar; 2] = [RankVar::Rank, RankVar::WorldSize];

    /// Its name in [`TraceMeta::reported`] (and in the own format, which keeps that map as it
    /// is): the environment variable's, after `env.`.
    pub fn key(self) -> &'static str {
        match self {
            RankVar::Rank => "env.RANK",
            RankVar::WorldSize => "env.WORLD_SIZE",
        }
    }
}

impl TraceMeta {
    /// What PyTorch reported for `c`, where the trace has it.
    pub fn counter(&self, c: Counter) -> Option<u64> {
        self.reported.get(c.key()).copied()
    }

    /// Keeps what PyTorch reported for `c`.
    pub fn report(&mut self, c: Counter, value: u64) {
        self.reported.insert(c.key().to_owned(), value);
    }

    /// The traced process's `v` (its rank, its job's size), where it had one.
    pub fn rank_var(&self, v: RankVar) -> Option<u64> {
        self.reported.get(v.key()).copied()
    }

    /// Keeps the traced process's `v`.
    pub fn report_rank_var(&mut self, v: RankVar, value: u64) {
        self.reported.insert(v.key().to_owned(), value);
    }

    /// Keeps the numeric environment variable `name` of the traced process (`RANK`,
    /// `LOCAL_WORLD_SIZE`, ...) as `env.NAME`, where [`TraceMeta::rank_var`] reads those it
    /// knows.
    pub fn report_env(&mut self, name: &str, value: u64) {
        self.reported.insert(format!("env.{name}"), value);
    }

    pub fn new(source_format: SourceFormat) -> Self {
        Self {
            model: None,
            input_shape: None,
            batch_size: None,
            device_name: None,
            device_total_memory_bytes: None,
            pytorch_version: None,
            source_format,
            start_unix_ns: None,
            allocator_settings: None,
            allocator_changes: Vec::new(),
            lines_unnamed: None,
            warnings: Vec::new(),
            reported: std::collections::BTreeMap::new(),
            fragmentation_tracked: true,
            job: None,
            missing_ranks: Vec::new(),
            capture: None,
            reserved_unknown: Vec::new(),
            compiled: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The collector keeps the process's environment by name; the typed keys read it back.
    #[test]
    fn the_recorded_environment_reads_back_as_rank_vars() {
        let mut meta = TraceMeta::new(SourceFormat::MemoryTracer);
        meta.report_env("RANK", 3);
        meta.report_env("WORLD_SIZE", 8);
        assert_eq!(RankVar::ALL.map(|v| meta.rank_var(v)), [Some(3), Some(8)]);
    }
}
