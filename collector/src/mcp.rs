//! Memory Tracer for AI assistants: an MCP server (the official Rust SDK, `rmcp`) whose tools
//! answer questions about traces with small JSON, a summary first and details on request,
//! never a whole trace. `collector mcp` serves it over stdio; `collector serve` at `/mcp`
//! (streamable HTTP, behind the server's token and browser checks).
//!
//! Every tool takes `trace`: a path (inside the folders the server was allowed) or, on
//! `collector serve`, a stored trace's id; [`Traces`] says which files that names. Tools:
//! `summary`, `top_allocations_at_peak`, `layer_stats`, `leaks`, `oom`, `diff`, `advise`,
//! `find`.

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, ServerCapabilities, ServerConfig};
use rmcp::{schemars, tool, tool_handler, tool_router, ErrorData, ServerHandler};
use serde::{Deserialize, Serialize};
use shared::{ImportOptions, Trace};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Which file a tool's `trace` argument names, or why it names none.
pub trait Traces: Send + Sync + 'static {
    fn resolve(&self, trace: &str) -> Result<PathBuf, String>;
}

/// Paths inside a few folders (canonical: `..` and links cannot leave them).
#[derive(Debug, Clone)]
pub struct AllowedFolders {
    roots: Vec<PathBuf>,
}

impl AllowedFolders {
    /// The folders, which must exist.
    pub fn new(folders: &[PathBuf]) -> Result<Self, String> {
        let roots = folders
            .iter()
            .map(|f| f.canonicalize().map_err(|e| format!("cannot allow {}: {e}", f.display())))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { roots })
    }

    /// `path`, when it is a file inside one of the folders.
    pub fn check(&self, path: &Path) -> Result<PathBuf, String> {
        let real = path.canonicalize().map_err(|e| format!("no trace at {}: {e}", path.display()))?;
        if !self.roots.iter().any(|r| real.starts_with(r)) {
            let roots: Vec<String> = self.roots.iter().map(|r| r.display().to_string()).collect();
            return Err(format!("{} is outside the folders this server may read ({})", path.display(), roots.join(", ")));
        }
        if !real.is_file() {
            return Err(format!("{} is not a file", path.display()));
        }
        Ok(real)
    }
}

impl Traces for AllowedFolders {
    fn resolve(&self, trace: &str) -> Result<PathBuf, String> {
        self.check(Path::new(trace))
    }
}

/// A trace read, by its file's path and modification time.
type Cached = (PathBuf, std::time::SystemTime, Arc<Trace>);

/// The server: its tools, where traces come from, and the last traces it read.
#[derive(Clone)]
pub struct Tools {
    traces: Arc<dyn Traces>,
    options: ImportOptions,
    /// The two traces read last.
    cache: Arc<Mutex<Vec<Cached>>>,
    tool_router: ToolRouter<Self>,
}

impl std::fmt::Debug for Tools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tools").finish_non_exhaustive()
    }
}

/// A trace to ask about.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct TraceArg {
    /// A trace file's path (any format Memory Tracer reads: own traces, PyTorch snapshots,
    /// profiler traces), or a stored trace's id on `collector serve`.
    pub trace: String,
}

/// A trace and how many rows to answer with.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct TopArg {
    /// A trace file's path, or a stored trace's id on `collector serve`.
    pub trace: String,
    /// How many rows (default 10, at most 200).
    pub limit: Option<usize>,
}

/// A trace and a moment.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct WhyArg {
    /// A trace file's path, or a stored trace's id on `collector serve`.
    pub trace: String,
    /// When: `peak` (default), `oom`, a mark's name (`NAME#K` for its K-th occurrence) or
    /// seconds since the trace's start.
    pub at: Option<String>,
    /// The device (`cuda:0`); default: the one the moment is on, else the one that peaks highest.
    pub device: Option<String>,
    /// How many holders (default 15, at most 200).
    pub limit: Option<usize>,
}

/// A trace, a moment and a device for its device ledger.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct LedgerArg {
    /// A trace file's path, or a stored trace's id on `collector serve` (recorded with
    /// `collector trace --ledger`).
    pub trace: String,
    /// When: `peak` (default, the allocated peak), `end`, `oom`, a mark's name or seconds since
    /// the trace's start.
    pub at: Option<String>,
    /// The device (`cuda:0`; a merged trace has one per rank); default: the first CUDA device.
    pub device: Option<String>,
}

