//! The `collector` command line: convert and summarise traces (and, with libtorch, trace models).

use anyhow::Context;
use clap::{Parser, Subcommand};
use collector::commands::{load_trace, print_summary, resolve_format, write_export};
use shared::ImportOptions;
use std::path::PathBuf;

/// Memory Tracer: where GPU memory goes when a PyTorch model runs.
#[derive(Parser)]
#[command(name = "collector", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Record every allocation, operator and layer of a Python program
    /// (`collector trace -o run.mtrace.json -- python train.py ARGS`) or of a built-in or
    /// TorchScript model run through libtorch.
    Trace(Box<TraceArgs>),
    /// Write the `memory_tracer` Python package this collector carries (sources and the
    /// capture library) into a folder, for building the wheel.
    #[command(hide = true)]
    PythonPackage {
        #[arg(long)]
        out: PathBuf,
    },
    /// Read one capture stream from an inherited socket and build its trace (what the Python
    /// `memory_tracer.MemoryTracer` API runs).
    #[command(hide = true)]
    Ingest {
        /// The socket's file descriptor.
        #[arg(long)]
        fd: i32,
        #[arg(short, long)]
        output: PathBuf,
        /// Print layer statistics, peaks per layer, fragmentation and the summary as JSON.
        #[arg(long)]
        stats_json: bool,
        /// cpu, cuda or cuda:N: whose memory the trace keeps.
        #[arg(long)]
        device: Option<String>,
        #[arg(long)]
        no_fragmentation: bool,
    },
    /// Measure tracing overhead: training steps traced and untraced, interleaved in one
    /// process; prints the medians as JSON.
    #[cfg(feature = "tracing")]
    Overhead {
        #[arg(long, default_value = "resnet50")]
        model: String,
        /// The full input shape, batch first.
        #[arg(long, value_delimiter = ',', num_args = 1..)]
        input_shape: Option<Vec<i64>>,
        #[arg(long, default_value_t = 32)]
        batch_size: i64,
        /// Steps of each kind (traced, untraced).
        #[arg(long, default_value_t = 20)]
        steps: u32,
        #[arg(long, default_value_t = 5)]
        warmup: u32,
        /// cpu, cuda or cuda:N. Default: the first GPU if there is one, else the CPU.
        #[arg(long)]
        device: Option<String>,
        /// Do not record operator tensors.
        #[arg(long)]
        no_tensors: bool,
        /// Record allocations and frees only (no operator callback).
        #[arg(long)]
        memory_only: bool,
    },
    /// Convert a trace (snapshot pickle, profiler Chrome trace, DFTracer .pfw, Memory Tracer
    /// trace; gzip or not) to another format.
    Convert {
        /// Input trace file.
        input: PathBuf,
        /// Output file; written atomically.
        #[arg(short, long)]
        output: PathBuf,
        /// native, timeline, speedscope, chrome, csv or dftracer (.pfw.gz). Default: from the output file name.
        #[arg(long)]
        format: Option<String>,
        /// Largest decompressed size accepted from gzip input, in MiB.
        #[arg(long, default_value_t = 4096)]
        max_decompressed_mib: u64,
    },
    /// Leaks across iterations: steady growth of allocated memory from one iteration's end to
    /// the next after warm-up, and the allocations born after it that are never freed, by
    /// layer, operator and innermost frame.
    Leaks(LeaksArgs),
    /// Compare two traces of any formats (B against A): peaks and when they happen, layers by
    /// change of peak, memory by tensor class, operators on one side only, and notes on what
    /// cannot be compared.
    Diff(DiffArgs),
    /// What to change so the run needs less memory: checkpointing (which layers), AMP, a smaller
    /// batch, set_to_none gradients, the optimizer's state, expandable_segments; each with its
    /// predicted peak (a replay of the trace) and extra time per iteration.
    Advise(AdviseArgs),
    /// Merge one trace per rank of a distributed job (snapshots, profiler traces, Memory Tracer
    /// traces; from one node or several) into one trace with a device per rank, clocks aligned.
    Merge {
        /// The traces, one per rank.
        #[arg(required = true)]
        inputs: Vec<PathBuf>,
        /// Output file; written atomically.
        #[arg(short, long)]
        output: PathBuf,
        /// The inputs' ranks, in order. Default: the rank a traced process recorded (RANK),
        /// else `rank<N>` in the file name, else the input's position.
        #[arg(long, value_delimiter = ',')]
        ranks: Option<Vec<u32>>,
        /// Merge inputs recorded far apart in time (more than a minute and than the longest
        /// input), which are otherwise refused as traces of different runs.
        #[arg(long)]
        allow_disjoint: bool,
        /// native, timeline, speedscope, chrome, csv or dftracer (.pfw.gz). Default: from the output file name.
        #[arg(long)]
        format: Option<String>,
        /// Largest decompressed size accepted from gzip input, in MiB.
        #[arg(long, default_value_t = 4096)]
        max_decompressed_mib: u64,
    },
    /// The graph profile of a trace: operator ranks, node statistics, activation liveness and
    /// the memory breakdown per rank, as CSV and JSON, with memory-vs-rank charts (PNG, SVG).
    Analyze {
        /// Input trace file (native, or a torch.profiler Chrome trace).
        input: PathBuf,
        /// Output folder (created if missing).
        #[arg(short, long, default_value = ".")]
        output: PathBuf,
        /// File name prefix.
        #[arg(long, default_value = "profiler_stats")]
        prefix: String,
        /// Largest decompressed size accepted from gzip input, in MiB.
        #[arg(long, default_value_t = 4096)]
        max_decompressed_mib: u64,
    },
    /// Trace a model at several batch sizes: peak memory, iteration time and memory per rank
    /// for each, as CSV, JSON (the viewer overlays it) and charts. Out-of-memory batch sizes
    /// are reported and the sweep goes on.
    #[cfg(feature = "tracing")]
    Sweep(Box<SweepArgs>),
    /// A static report: the viewer and the trace in a folder any static host serves (open
    /// its index.html through the host), or with `--single-file` one HTML file to mail.
    Report {
        /// Input trace file (any format the viewer opens).
        input: PathBuf,
        /// Output folder; with `--single-file`, the HTML file.
        #[arg(short, long, default_value = "report")]
        output: PathBuf,
        /// Write one self-contained HTML file (wasm, worker and trace inlined).
        #[arg(long)]
        single_file: bool,
        /// Largest decompressed size accepted from gzip input, in MiB.
        #[arg(long, default_value_t = 4096)]
        max_decompressed_mib: u64,
    },
    /// Serve the tracing API, the trace store and the viewer: open the printed URL.
    Serve(Box<ServeArgs>),
    /// Import (or export) one file for `collector serve` under a memory limit and print the
    /// answer as one JSON line: what the server runs for each upload and export.
    #[command(hide = true)]
    ServeWorker(ServeWorkerArgs),
    /// Print peak memory, fragmentation and the top layers of a trace.
    Summary(Report),
}