/// A trace and, optionally, one layer.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct LayerArg {
    /// A trace file's path, or a stored trace's id on `collector serve`.
    pub trace: String,
    /// One layer (module path) to answer about; without it, the layers with the highest peaks.
    pub layer: Option<String>,
    /// How many layers without `layer` (default 10, at most 200).
    pub limit: Option<usize>,
}

/// Two traces to compare.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct DiffArg {
    /// Trace A (path or stored id).
    pub a: String,
    /// Trace B (path or stored id); changes are B − A.
    pub b: String,
    /// How many layers to list (default 10, at most 200).
    pub limit: Option<usize>,
}

/// A trace and the memory it must fit in.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct AdviseArg {
    /// A trace file's path, or a stored trace's id on `collector serve`.
    pub trace: String,
    /// The budget: 6GiB, 512MiB, 1.5GB or bytes. Without it, the best few changes.
    pub budget: Option<String>,
    /// How many suggestions (default 10, as `collector advise` and the viewer; at most 50).
    pub limit: Option<usize>,
}

/// A trace and the allocator settings to replay it under.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct WhatIfArg {
    /// A trace file's path, or a stored trace's id on `collector serve`.
    pub trace: String,
    /// PYTORCH_CUDA_ALLOC_CONF settings to try (`expandable_segments:True`,
    /// `max_split_size_mb:128`), each over the run's own.
    pub alloc_conf: Vec<String>,
    /// The device's memory for out-of-memory predictions: 80GiB, 24GB or bytes. Default: the
    /// trace's own device's.
    pub device_memory: Option<String>,
    /// Which device (`cuda:1`). Default: the one with the highest reserved peak.
    pub device: Option<String>,
}

/// What to find in a trace.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
pub struct FindArg {
    /// A trace file's path, or a stored trace's id on `collector serve`.
    pub trace: String,
    /// An address (`0x7f…`, anywhere inside a block), or text in module paths, stack frames
    /// (`name file:line`) and user metadata or annotations (case-insensitive).
    pub query: String,
    /// How many matches (default 20, at most 200).
    pub limit: Option<usize>,
}

/// The `summary` tool's answer: the numbers that say where memory went, and what to ask next.
#[derive(Debug, Serialize)]
pub struct SummaryAnswer {
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub peak_time_s: f64,
    pub peak_layer: Option<String>,
    pub peak_device: Option<String>,
    pub avg_fragmentation: f64,
    pub total_events: usize,
    pub duration_s: f64,
    pub source_format: String,
    pub model: Option<String>,
    /// Bytes of each allocation category alive at the peak.
    pub categories_at_peak: std::collections::BTreeMap<&'static str, u64>,
    /// The five layers with the highest peaks: (layer, peak allocated bytes).
    pub top_layers: Vec<(String, u64)>,
    /// The leak analysis in one line.
    pub leaks: String,
    /// Whether the leak check found memory kept every iteration.
    pub leaking: bool,
    /// What is never freed, the largest groups first (as the summary lists them).
    pub never_freed: Vec<shared::analysis::leaks::LeakGroup>,
    /// Whether the run ran out of memory (ask `oom` why).
    pub out_of_memory: bool,
    /// Every out-of-memory event, in order.
    pub ooms: Vec<shared::analysis::oom::OomEvent>,
    /// Who holds the bytes live at the peak, where the capture recorded holders.
    pub holders_at_peak: Option<shared::analysis::holders::Why>,
    /// The allocator settings the run had (a CUDA trace), or that they are unknown.
    pub allocator_settings: Option<shared::whatif::SettingsInfo>,
    /// The device's memory by source at the peak, for a trace with the ledger (ask `ledger`
    /// for another moment).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ledger_at_peak: Option<shared::analysis::ledger::LedgerAt>,
    pub warnings: Vec<String>,
    /// The tools that go deeper.
    pub next: &'static str,
}

/// The `oom` tool's answer: the explanation, or that there was no out-of-memory.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum OomAnswer {
    Ran(Box<shared::analysis::oom::OomReport>),
    No { out_of_memory: bool },
}

/// One allocation alive at the peak.
#[derive(Debug, Serialize)]
pub struct LiveAllocation {
    pub size_bytes: u64,
    pub address: String,
    pub layer: Option<String>,
    pub phase: &'static str,
    pub category: Option<&'static str>,
    /// Seconds since the trace's start when it was allocated.
    pub allocated_at_s: f64,
}

fn limit(given: Option<usize>, default: usize, most: usize) -> usize {
    given.unwrap_or(default).clamp(1, most)
}

fn answer<T: Serialize>(value: &T) -> Result<CallToolResult, ErrorData> {
    Ok(CallToolResult::success(vec![ContentBlock::json(value)?]))
}

fn refused(why: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(why)])
}

impl Tools {
    pub fn new(traces: Arc<dyn Traces>, options: ImportOptions) -> Self {
        Self { traces, options, cache: Arc::new(Mutex::new(Vec::new())), tool_router: Self::tool_router() }
    }

    /// The trace `name` names, read (or taken from the cache) off the async runtime.
    async fn load(&self, name: &str) -> Result<Arc<Trace>, String> {
        // Off the runtime: resolving a stored trace may read it from a bucket.
        let (traces, n) = (self.traces.clone(), name.to_owned());
        let path = tokio::task::spawn_blocking(move || traces.resolve(&n)).await.map_err(|e| format!("finding {name} failed: {e}"))??;
        let modified = std::fs::metadata(&path).and_then(|m| m.modified()).map_err(|e| format!("cannot read {name}: {e}"))?;
        if let Ok(cache) = self.cache.lock() {
            if let Some((_, _, t)) = cache.iter().find(|(p, m, _)| *p == path && *m == modified) {
                return Ok(t.clone());
            }
        }
        let options = self.options.clone();
        let read = path.clone();
        let trace = tokio::task::spawn_blocking(move || traceio::files::load_trace(&read, &options))
            .await
            .map_err(|e| format!("reading {name} failed: {e}"))?
            .map_err(|e| format!("{e:#}"))?;
        let trace = Arc::new(trace);
        if let Ok(mut cache) = self.cache.lock() {
            cache.retain(|(p, _, _)| *p != path);
            cache.insert(0, (path, modified, trace.clone()));
            cache.truncate(2);
        }
        Ok(trace)
    }

    /// Runs `f` on the trace `name` names off the async runtime; a bad name is the tool's
    /// error (the client sees why), not the protocol's.
    async fn with_trace<T: Serialize + Send + 'static>(
        &self,
        name: &str,
        f: impl FnOnce(&Trace) -> Result<T, String> + Send + 'static,
    ) -> Result<CallToolResult, ErrorData> {
        let trace = match self.load(name).await {
            Ok(t) => t,
            Err(why) => return Ok(refused(why)),
        };
        match tokio::task::spawn_blocking(move || f(&trace)).await {
            Ok(Ok(v)) => answer(&v),
            Ok(Err(why)) => Ok(refused(why)),
            Err(e) => Err(ErrorData::internal_error(format!("the analysis failed: {e}"), None)),
        }
    }
}

#[tool_router]
impl Tools {
    #[tool(description = "Start here: a trace's peak allocated and reserved memory, when and in which layer (module) it \
                          happens, the categories of memory alive at the peak, the top layers, leaks in one line and whether it \
                          ran out of memory.")]
    async fn summary(&self, Parameters(a): Parameters<TraceArg>) -> Result<CallToolResult, ErrorData> {
        self.with_trace(&a.trace, |t| Ok(summary_answer(t))).await
    }

    #[tool(description = "The largest allocations alive at the allocated peak: size, layer, phase, category, address and \
                          when each was allocated.")]
    async fn top_allocations_at_peak(&self, Parameters(a): Parameters<TopArg>) -> Result<CallToolResult, ErrorData> {
        let n = limit(a.limit, 10, 200);
        self.with_trace(&a.trace, move |t| Ok(top_at_peak(t, n))).await
    }