/// `collector serve` options.
#[derive(clap::Args)]
struct ServeArgs {
    /// Address to listen on. Anything but loopback needs --token.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port (0 picks a free one).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Where traces are stored [default: $XDG_DATA_HOME/memory-tracer or ~/.local/share/memory-tracer].
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Device of requests that name none: cpu, cuda or cuda:N [default: the first GPU if there
    /// is one, else the CPU].
    #[arg(long)]
    device: Option<String>,
    /// A file holding the bearer token every API route then requires (required for
    /// non-loopback hosts); the token is never printed. Or set MEMORY_TRACER_TOKEN. Used
    /// instead of --token and MEMORY_TRACER_TOKEN when given.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// The token itself (visible to other users in the process list: prefer --token-file or
    /// MEMORY_TRACER_TOKEN).
    #[arg(long, env = "MEMORY_TRACER_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Print the viewer's URL with the token in it (`?token=`) at start.
    #[arg(long)]
    show_token: bool,
    /// Allow cross-origin requests from this origin (repeat, or `*`); off by default.
    #[arg(long = "cors-origin")]
    cors_origins: Vec<String>,
    /// Traces run at the same time on one device.
    #[arg(long, default_value_t = 1)]
    jobs_per_device: usize,
    /// Trace requests that may wait; more get 429 with Retry-After.
    #[arg(long, default_value_t = 32)]
    max_queue: usize,
    /// A trace running longer is stopped (422).
    #[arg(long, default_value_t = 600)]
    job_timeout_s: u64,
    /// Once asked to stop (SIGTERM, Ctrl-C), how long answers in flight may take before the
    /// server kills running traces and exits.
    #[arg(long, default_value_t = 10)]
    shutdown_grace_s: u64,
    /// Stored traces kept; adding one more evicts the oldest.
    #[arg(long, default_value_t = 1000)]
    max_traces: usize,
    /// Store size (traces and exports), MiB; adding past it evicts the oldest traces.
    #[arg(long, default_value_t = 20480)]
    max_store_mb: u64,
    /// Largest upload, MiB (413 beyond).
    #[arg(long, default_value_t = 2048)]
    max_upload_mb: u64,
    /// Largest `max_events` a request may ask for (422 beyond).
    #[arg(long, default_value_t = 5_000_000)]
    max_events_cap: u64,
    /// Largest input (batch × sample elements) a request may ask for (422 beyond).
    #[arg(long, default_value_t = 1 << 28)]
    max_input_elements: u64,
    /// Connections open at once; more are answered 503 and closed.
    #[arg(long, default_value_t = 256)]
    max_connections: usize,
    /// Seconds a client may take to send a request's headers (and an idle keep-alive
    /// connection stays open).
    #[arg(long, default_value_t = 15)]
    header_timeout_s: u64,
    /// Seconds a request body may go without a byte.
    #[arg(long, default_value_t = 30)]
    body_timeout_s: u64,
    /// Uploads read and exports written at once (each in a child process); more wait.
    #[arg(long, default_value_t = 2)]
    max_imports: usize,
    /// Uploads and exports that may wait for one of --max-imports; more get 429.
    #[arg(long, default_value_t = 32)]
    import_queue: usize,
    /// Memory one upload's import (or one export) may use, MiB; past it the file is refused
    /// (422) and the server is untouched.
    #[arg(long, default_value_t = 4096)]
    import_memory_mb: u64,
    /// Seconds one import or export may take (422 beyond).
    #[arg(long, default_value_t = 300)]
    import_timeout_s: u64,
    /// Memory a CPU trace process may use, MiB (its address space is capped at this plus what
    /// libtorch maps unused: 4 GiB + 128 MiB per core; 0: no cap) [default: half the
    /// machine's memory]. CUDA trace processes are not capped (CUDA reserves far more address
    /// space than it uses).
    #[arg(long)]
    trace_memory_mb: Option<u64>,
    /// TorchScript models requests may name: `DIR/<name>.pt` is `"model_name": "<name>"`
    /// (train mode needs a scripted module with parameters; give `input_shape`).
    #[arg(long, value_name = "DIR")]
    models_dir: Option<PathBuf>,
    /// The Python with torch that runs distributed requests (`"world_size"`) under torchrun.
    /// Default: $MEMORY_TRACER_PYTHON, else `python3`.
    #[arg(long, value_name = "PATH")]
    python: Option<PathBuf>,
    /// Trace this built-in model once the server is up and open it live in the viewer.
    #[arg(long, value_name = "MODEL")]
    trace: Option<String>,
    /// Open the viewer in the default browser.
    #[arg(long)]
    open: bool,
}

fn serve_command(a: ServeArgs) -> anyhow::Result<()> {
    use collector::serve::{self, api, ServeConfig};
    let mut config = ServeConfig::new(a.data_dir.unwrap_or_else(serve::default_data_dir));
    config.device = a.device;
    config.token = match &a.token_file {
        Some(path) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("cannot read the token file {}", path.display()))?;
            let token = text.trim().to_owned();
            anyhow::ensure!(!token.is_empty(), "the token file {} is empty", path.display());
            Some(token)
        }
        None => a.token.filter(|t| !t.is_empty()),
    };
    config.max_connections = a.max_connections.max(1);
    config.header_timeout = std::time::Duration::from_secs(a.header_timeout_s.max(1));
    config.body_timeout = std::time::Duration::from_secs(a.body_timeout_s.max(1));
    config.isolation = serve::isolate::IsolationLimits {
        memory_budget_bytes: a.import_memory_mb.max(1).saturating_mul(1 << 20),
        timeout: std::time::Duration::from_secs(a.import_timeout_s.max(1)),
        max_running: a.max_imports.max(1),
        max_waiting: a.import_queue,
    };
    if let Some(mb) = a.trace_memory_mb {
        config.trace_address_space_bytes = (mb > 0).then(|| mb.saturating_mul(1 << 20).saturating_add(serve::libtorch_mappings_bytes()));
    }
    config.cors_origins = a.cors_origins;
    config.jobs_per_device = a.jobs_per_device.max(1);
    config.max_queue = a.max_queue;
    config.job_timeout = std::time::Duration::from_secs(a.job_timeout_s.max(1));
    config.shutdown_grace = std::time::Duration::from_secs(a.shutdown_grace_s);
    config.max_traces = a.max_traces.max(1);
    config.max_store_bytes = a.max_store_mb.saturating_mul(1 << 20);
    config.max_upload_bytes = a.max_upload_mb.saturating_mul(1 << 20);
    config.caps.max_events = a.max_events_cap.max(1);
    config.caps.max_input_elements = a.max_input_elements.max(1);
    config.models_dir = a.models_dir;
    if let Some(p) = a.python {
        config.python = p;
    }
    let data_dir = config.data_dir.clone();
    let token = config.token.clone();
    let (host, port, open, trace, show_token) = (a.host, a.port, a.open, a.trace, a.show_token);
    if let Some(m) = &trace {
        anyhow::ensure!(
            collector::MODEL_ZOO.contains(&m.as_str()),
            "--trace {m}: unknown model; built-in models: {}",
            collector::MODEL_ZOO.join(", ")
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime")?;
    runtime.block_on(serve::serve(&host, port, config, move |addr, state| {
        let shown = if addr.ip().is_unspecified() { format!("127.0.0.1:{}", addr.port()) } else { addr.to_string() };
        let base = format!("http://{shown}/");
        let mut query = Vec::new();
        if let Some(model) = trace {
            let req: protocol::TraceRequest =
                match serde_json::from_value(serde_json::json!({"model_name": model, "max_events": 5_000_000})) {
                    Ok(r) => r,
                    Err(e) => return eprintln!("cannot build the startup trace request: {e}"),
                };
            match api::start_job(state, req) {
                Ok(id) => {
                    eprintln!("tracing {model} on {} as {id} ...", state.device);
                    query.push(format!("follow={id}"));
                }
                Err(e) => eprintln!("cannot trace {model}: {}", e.detail),
            }
        }
        // The token goes only where it was asked for: the browser --open starts, and the
        // printed URL with --show-token.
        let url_with = |token: Option<&str>| {
            let q: Vec<String> = token.map(|t| format!("token={}", encode_query(t))).into_iter().chain(query.iter().cloned()).collect();
            if q.is_empty() {
                base.clone()
            } else {
                format!("{base}?{}", q.join("&"))
            }
        };
        let url = url_with(token.as_deref());
        eprintln!("Memory Tracer is serving {} on {addr}", data_dir.display());
        match &token {
            Some(_) if !show_token => {
                eprintln!("  viewer:   {} (add token=<your token> to the query; --show-token prints it)", url_with(None))
            }
            _ => eprintln!("  viewer:   {url}"),
        }
        eprintln!("  API docs: {base}api/docs (ReDoc: {base}api/redoc)");
        eprintln!("  stop with Ctrl-C");
        if open {
            let opener = if cfg!(target_os = "macos") { "open" } else { "xdg-open" };
            let opened = std::process::Command::new(opener)
                .arg(&url)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .is_ok();
            if !opened {
                eprintln!("  (cannot open a browser here: open the viewer's URL yourself)");
            }
        }
    }))
}

/// A query parameter's value, percent-encoded.
fn encode_query(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `collector serve-worker`: one import or export for `collector serve`.
#[derive(clap::Args)]
struct ServeWorkerArgs {
    #[command(subcommand)]
    task: ServeWorkerTask,
    /// Memory the worker may map beyond what it has at start.
    #[arg(long, global = true, default_value_t = 4 << 30)]
    memory_budget_bytes: u64,
    /// CPU seconds the worker may use.
    #[arg(long, global = true, default_value_t = 300)]
    cpu_seconds: u64,
    /// Largest decompressed size accepted from gzip input.
    #[arg(long, global = true, default_value_t = 4 << 30)]
    max_decompressed_bytes: u64,
}

#[derive(Subcommand)]
enum ServeWorkerTask {
    /// Import FILE and print its summary.
    Import {
        file: PathBuf,
        /// The model name of a trace that names none.
        #[arg(long, default_value = "uploaded trace")]
        model_name: String,
        /// The file as errors name it.
        #[arg(long, default_value = "the file")]
        what: String,
    },
    /// Import FILE and write it as FORMAT to OUT.
    Export {
        file: PathBuf,
        out: PathBuf,
        #[arg(long)]
        format: String,
    },
}

/// A trace to read and how to print what is found (`summary`, `leaks`).
#[derive(clap::Args)]
struct Report {
    /// Input trace file (any format).
    input: PathBuf,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// How many rows (layers, groups of never-freed allocations) to list.
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// Largest decompressed size accepted from gzip input, in MiB.
    #[arg(long, default_value_t = 4096)]
    max_decompressed_mib: u64,
}

/// A trace to look for leaks in (`leaks`).
#[derive(clap::Args)]
struct LeaksArgs {
    #[command(flatten)]
    report: Report,
    /// Iteration boundaries in seconds since the trace's start (each iteration ends at one),
    /// instead of the trace's iteration marks, optimizer steps or repeating allocations.
    #[arg(long, value_delimiter = ',', value_name = "SECONDS")]
    iterations_at: Option<Vec<f64>>,
}

/// Two traces to compare (`diff`).
#[derive(clap::Args)]
struct DiffArgs {
    /// Trace A (any format).
    a: PathBuf,
    /// Trace B (any format); changes are B - A.
    b: PathBuf,
    /// Print one JSON object instead of a table (every layer).
    #[arg(long)]
    json: bool,
    /// How many layers and operators to list in the table.
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// Device of A to compare (index into its devices, e.g. a rank of a merged trace).
    /// Default: the device with the highest allocated peak.
    #[arg(long)]
    device_a: Option<u8>,
    /// Device of B to compare. Default: the device with the highest allocated peak.
    #[arg(long)]
    device_b: Option<u8>,
    /// Largest decompressed size accepted from gzip input, in MiB.
    #[arg(long, default_value_t = 4096)]
    max_decompressed_mib: u64,
}

/// A trace to advise on (`advise`).
#[derive(clap::Args)]
struct AdviseArgs {
    /// Input trace file (any format; checkpointing, AMP and batch advice need operators).
    /// Not with --verify, which traces the run itself.
    #[arg(required_unless_present = "verify")]
    input: Option<PathBuf>,
    /// The memory the run must fit in: 6GiB, 512MiB, 1.5GB or bytes. Default: no budget, the
    /// best few changes.
    #[arg(long, value_parser = parse_budget)]
    budget: Option<u64>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// How many suggestions and checkpoint candidates to list.
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// Largest decompressed size accepted from gzip input, in MiB.
    #[arg(long, default_value_t = 4096)]
    max_decompressed_mib: u64,
    /// Prove it: trace the program after `--` (or a built-in model, --model) as it is, advise,
    /// then trace it again with the top checkpointing suggestion (`--checkpoint LAYERS`), AMP
    /// (`--amp`) and both, and print configuration | peak allocated | iteration time |
    /// predicted peak | error. The program must take those two flags.
    #[arg(long)]
    verify: bool,
    /// With --verify: a built-in model, run as `python -m memory_tracer.zoo --model NAME`.
    #[arg(long, requires = "verify")]
    model: Option<String>,
    /// With --model: its batch size.
    #[arg(long, requires = "model")]
    batch_size: Option<u64>,
    /// With --model: iterations (default 4; the first warms up).
    #[arg(long, requires = "model", default_value_t = 4)]
    iterations: u32,
    /// With --model: cuda or cpu (default: cuda when torch sees one).
    #[arg(long, requires = "model")]
    device: Option<String>,
    /// With --verify: where the runs' traces and verify.json go.
    #[arg(long, default_value = "advise-verify")]
    out_dir: PathBuf,
    /// With --verify: the program to run (`python train.py ...`).
    #[arg(last = true)]
    command: Vec<String>,
}

/// `collector advise`: advice on a trace, or (`--verify`) advice checked by running it.
fn advise_command(a: AdviseArgs) -> anyhow::Result<()> {
    use shared::analysis::advice::{advise, AdviceOptions};
    let opts = AdviceOptions { budget_bytes: a.budget, top: a.top, ..Default::default() };
    if !a.verify {
        let input = a.input.context("give a trace to advise on, or --verify with a program to run")?;
        let r = advise(&load_trace(&input, &import_options(a.max_decompressed_mib))?, &opts);
        if a.json {
            println!("{}", serde_json::to_string_pretty(&r)?);
        } else {
            collector::commands::print_advice(&r, std::io::stdout().lock())?;
        }
        return Ok(());
    }
    let command = match &a.model {
        Some(m) => {
            anyhow::ensure!(
                collector::MODEL_ZOO.contains(&m.as_str()),
                "--model {m}: unknown model; built-in models: {}",
                collector::MODEL_ZOO.join(", ")
            );
            anyhow::ensure!(a.command.is_empty(), "give --model or a command after `--`, not both");
            let python = std::env::var("MEMORY_TRACER_PYTHON").unwrap_or_else(|_| "python3".into());
            let mut c: Vec<String> = [python.as_str(), "-m", "memory_tracer.zoo", "--model", m, "--iterations"].map(String::from).to_vec();
            c.push(a.iterations.to_string());
            if let Some(b) = a.batch_size {
                c.extend(["--batch-size".into(), b.to_string()]);
            }
            if let Some(d) = &a.device {
                c.extend(["--device".into(), d.clone()]);
            }
            c
        }
        None => a.command.clone(),
    };
    anyhow::ensure!(
        !command.is_empty(),
        "--verify needs a program after `--` (one that takes --checkpoint LAYERS and --amp) or --model NAME"
    );
    let v = collector::verify::verify(&command, &opts, &a.out_dir)?;
    std::fs::write(a.out_dir.join("verify.json"), serde_json::to_vec_pretty(&v)?).context("cannot write verify.json")?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        collector::commands::print_advice(&v.advice, std::io::stdout().lock())?;
        println!();
        collector::verify::print(&v, std::io::stdout().lock())?;
    }
    Ok(())
}

fn parse_budget(text: &str) -> Result<u64, String> {
    shared::units::parse_size(text).map_err(|e| e.to_string())
}

/// What to run: the model, its input and the loop (shared by `trace` and `sweep`).
#[derive(clap::Args)]
struct RunArgs {
    /// A built-in model: resnet18, resnet34, resnet50, resnet101, resnet152, vgg16,
    /// transformer, gpt, mlp.
    #[arg(long, default_value = "resnet18")]
    model: String,
    /// Trace a TorchScript model file (torch.jit.script/trace + save) instead of a built-in one.
    #[arg(long, value_name = "FILE")]
    torchscript: Option<PathBuf>,
    /// The full input shape, batch first: 8,3,224,224 (images), 8,512 (tokens), 64,784 (mlp).
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    input_shape: Option<Vec<i64>>,
    /// Replaces the first dimension of the input shape.
    #[arg(long)]
    batch_size: Option<i64>,
    /// train (forward, backward, optimizer) or infer.
    #[arg(long, default_value = "train")]
    mode: String,
    /// sgd (momentum 0.9), adam or adamw.
    #[arg(long, default_value = "sgd")]
    optimizer: String,
    /// Learning rate.
    #[arg(long, default_value_t = 0.01)]
    lr: f64,
    /// Iterations to run (the first one warms the caching allocator up).
    #[arg(long, default_value_t = 3)]
    iterations: u32,
    /// Mixed precision (autocast) on CUDA.
    #[arg(long)]
    amp: bool,
    /// cpu, cuda or cuda:N. Default: the first GPU if there is one, else the CPU.
    #[arg(long)]
    device: Option<String>,
    /// Allocations and frees to keep (operators are bounded alike); later ones are dropped
    /// and counted.
    #[arg(long, default_value_t = 5_000_000)]
    max_events: u64,
    /// Do not track fragmentation (reported as 0, as the MemoryTracer API does).
    #[arg(long)]
    no_fragmentation: bool,
    /// Do not record operator input/output tensors (less overhead, no liveness analysis).
    #[arg(long)]
    no_tensors: bool,
    /// Record allocations, frees and layer scopes only, no operators (least overhead;
    /// backward memory is then attributed to phases, not layers).
    #[arg(long)]
    memory_only: bool,
    /// Transformer/GPT blocks or MLP hidden layers.
    #[arg(long)]
    layers: Option<i64>,
    /// Transformer/GPT/MLP width.
    #[arg(long)]
    width: Option<i64>,
    /// Attention heads.
    #[arg(long)]
    heads: Option<i64>,
    /// Vocabulary size (transformer, gpt).
    #[arg(long)]
    vocab: Option<i64>,
    /// Output classes (classifiers).
    #[arg(long)]
    classes: Option<i64>,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    seed: i64,
}

/// `collector trace` options.
#[derive(clap::Args)]
struct TraceArgs {
    #[command(flatten)]
    run: RunArgs,
    /// Output file; written atomically. Default: <model>.mtrace.json.
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// native, timeline, speedscope, chrome, csv or dftracer (.pfw.gz). Default: from the output file name.
    #[arg(long)]
    format: Option<String>,
    /// How many layers the summary lists.
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// No progress bar.
    #[arg(long, short)]
    quiet: bool,
    /// Report progress, live memory totals, the summary and errors as JSON lines on stdout
    /// (what `collector serve` reads from its trace processes).
    #[arg(long, hide = true)]
    progress_json: bool,
    /// Programs without an optimizer (inference loops): each call of this module (its path,
    /// e.g. `encoder`, or class name, e.g. `GPT2LMHeadModel`) is one iteration.
    #[arg(long, value_name = "MODULE")]
    iteration_marker: Option<String>,
    /// Records a traced program may hold before the collector drains them; past this, records
    /// are dropped and counted (the trace says how many).
    #[arg(long, default_value_t = 8_000_000)]
    buffer_records: u64,
    /// How often a traced program sends its records, in milliseconds.
    #[arg(long, default_value_t = 20, hide = true)]
    drain_interval_ms: u32,
    /// Python programs: which operators to record. `backward` (default): autograd nodes only,
    /// enough to give every allocation its module, phase and iteration at a fraction of the
    /// cost; `all`: every operator with its tensors (needed by `collector analyze`); `none`:
    /// allocations, module scopes and phases only. Built-in models record every operator
    /// unless --memory-only.
    #[arg(long, value_name = "MODE")]
    ops: Option<String>,
    /// Also store each trace in a running `collector serve` at this URL (http://HOST:PORT) and
    /// print the viewer's link to it.
    #[arg(long, value_name = "URL")]
    serve: Option<String>,
    /// The server's token for --serve.
    #[arg(long, env = "MEMORY_TRACER_TOKEN", hide_env_values = true)]
    serve_token: Option<String>,
    /// The program to trace and its arguments, after `--` (python, torchrun, accelerate, ...).
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// `collector sweep` options.
#[cfg(feature = "tracing")]
#[derive(clap::Args)]
struct SweepArgs {
    #[command(flatten)]
    run: RunArgs,
    /// Batch sizes to run, in order.
    #[arg(long, value_delimiter = ',', num_args = 1.., default_value = "4,8,16,32,64")]
    batch_sizes: Vec<u64>,
    /// Output folder for the traces, CSV, JSON and charts (created if missing).
    #[arg(short, long, default_value = "sweep")]
    output: PathBuf,
}

#[cfg(feature = "tracing")]
fn sweep_command(a: SweepArgs) -> anyhow::Result<()> {
    use collector::sweep::{sweep, SweepProgress};
    use shared::units::format_bytes;
    anyhow::ensure!(!a.batch_sizes.is_empty(), "--batch-sizes needs at least one batch size");
    anyhow::ensure!(a.batch_sizes.iter().all(|&b| b > 0), "--batch-sizes must all be at least 1");
    let opts = run_options(a.run)?;
    let started = std::time::Instant::now();
    let report = sweep(&opts, &a.batch_sizes, &a.output, &mut |p| match p {
        SweepProgress::Start { batch_size } => eprintln!("batch size {batch_size}: tracing {} on {} ...", opts.model.name, opts.device),
        SweepProgress::Done { run } => match (&run.error, run.peak_allocated_bytes) {
            (None, Some(peak)) => eprintln!(
                "batch size {}: peak allocated {}, iteration {:.1} ms",
                run.batch_size,
                format_bytes(peak),
                run.median_iteration_s.unwrap_or(0.0) * 1e3
            ),
            (Some(e), _) => eprintln!("batch size {}: {}: {e}", run.batch_size, run.status.as_str()),
            (None, None) => {}
        },
    })?;
    let files = collector::analyze::write_sweep(&report, &a.output)?;
    println!("batch_size  status          peak_allocated   peak_reserved   iteration");
    for r in &report.runs {
        println!(
            "{:>10}  {:<14}  {:>14}  {:>14}  {:>9}",
            r.batch_size,
            r.status.as_str(),
            r.peak_allocated_bytes.map(format_bytes).unwrap_or_default(),
            r.peak_reserved_bytes.map(format_bytes).unwrap_or_default(),
            r.median_iteration_s.map(|s| format!("{:.1} ms", s * 1e3)).unwrap_or_default()
        );
    }
    eprintln!("sweep took {:.1} s; wrote {} files to {}", started.elapsed().as_secs_f64(), files.len(), a.output.display());
    Ok(())
}

/// `--device`, or the first GPU if there is one, else the CPU.
#[cfg(feature = "tracing")]
fn device_arg(device: Option<&str>) -> anyhow::Result<collector::run::DeviceChoice> {
    match device {
        Some(d) => d.parse().map_err(anyhow::Error::msg),
        None => Ok(collector::run::default_device()),
    }
}

#[cfg(feature = "tracing")]
fn run_options(a: RunArgs) -> anyhow::Result<collector::run::RunOptions> {
    let mut opts = collector::run::RunOptions::new(&a.model);
    opts.model.layers = a.layers;
    opts.model.width = a.width;
    opts.model.heads = a.heads;
    opts.model.vocab = a.vocab;
    opts.model.classes = a.classes;
    opts.torchscript = a.torchscript;
    opts.input_shape = a.input_shape;
    opts.batch_size = a.batch_size;
    opts.mode = a.mode.parse().map_err(anyhow::Error::msg)?;
    opts.optimizer = a.optimizer.parse().map_err(anyhow::Error::msg)?;
    opts.learning_rate = a.lr;
    opts.iterations = a.iterations;
    opts.amp = a.amp;
    opts.device = device_arg(a.device.as_deref())?;
    opts.max_events = a.max_events;
    opts.fragmentation = !a.no_fragmentation;
    opts.capture_tensors = !a.no_tensors;
    opts.capture_ops = !a.memory_only;
    opts.seed = a.seed;
    Ok(opts)
}

/// `collector trace --progress-json`: one JSON object per line on stdout.
fn emit(line: &protocol::ChildLine) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if serde_json::to_writer(&mut out, line).is_ok() {
        let _ = writeln!(out);
        let _ = out.flush();
    }
}

/// The class of a failed run, for `collector serve` to answer with (503, 422 or 500).
#[cfg(feature = "tracing")]
fn error_class(e: &collector::run::RunError) -> protocol::FailureClass {
    use collector::models::ModelError;
    use collector::run::RunError;
    use protocol::FailureClass;
    match e {
        RunError::NoCuda(_) => FailureClass::NoCuda,
        RunError::Invalid(_) | RunError::Model(ModelError::Unknown(_) | ModelError::BadShape { .. } | ModelError::BadOption { .. }) => {
            FailureClass::Invalid
        }
        RunError::Model(ModelError::TorchScript { .. }) => FailureClass::Model,
        RunError::Torch(m) => FailureClass::of_torch_error(m),
        RunError::Capture(_) => FailureClass::Internal,
    }
}

#[cfg(feature = "tracing")]
fn trace_json_command(a: TraceArgs) -> anyhow::Result<()> {
    use protocol::ChildLine;
    use protocol::FailureClass;
    let fail = |class: FailureClass, detail: String| -> anyhow::Result<()> {
        emit(&ChildLine::Error { class, detail: detail.clone() });
        anyhow::bail!(detail)
    };
    let mut opts = match run_options(a.run) {
        Ok(o) => o,
        Err(e) => return fail(FailureClass::Invalid, format!("{e:#}")),
    };
    opts.live_memory = true;
    let Some(output) = a.output else {
        return fail(FailureClass::Invalid, "--progress-json needs --output".into());
    };
    let format = match resolve_format(a.format.as_deref(), &output) {
        Ok(f) => f,
        Err(e) => return fail(FailureClass::Invalid, format!("{e:#}")),
    };
    let started = std::time::Instant::now();
    let trace = collector::run::trace_model(&opts, &mut |p| {
        use collector::run::Progress;
        emit(&match p {
            Progress::Started { iterations } => ChildLine::Started { iterations },
            Progress::Iteration { done, of, seconds } => ChildLine::Iteration { done, of, seconds },
            Progress::Memory { points } => ChildLine::Memory { points, rank: None },
        });
    });
    let trace = match trace {
        Ok(t) => t,
        Err(e) => return fail(error_class(&e), e.to_string()),
    };
    let ms = started.elapsed().as_secs_f64() * 1e3;
    if let Err(e) = write_export(&trace, format, &output) {
        return fail(FailureClass::Internal, format!("{e:#}"));
    }
    emit(&ChildLine::Done { info: protocol::trace_info(&trace, &opts.model.name, ms) });
    Ok(())
}

/// What to name a command's trace: its script (`train.py` → `train`, also under torchrun), else
/// its `-m` module (`memory_tracer.zoo` → `memory_tracer_zoo`), else its program.
fn program_stem(command: &[String]) -> String {
    let stem = |s: &str| std::path::Path::new(s).file_stem().map_or_else(|| s.to_owned(), |f| f.to_string_lossy().into_owned());
    if let Some(script) = command.iter().skip(1).find(|s| s.ends_with(".py")) {
        return stem(script);
    }
    let launchers = ["torch.distributed.run", "torch.distributed.launch"];
    let module = command.windows(2).filter(|w| w[0] == "-m" && !launchers.contains(&w[1].as_str())).map(|w| w[1].replace('.', "_")).next();
    module.unwrap_or_else(|| command.first().map_or_else(|| "program".into(), |p| stem(p)))
}

/// `run.mtrace.json` → (`run`, `mtrace.json`); `run.json` → (`run`, `json`): where a rank's tag
/// goes in a file name.
fn split_extension(name: &str) -> (&str, &str) {
    for ext in [".mtrace.json.gz", ".mtrace.json", ".speedscope.json", ".timeline.json", ".chrome.json"] {
        if let Some(stem) = name.strip_suffix(ext) {
            return (stem, &ext[1..]);
        }
    }
    name.rsplit_once('.').unwrap_or((name, "mtrace.json"))
}

/// `collector trace -- COMMAND`: runs the program with the capture injected, writes one trace
/// per traced process, and exits with the program's exit code.
fn python_trace_command(a: TraceArgs) -> anyhow::Result<()> {
    use collector::pyrun::{self, PyOptions};
    use protocol::ChildLine;
    let opts = PyOptions {
        max_events: a.run.max_events,
        capture_tensors: !a.run.no_tensors,
        ops: if a.run.memory_only {
            pyrun::OpsMode::None
        } else {
            a.ops.as_deref().unwrap_or("backward").parse().map_err(anyhow::Error::msg)?
        },
        iteration_marker: a.iteration_marker.clone(),
        buffer_records: a.buffer_records,
        drain_interval_ms: a.drain_interval_ms.max(1),
        fragmentation: !a.run.no_fragmentation,
        device: a.run.device.as_deref().map(str::parse).transpose().map_err(anyhow::Error::msg)?,
        ..PyOptions::default()
    };
    let default_name = || PathBuf::from(format!("{}.mtrace.json", program_stem(&a.command)));
    // `-o run/` (or an existing folder): the traces go in it, named after the program.
    let output = match a.output.clone() {
        Some(o) if o.is_dir() || o.as_os_str().to_string_lossy().ends_with('/') => {
            std::fs::create_dir_all(&o).with_context(|| format!("cannot create the folder {}", o.display()))?;
            o.join(default_name())
        }
        Some(o) => o,
        None => default_name(),
    };
    let format = resolve_format(a.format.as_deref(), &output)?;
    if a.progress_json {
        emit(&ChildLine::Started { iterations: 0 });
    }
    let started = std::time::Instant::now();
    let live = match &a.serve {
        Some(server) => {
            let what = output.file_stem().map_or_else(|| "program".into(), |s| s.to_string_lossy().trim_end_matches(".mtrace").to_owned());
            match pyrun::LiveClient::start(server, a.serve_token.as_deref(), &what) {
                Ok(c) => {
                    eprintln!("collector: follow it live at {}", c.viewer_link());
                    Some(c)
                }
                Err(e) => {
                    eprintln!("collector: {e:#}; tracing without the server");
                    None
                }
            }
        }
        None => None,
    };
    let outcome = pyrun::run(&a.command, &opts, &mut |rank, points| {
        if a.progress_json {
            emit(&ChildLine::Memory { points: points.to_vec(), rank });
        }
        if let Some(c) = &live {
            c.send(rank, points);
        }
    })?;
    let mut live = live;
    let code = outcome.exit_code();
    let mut notes: Vec<String> = outcome.processes.iter().flat_map(pyrun::notes_text).collect();
    let mut traced: Vec<_> = outcome.processes.into_iter().filter(pyrun::has_capture).collect();
    traced.sort_by_key(|p| (pyrun::rank(p).unwrap_or(u64::MAX), p.pid().unwrap_or(0)));
    // Ranks of a torchrun job are merged even when only one could be traced, so that the
    // merged trace names the missing ones.
    let world = traced.iter().find_map(pyrun::world_size);
    let many = traced.len() > 1 || world.is_some();
    let mut written = 0;
    // What to report and store at the end: the one trace, or the ranks merged.
    let mut finals: Vec<(shared::Trace, String, PathBuf)> = Vec::new();
    let mut ranks: Vec<shared::merge::MergeInput> = Vec::new();
    let mut missing = std::collections::BTreeMap::new();
    for (k, p) in traced.into_iter().enumerate() {
        let rank = pyrun::rank(&p);
        let pid = p.pid().unwrap_or(0);
        let out = if many {
            let name = output.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
            let tag = rank.map_or_else(|| format!("pid{pid}"), |r| format!("rank{r}"));
            let (stem, ext) = split_extension(&name);
            output.with_file_name(format!("{stem}.{tag}.{ext}"))
        } else {
            output.clone()
        };
        let program = pyrun::program_name(&p);
        let rank = rank.and_then(|r| u32::try_from(r).ok()).unwrap_or(k as u32);
        let trace = match pyrun::build_trace(p, &opts) {
            Ok(t) => t,
            Err(e) => {
                notes.push(format!("process {pid}: {e}"));
                missing.insert(rank, format!("its trace could not be built: {e}"));
                continue;
            }
        };
        let bytes = write_export(&trace, format, &out)?;
        eprintln!(
            "collector: wrote {} ({}, {} events) to {}",
            shared::units::format_bytes(bytes),
            format.name(),
            trace.events.len(),
            out.display()
        );
        written += 1;
        if many {
            ranks.push(shared::merge::MergeInput { trace, rank, label: out.display().to_string() });
        } else {
            finals.push((trace, program, out));
        }
    }
    if !ranks.is_empty() {
        let program = ranks[0].trace.meta.model.clone().unwrap_or_else(|| "program".into());
        for r in 0..world.unwrap_or(0) {
            if !ranks.iter().any(|i| i.rank == r) {
                missing
                    .entry(r)
                    .or_insert_with(|| "its process streamed no trace (it did not start, did not import torch, or died before)".into());
            }
        }
        let merge_opts = shared::merge::MergeOptions { missing_reasons: missing, ..Default::default() };
        match shared::merge::merge_with(std::mem::take(&mut ranks), &merge_opts) {
            Ok(merged) => {
                let bytes = write_export(&merged, format, &output)?;
                eprintln!(
                    "collector: wrote {} ({}, {} ranks merged, {} events) to {}",
                    shared::units::format_bytes(bytes),
                    format.name(),
                    shared::merge::ranks(&merged).len(),
                    merged.events.len(),
                    output.display()
                );
                for r in &merged.meta.missing_ranks {
                    let why = merge_opts.missing_reasons.get(r).map_or("no trace of it", String::as_str);
                    notes.push(format!("rank {r} is missing from the merged trace: {why}"));
                }
                finals.push((merged, program, output.clone()));
            }
            Err(e) => notes.push(format!("the ranks' traces could not be merged: {e}")),
        }
    }
    for (trace, program, out) in &finals {
        if a.progress_json {
            emit(&ChildLine::Done { info: protocol::trace_info(trace, program, started.elapsed().as_secs_f64() * 1e3) });
        } else if !a.quiet {
            print_summary(trace, a.top, false, std::io::stderr().lock()).context("cannot print the summary")?;
        }
        if let Some(server) = &a.serve {
            let stored = match live.take() {
                Some(c) => c.finish(Some(out), ""),
                None => pyrun::upload(server, a.serve_token.as_deref(), out, None).map(|(_, link)| link),
            };
            match stored {
                Ok(link) => eprintln!("collector: stored in {server}; open {link}"),
                Err(e) => eprintln!("collector: {e:#} (the trace is still in {})", out.display()),
            }
        }
    }
    for n in &notes {
        eprintln!("collector: {n}");
    }
    if written == 0 {
        let why = "no process of the command imported torch with the capture (is it a Python program using torch? `python -I`/`-E` ignore PYTHONPATH)";
        if a.progress_json {
            emit(&ChildLine::Error {
                class: protocol::FailureClass::Invalid,
                detail: notes.first().cloned().unwrap_or_else(|| why.into()),
            });
        }
        eprintln!("collector: nothing was traced: {why}");
        if let Some(c) = live.take() {
            let _ = c.finish(None, &format!("nothing was traced: {why}"));
        }
        std::process::exit(if code == 0 { 1 } else { code });
    }
    if outcome.interrupted {
        eprintln!("collector: interrupted; the trace holds what ran until then");
    }
    std::process::exit(code);
}

#[cfg(not(feature = "tracing"))]
fn trace_command(a: TraceArgs) -> anyhow::Result<()> {
    if !a.command.is_empty() {
        return python_trace_command(a);
    }
    anyhow::bail!("this collector was built without libtorch: it traces Python programs (`collector trace -- python train.py`) but not built-in models")
}

#[cfg(feature = "tracing")]
fn trace_command(a: TraceArgs) -> anyhow::Result<()> {
    use collector::run;
    if !a.command.is_empty() {
        return python_trace_command(a);
    }
    if a.progress_json {
        return trace_json_command(a);
    }
    let opts = run_options(a.run)?;
    let output = a.output.unwrap_or_else(|| {
        let stem = opts
            .torchscript
            .as_ref()
            .and_then(|p| p.file_stem())
            .map_or_else(|| opts.model.name.clone(), |s| s.to_string_lossy().into_owned());
        PathBuf::from(format!("{stem}.mtrace.json"))
    });
    let format = resolve_format(a.format.as_deref(), &output)?;
    let quiet = a.quiet;
    eprintln!("tracing {} on {} ...", opts.torchscript.as_ref().map_or(opts.model.name.clone(), |p| p.display().to_string()), opts.device);
    let mut bar = collector::commands::ProgressBar::new(quiet);
    let trace = run::trace_model(&opts, &mut |p| bar.update(p))?;
    bar.finish();
    let bytes = write_export(&trace, format, &output)?;
    print_summary(&trace, a.top, false, std::io::stdout().lock()).context("cannot print the summary")?;
    let f = trace.memory_footprint();
    eprintln!(
        "in memory: {:.1} B per memory event ({} events), {} for the whole trace with {} ops and {} tensor references",
        f.event_bytes_per_event(),
        f.events,
        shared::units::format_bytes(f.total() as u64),
        trace.ops.len(),
        trace.tensors.len()
    );
    eprintln!("wrote {} ({}) to {}", shared::units::format_bytes(bytes), format.name(), output.display());
    Ok(())
}

fn ingest_command(fd: i32, output: &std::path::Path, stats_json: bool, device: Option<&str>, no_fragmentation: bool) -> anyhow::Result<()> {
    use collector::pyrun;
    use shared::analysis;
    let opts = pyrun::PyOptions {
        device: device.map(str::parse).transpose().map_err(anyhow::Error::msg)?,
        fragmentation: !no_fragmentation,
        ..pyrun::PyOptions::default()
    };
    let stream = pyrun::ingest_fd(fd)?;
    if let Some(e) = stream.error.as_ref().filter(|_| stream.records.is_empty()) {
        anyhow::bail!("the capture stream broke before any record arrived: {e}");
    }
    let trace = pyrun::build_trace(stream, &opts).map_err(anyhow::Error::msg)?;
    write_export(&trace, shared::export::ExportFormat::Native, output)?;
    if stats_json {
        let layers = analysis::layer_stats(&trace);
        let j = serde_json::json!({
            "summary": analysis::summary(&trace),
            "layer_stats": layers,
            "peak_memory_per_layer": analysis::peak_memory_per_layer(&trace),
            "fragmentation": analysis::fragmentation_stats_with_layers(&trace, &layers),
            "warnings": trace.meta.warnings,
            "reported": trace.meta.reported,
            "trace_path": output,
        });
        println!("{j}");
    }
    Ok(())
}

fn import_options(max_decompressed_mib: u64) -> ImportOptions {
    let mut o = ImportOptions::default();
    o.max_decompressed_bytes = max_decompressed_mib.saturating_mul(1 << 20);
    o
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Trace(a) => trace_command(*a)?,
        Command::PythonPackage { out } => {
            let so =
                collector::pyrun::package::SHIM_SO.context("this collector was built without libtorch and carries no capture library")?;
            collector::pyrun::package::write_to(&out, so)?;
            eprintln!("wrote the memory_tracer package to {}", out.display());
        }
        Command::Ingest { fd, output, stats_json, device, no_fragmentation } => {
            ingest_command(fd, &output, stats_json, device.as_deref(), no_fragmentation)?
        }
        #[cfg(feature = "tracing")]
        Command::Overhead { model, input_shape, batch_size, steps, warmup, device, no_tensors, memory_only } => {
            use collector::run;
            let mut opts = run::RunOptions::new(&model);
            opts.input_shape = input_shape;
            opts.batch_size = Some(batch_size);
            opts.capture_tensors = !no_tensors;
            opts.capture_ops = !memory_only;
            opts.device = device_arg(device.as_deref())?;
            let report = run::overhead_benchmark(&opts, steps, warmup)?;
            println!("{}", serde_json::to_string_pretty(&report)?);
        }
        Command::Convert { input, output, format, max_decompressed_mib } => {
            let format = resolve_format(format.as_deref(), &output)?;
            let trace = load_trace(&input, &import_options(max_decompressed_mib))?;
            let bytes = write_export(&trace, format, &output)?;
            eprintln!(
                "wrote {} ({}, {} events) to {}",
                shared::units::format_bytes(bytes),
                format.name(),
                trace.events.len(),
                output.display()
            );
        }
        Command::Analyze { input, output, prefix, max_decompressed_mib } => {
            let mut trace = load_trace(&input, &import_options(max_decompressed_mib))?;
            if trace.meta.model.is_none() {
                // Chart titles name the model; a profiler trace does not, so use the file name.
                trace.meta.model = input.file_name().map(|n| n.to_string_lossy().into_owned());
            }
            let analysis =
                collector::analyze::analyze(&trace, &output, &prefix).with_context(|| format!("cannot analyze {}", input.display()))?;
            collector::analyze::print_profile(&analysis.profile, std::io::stdout().lock())?;
            for f in &analysis.files {
                eprintln!("wrote {}", f.display());
            }
        }
        #[cfg(feature = "tracing")]
        Command::Sweep(a) => sweep_command(*a)?,
        Command::Report { input, output, single_file, max_decompressed_mib } => {
            // Import first: a file the viewer cannot open makes no report.
            let trace = load_trace(&input, &import_options(max_decompressed_mib))?;
            let bytes = std::fs::read(&input).with_context(|| format!("cannot read {}", input.display()))?;
            if single_file {
                collector::report::write_single_file(&input, &bytes, &output)?;
                eprintln!("wrote {} ({} events): open it in a browser", output.display(), trace.events.len());
            } else {
                let files = collector::report::write_folder(&input, &bytes, &output)?;
                eprintln!(
                    "wrote {} files ({} events) to {}: serve the folder from any static host (python3 -m http.server -d {}) and open index.html",
                    files.len(),
                    trace.events.len(),
                    output.display(),
                    output.display()
                );
            }
        }
        Command::Serve(a) => serve_command(*a)?,
        Command::ServeWorker(a) => {
            use collector::serve::isolate::{run_worker, WorkerTask};
            let task = match a.task {
                ServeWorkerTask::Import { file, model_name, what } => WorkerTask::Import { file, what, model_name },
                ServeWorkerTask::Export { file, out, format } => WorkerTask::Export { file, format, out },
            };
            let code = run_worker(task, a.memory_budget_bytes, a.cpu_seconds, a.max_decompressed_bytes);
            std::process::exit(code);
        }
        Command::Leaks(LeaksArgs { report: Report { input, json, top, max_decompressed_mib }, iterations_at }) => {
            let trace = load_trace(&input, &import_options(max_decompressed_mib))?;
            let opts = shared::analysis::leaks::LeakOptions { top, boundaries_s: iterations_at };
            let r = shared::analysis::leaks::leaks_with(&trace, &opts);
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                collector::commands::print_leaks(&r, std::io::stdout().lock())?;
            }
        }
        Command::Diff(DiffArgs { a, b, json, top, device_a, device_b, max_decompressed_mib }) => {
            let options = import_options(max_decompressed_mib);
            let (ta, tb) = (load_trace(&a, &options)?, load_trace(&b, &options)?);
            let d = shared::analysis::diff::diff_devices(&ta, device_a, &tb, device_b)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&d)?);
            } else {
                let labels = (a.display().to_string(), b.display().to_string());
                collector::commands::print_diff(&d, (&labels.0, &labels.1), top, std::io::stdout().lock())?;
            }
        }
        Command::Advise(a) => advise_command(a)?,
        Command::Merge { inputs, output, ranks, allow_disjoint, format, max_decompressed_mib } => {
            let format = resolve_format(format.as_deref(), &output)?;
            if let Some(r) = ranks.as_ref().filter(|r| r.len() != inputs.len()) {
                anyhow::bail!("--ranks gives {} ranks for {} inputs; expected one per input", r.len(), inputs.len());
            }
            let mut merge_inputs = Vec::new();
            for (k, path) in inputs.iter().enumerate() {
                let trace = load_trace(path, &import_options(max_decompressed_mib))?;
                let rank = match &ranks {
                    Some(r) => r[k],
                    None => shared::rank_files::rank_of(&trace, &path.to_string_lossy()).unwrap_or(k as u32),
                };
                merge_inputs.push(shared::merge::MergeInput { trace, rank, label: path.display().to_string() });
            }
            let opts = shared::merge::MergeOptions { allow_disjoint, ..Default::default() };
            let merged = shared::merge::merge_with(merge_inputs, &opts)?;
            let bytes = write_export(&merged, format, &output)?;
            print_summary(&merged, 5, false, std::io::stderr().lock())?;
            eprintln!(
                "wrote {} ({}, {} ranks, {} events) to {}",
                shared::units::format_bytes(bytes),
                format.name(),
                inputs.len(),
                merged.events.len(),
                output.display()
            );
        }
        Command::Summary(Report { input, json, top, max_decompressed_mib }) => {
            let trace = load_trace(&input, &import_options(max_decompressed_mib))?;
            print_summary(&trace, top, json, std::io::stdout().lock()).context("cannot print the summary")?;
        }
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