    #[tool(description = "Per-layer (module) memory statistics: peak allocated and reserved bytes, allocations, frees, \
                          fragmentation and time, for one layer or the layers with the highest peaks.")]
    async fn layer_stats(&self, Parameters(a): Parameters<LayerArg>) -> Result<CallToolResult, ErrorData> {
        let n = limit(a.limit, 10, 200);
        self.with_trace(&a.trace, move |t| {
            let stats = shared::analysis::layer_stats(t);
            match a.layer {
                Some(l) => stats.get(&l).cloned().map(|s| vec![s]).ok_or_else(|| format!("no layer `{l}` in this trace")),
                None => Ok(shared::analysis::top_layers_by_peak(&stats, n).into_iter().cloned().collect()),
            }
        })
        .await
    }

    #[tool(description = "Leaks: steady growth of allocated memory across iterations after warm-up, and the \
                          allocations born after it that are never freed, by layer, operator and frame.")]
    async fn leaks(&self, Parameters(a): Parameters<TopArg>) -> Result<CallToolResult, ErrorData> {
        let n = limit(a.limit, 5, 200);
        self.with_trace(&a.trace, move |t| Ok(shared::analysis::leaks::leaks(t, n))).await
    }

    #[tool(description = "Why the run ran out of memory, when it did: the failed request, and what was live by layer, \
                          phase and frame.")]
    async fn oom(&self, Parameters(a): Parameters<TopArg>) -> Result<CallToolResult, ErrorData> {
        let n = limit(a.limit, 5, 200);
        self.with_trace(&a.trace, move |t| {
            Ok(match shared::analysis::oom::oom(t, n) {
                Some(report) => OomAnswer::Ran(Box::new(report)),
                None => OomAnswer::No { out_of_memory: false },
            })
        })
        .await
    }

    #[tool(description = "Who holds the live bytes at the peak, the out-of-memory, a mark or any time: parameters, \
                          gradients, optimizer state, tensors saved for backward (by operator and module), buffers, Python \
                          variables, pending frees and the allocator's cache, largest first, each with its bytes, blocks \
                          and when it is released; whether they were recorded or inferred.")]
    async fn why(&self, Parameters(a): Parameters<WhyArg>) -> Result<CallToolResult, ErrorData> {
        let n = limit(a.limit, 15, 200);
        let at = a.at.unwrap_or_else(|| "peak".into());
        self.with_trace(&a.trace, move |t| {
            use shared::analysis::holders::{device_named, why, Moment};
            let moment = Moment::parse(&at)?;
            let device = a.device.as_deref().map(|d| device_named(t, d)).transpose().map_err(|e| e.to_string())?;
            let mut w = why(t, &moment, device).map_err(|e| e.to_string())?;
            w.holders.truncate(n);
            Ok(w)
        })
        .await
    }

    #[tool(description = "The process's device memory by source at the peak, the end, the out-of-memory, a mark or any \
                          time (a trace recorded with `collector trace --ledger`): PyTorch's reserved bytes, the CUDA \
                          context, NCCL, cuBLAS, cuDNN, Triton, raw cudaMalloc by library, other processes, and what NVML \
                          counts beyond them; each source's peak over the run.")]
    async fn ledger(&self, Parameters(a): Parameters<LedgerArg>) -> Result<CallToolResult, ErrorData> {
        let at = a.at.unwrap_or_else(|| "peak".into());
        self.with_trace(&a.trace, move |t| {
            use shared::analysis::ledger::{ledger_at, moment};
            if t.ledger.is_empty() {
                return Err("this trace has no device ledger: record one with `collector trace --ledger -- python ...`".to_owned());
            }
            let m = moment(t, &at)?;
            let device =
                a.device.as_deref().map(|d| shared::analysis::holders::device_named(t, d)).transpose().map_err(|e| e.to_string())?;
            ledger_at(t, m, device).ok_or_else(|| "this trace has no CUDA device for a ledger".to_owned())
        })
        .await
    }

    #[tool(description = "Compare two traces (B against A): peaks and when they happen, layers by change of peak, \
                          memory by category, and what cannot be compared.")]
    async fn diff(&self, Parameters(a): Parameters<DiffArg>) -> Result<CallToolResult, ErrorData> {
        let n = limit(a.limit, 10, 200);
        let ta = match self.load(&a.a).await {
            Ok(t) => t,
            Err(why) => return Ok(refused(why)),
        };
        self.with_trace(&a.b, move |tb| {
            let mut d = shared::analysis::diff::diff(&ta, tb);
            d.layers.truncate(n);
            Ok(d)
        })
        .await
    }

    #[tool(description = "What to change so the run needs less memory (activation checkpointing of named layers, AMP, a \
                          smaller batch, optimizer state, set_to_none, an allocator setting), each judged by what runs out: \
                          its predicted reserved peak (allocated where the trace has no reserved memory) with the allocated \
                          peak beside it, ranked by saving; changes that save nothing here under no_effect.")]
    async fn advise(&self, Parameters(a): Parameters<AdviseArg>) -> Result<CallToolResult, ErrorData> {
        let budget = match a.budget.as_deref().map(shared::units::parse_size).transpose() {
            Ok(b) => b,
            Err(e) => return Ok(refused(format!("budget: {e}"))),
        };
        self.with_trace(&a.trace, move |t| Ok(advise_answer(t, budget, a.limit))).await
    }

    #[tool(description = "What another allocator setting would do: the trace replayed through PyTorch's caching \
                          allocator under each PYTORCH_CUDA_ALLOC_CONF given (expandable_segments, max_split_size_mb, \
                          roundup_power2_divisions, ...): allocated and reserved peaks, unused reserved memory at the peak, \
                          segments, and the first out-of-memory at the device's memory (when, module, phase, request).")]
    async fn whatif(&self, Parameters(a): Parameters<WhatIfArg>) -> Result<CallToolResult, ErrorData> {
        let memory = match a.device_memory.as_deref().map(shared::units::parse_size).transpose() {
            Ok(m) => m,
            Err(e) => return Ok(refused(format!("device_memory: {e}"))),
        };
        if let Err(e) = shared::whatif::parse_settings(&a.alloc_conf) {
            return Ok(refused(e.to_string()));
        }
        let opts = shared::whatif::WhatIfOptions { settings: a.alloc_conf, device_memory_bytes: memory, device: a.device };
        self.with_trace(&a.trace, move |t| shared::whatif::what_if(t, &opts).map_err(|e| e.to_string())).await
    }

    #[tool(description = "Find allocations by address (anywhere inside the block), stack frame or file:line, module path, \
                          or user metadata and annotation text.")]
    async fn find(&self, Parameters(a): Parameters<FindArg>) -> Result<CallToolResult, ErrorData> {
        let n = limit(a.limit, 20, 200);
        self.with_trace(&a.trace, move |t| {
            let mut found = shared::analysis::search::find(t, &a.query, n);
            found.events.clear();
            Ok(found)
        })
        .await
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_instructions(
            "Memory Tracer: where GPU memory goes in a PyTorch run. Call `summary` on a trace first; then \
             `top_allocations_at_peak`, `layer_stats`, `leaks`, `oom`, `advise`, `find` or `diff` for details.",
        )
    }
}

/// The trace's [`TraceReport`](shared::report::TraceReport) as the `summary` tool answers it.
/// The `advise` tool's answer: the advice `collector advise --json` prints, with as many
/// suggestions as `limit` asks (the same default).
pub fn advise_answer(t: &Trace, budget_bytes: Option<u64>, asked: Option<usize>) -> shared::analysis::advice::AdviceReport {
    use shared::analysis::advice::{advise, AdviceOptions};
    let defaults = AdviceOptions::default();
    let top = limit(asked, defaults.top, 50);
    advise(t, &AdviceOptions { budget_bytes, top, ..defaults })
}

fn summary_answer(t: &Trace) -> SummaryAnswer {
    let r = traceio::text::report(t);
    let s = &r.summary;
    SummaryAnswer {
        peak_allocated_bytes: s.peak_allocated_bytes,
        peak_reserved_bytes: s.peak_reserved_bytes,
        peak_time_s: s.peak_time_s,
        peak_layer: s.peak_layer.clone(),
        peak_device: s.peak_device.clone(),
        avg_fragmentation: s.avg_fragmentation,
        total_events: s.total_events,
        duration_s: s.duration_s,
        source_format: s.source_format.clone(),
        model: t.meta.model.clone(),
        categories_at_peak: r.categories_at_peak.iter().map(|&(c, b)| (c.as_str(), b)).collect(),
        top_layers: r.top_layers(5).into_iter().map(|l| (l.layer_name.clone(), l.peak_allocated)).collect(),
        out_of_memory: r.oom.is_some(),
        leaks: r.leaks.verdict.clone(),
        leaking: r.leaks.leaking,
        never_freed: r.leaks.survivors.clone(),
        ooms: r.oom.as_ref().map(|o| o.all.clone()).unwrap_or_default(),
        holders_at_peak: r.holders_at_peak.clone(),
        allocator_settings: r.allocator_settings.clone(),
        ledger_at_peak: r.ledger_at_peak.clone(),
        warnings: t.meta.warnings.iter().take(5).cloned().collect(),
        next: "top_allocations_at_peak, layer_stats, leaks, oom, advise, find, diff",
    }
}

fn top_at_peak(t: &Trace, n: usize) -> Vec<LiveAllocation> {
    use shared::analysis;
    let Some(peak) = analysis::allocated_peak(t).event else { return Vec::new() };
    let categories: std::collections::HashMap<u32, &'static str> =
        analysis::categories::categorize(t).into_iter().map(|c| (c.event, c.category.as_str())).collect();
    let ev = &t.events;
    let start = t.start_ns();
    let mut live = analysis::live_allocations_at(t, peak);
    live.retain(|&i| ev.device[i] == ev.device[peak]);
    live.sort_by_key(|&i| std::cmp::Reverse(ev.size_bytes[i]));
    live.truncate(n);
    live.into_iter()
        .map(|i| LiveAllocation {
            size_bytes: ev.size_bytes[i],
            address: format!("0x{:x}", ev.address[i]),
            layer: t.strings.get(ev.layer[i]).map(str::to_owned),
            phase: ev.phase(i).as_str(),
            category: categories.get(&(i as u32)).copied(),
            allocated_at_s: ev.ts_ns[i].saturating_sub(start) as f64 / 1e9,
        })
        .collect()
}

/// `collector mcp`: serves the tools over stdio until the client closes it.
pub fn serve_stdio(traces: Arc<dyn Traces>, options: ImportOptions) -> anyhow::Result<()> {
    use rmcp::ServiceExt;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let service = Tools::new(traces, options).serve(rmcp::transport::stdio()).await?;
        service.waiting().await?;
        anyhow::Ok(())
    })
}

/// The tools over streamable HTTP, for a router to nest (`collector serve`'s `/mcp`). `Host`
/// and `Origin` are the server's own checks, so the SDK's are off.
pub fn http_service(
    traces: Arc<dyn Traces>,
    options: ImportOptions,
) -> rmcp::transport::streamable_http_server::StreamableHttpService<
    Tools,
    rmcp::transport::streamable_http_server::session::local::LocalSessionManager,
> {
    use rmcp::transport::streamable_http_server::{session::local::LocalSessionManager, StreamableHttpServerConfig, StreamableHttpService};
    let config = StreamableHttpServerConfig::default().disable_allowed_hosts();
    StreamableHttpService::new(move || Ok(Tools::new(traces.clone(), options.clone())), Arc::new(LocalSessionManager::default()), config)
}

#[cfg(test)]
mod tests {
    use super::summary_answer;
    use shared::explore::{Opened, Session};
    use shared::model::{EventHolder, EventType, HolderKind};
    use shared::Trace;

    fn data(name: &str) -> Trace {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data").join(name);
        traceio::files::load_trace(&path, &shared::ImportOptions::default()).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// Every allocation held by a parameter named after its index, so that the report has
    /// recorded holders to agree on.
    fn with_holders(mut t: Trace) -> Trace {
        let module = t.strings.intern("blocks.0.fc");
        for i in 0..t.events.len() {
            if t.events.event_type(i) == EventType::Alloc {
                let name = t.strings.intern(&format!("weight{}", i % 3));
                t.event_holders.push(EventHolder {
                    event: i as u32,
                    kind: if i % 2 == 0 { HolderKind::Parameter } else { HolderKind::Gradient },
                    name,
                    module,
                    taken_ns: t.events.ts_ns[i],
                    released_ns: None,
                });
            }
        }
        t
    }

    /// The text summary, `summary --json`, the MCP `summary` tool and the viewer's overview
    /// say the same of one trace: peak, leak verdict and lines, out-of-memory list, holders.
    fn views_agree(t: &Trace) -> (protocol::SummaryJson, String) {
        let mut text = Vec::new();
        traceio::text::print_summary(t, 10, false, &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        let mut json = Vec::new();
        traceio::text::print_summary(t, 10, true, &mut json).unwrap();
        let json: protocol::SummaryJson = serde_json::from_slice(&json).unwrap();
        let mcp = summary_answer(t);
        let mut bytes = Vec::new();
        shared::export::native::write(t, &mut bytes).unwrap();
        let Ok(Opened::Trace(_, overview)) = Session::open("t.mtrace.json", &bytes, |_| {}) else { panic!("not opened as a trace") };

        let peak = json.summary.peak_allocated_bytes;
        assert!(peak > 0);
        assert_eq!(mcp.peak_allocated_bytes, peak);
        assert_eq!(overview.summary.peak_allocated_bytes, peak);
        assert!(text.contains(&format!("({peak} bytes)")), "{text}");

        assert_eq!(mcp.leaks, json.leaks.verdict);
        assert_eq!(overview.leaks.verdict, json.leaks.verdict);
        assert_eq!(mcp.never_freed, json.leaks.survivors);
        assert_eq!(overview.leaks.survivors, json.leaks.survivors);
        if json.leaks.iterations >= shared::analysis::leaks::MIN_ITERATIONS {
            assert!(text.contains(&json.leaks.verdict), "{text}");
        }
        if json.leaks.leaking {
            assert!(!json.leaks.survivors.is_empty());
            for g in &json.leaks.survivors {
                assert!(text.contains(&format!("kept in {} (", g.layer)), "{} missing from\n{text}", g.layer);
            }
        }

        let ooms = json.oom.as_ref().map(|o| o.all.clone()).unwrap_or_default();
        assert_eq!(mcp.ooms, ooms);
        assert_eq!(mcp.out_of_memory, json.oom.is_some());
        assert_eq!(overview.oom, json.oom);
        assert_eq!(text.contains("OUT OF MEMORY"), json.oom.is_some());

        assert_eq!(mcp.holders_at_peak, json.holders_at_peak);
        assert_eq!(overview.holders_at_peak, json.holders_at_peak);
        assert_eq!(mcp.allocator_settings, json.allocator_settings);
        assert_eq!(overview.allocator_settings, json.allocator_settings);
        assert_eq!(mcp.ledger_at_peak, json.ledger_at_peak);
        assert_eq!(overview.ledger_at_peak, json.ledger_at_peak);
        if let Some(l) = &json.ledger_at_peak {
            assert!(text.contains(&format!("  device at peak     {}", l.line())), "{text}");
        }
        if let Some(a) = &json.allocator_settings {
            assert!(text.contains(&format!("  allocator          {}", a.description)), "{text}");
        }
        if let Some(w) = &json.holders_at_peak {
            assert!(text.contains(&format!("({:.1} % of the live bytes have one", 100.0 * w.coverage())), "{text}");
            for g in &w.holders {
                let label = if g.module.is_empty() { g.name.clone() } else { format!("{} in {}", g.name, g.module) };
                assert!(text.contains(&format!("{:<18} {label}", g.kind.as_str())), "{g:?} missing from\n{text}");
            }
        }
        (json, text)
    }

    #[test]
    fn the_four_summaries_say_the_same() {
        let (leaky, _) = views_agree(&data("leak_loop_leaky.pickle.gz"));
        assert!(leaky.leaks.leaking, "{}", leaky.leaks.verdict);
        let (oom, _) = views_agree(&data("oom_in_module.pickle.gz"));
        assert!(oom.oom.is_some_and(|o| !o.all.is_empty()));
        let (held, _) = views_agree(&with_holders(data("mlp_adam_3steps.pickle")));
        assert!(held.holders_at_peak.is_some_and(|w| w.holders.len() > 1));
        views_agree(&data("oom_in_module.ops.mtrace.json.gz"));
        let (ledger, _) = views_agree(&data("ledger/probe.mtrace.json.gz"));
        assert!(ledger.ledger_at_peak.is_some_and(|l| l.sources.len() > 2));
    }
}
