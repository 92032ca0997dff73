//! Requests and answers of `collector serve`'s HTTP API (`/api/...`), as the server, the
//! viewer and the tests (de)serialise them.

use crate::jobs::JobRow;
use crate::trace::Origin;
use serde::{Deserialize, Serialize};

fn default_max_events() -> u64 {
    TraceRequest::DEFAULT_MAX_EVENTS
}

impl TraceRequest {
    /// `max_events` when a request leaves it out.
    pub const DEFAULT_MAX_EVENTS: u64 = 10_000;

    /// A request for `model_name` with every other field as a request that leaves it out gets
    /// it, but `max_events`.
    pub fn of_model(model_name: &str, max_events: u64) -> Self {
        Self {
            model_name: model_name.to_owned(),
            input_shape: None,
            batch_size: None,
            max_events,
            enable_fragmentation: true,
            device: None,
            mode: None,
            iterations: None,
            optimizer: None,
            world_size: None,
            strategy: None,
        }
    }
}

fn yes() -> bool {
    true
}

/// `POST /api/trace/memory`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TraceRequest {
    /// A built-in model (resnet18, resnet34, resnet50, resnet101, resnet152, vgg16,
    /// transformer, gpt, mlp) or a TorchScript model of the server's `--models-dir`.
    #[cfg_attr(feature = "openapi", schema(example = "resnet18"))]
    pub model_name: String,
    /// The full input shape, batch first, as `collector trace --input-shape`: `[8, 3, 224,
    /// 224]` (images), `[8, 512]` (token ids of transformer/gpt), `[4, 128, 512]` (transformer
    /// embeddings: batch, sequence, width), `[64, 784]` (mlp features). Default: the model's.
    #[cfg_attr(feature = "openapi", schema(example = json!([8, 3, 224, 224])))]
    pub input_shape: Option<Vec<i64>>,
    /// Replaces the first dimension of `input_shape` (or of the model's default shape).
    #[cfg_attr(feature = "openapi", schema(example = 8))]
    pub batch_size: Option<i64>,
    /// Allocations and frees to keep; later ones are counted in `dropped_events`.
    #[serde(default = "default_max_events")]
    pub max_events: u64,
    /// False reports fragmentation as 0.
    #[serde(default = "yes")]
    pub enable_fragmentation: bool,
    /// `cpu`, `cuda` or `cuda:N`. Default: the server's device.
    pub device: Option<String>,
    /// `train` (forward, backward, SGD step; the default) or `infer`.
    pub mode: Option<String>,
    /// Iterations (default 3; the first warms the caching allocator).
    pub iterations: Option<u32>,
    /// `sgd` (momentum 0.9, the default), `adam` or `adamw`.
    #[cfg_attr(feature = "openapi", schema(example = "adamw"))]
    pub optimizer: Option<String>,
    /// Processes of a distributed job (2 or more; default 1): the built-in model runs under
    /// torchrun, one rank per device (`cuda:0` to `cuda:N-1`, NCCL) or N ranks on the CPU
    /// (gloo), each with the whole `input_shape`. The stored trace has every rank.
    #[cfg_attr(feature = "openapi", schema(example = 2))]
    pub world_size: Option<u32>,
    /// With `world_size`: `ddp` (DistributedDataParallel, the default) or `fsdp` (FSDP2).
    #[cfg_attr(feature = "openapi", schema(example = "fsdp"))]
    pub strategy: Option<String>,
}

/// `POST /api/trace/live`: announce a trace recorded elsewhere (`collector trace --serve`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LiveRequest {
    /// What runs (a script's name), shown in the job list.
    #[cfg_attr(feature = "openapi", schema(example = "train.py"))]
    pub model_name: String,
    /// Where it runs, shown in the job list. Default: `external`.
    pub device: Option<String>,
    /// The job several nodes share (`collector trace --job`, or derived from torchrun's
    /// rendezvous): a request naming the job of a running live trace joins it (same
    /// `trace_id`), and the trace is stored once every node uploaded its part. Absent: a live
    /// trace of its own, as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(example = "torchrun:10.0.0.1:29500"))]
    pub job: Option<String>,
    /// With `job`: how many nodes run it (each uploads a part). Default: 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nnodes: Option<u32>,
    /// With `job`: this node's rank, 0 to `nnodes` − 1. Default: 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_rank: Option<u32>,
    /// With `job`: how long the server waits, once the first node's part (or failure) came,
    /// for the other nodes' parts before it stores what it has, naming the absent nodes'
    /// ranks as missing. Default: 300 s; at most the server's `--job-timeout-s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_wait_s: Option<u64>,
}

/// The answer to a live trace's progress line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LiveAccepted {
    pub trace_id: String,
    /// `running`, or `failed` after an `error` line.
    pub status: String,
}

/// The most memory points one live line may carry.
pub const MAX_LIVE_POINTS: usize = 1024;

/// `?wait=false`: answer 202 at once and follow the job through its events.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
pub struct WaitQuery {
    /// `false`: do not wait for the trace (202 with the trace id).
    pub wait: Option<bool>,
}

/// The answer of `POST /api/trace/memory?wait=false`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobAccepted {
    pub trace_id: String,
    /// `queued` or `running`.
    pub status: String,
    /// Server-Sent Events of the run.
    pub events_url: String,
    /// The trace, once done.
    pub trace_url: String,
}

/// The body of `POST /api/trace/diff`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DiffRequest {
    /// Trace A's id.
    pub a: String,
    /// Trace B's id; changes are B − A.
    pub b: String,
    /// Device of A to compare: an index into its devices (a rank of a merged trace). Default:
    /// the device with the highest allocated peak.
    pub device_a: Option<u8>,
    /// Device of B to compare. Default: the device with the highest allocated peak.
    pub device_b: Option<u8>,
}

/// `POST /api/trace/export`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExportRequest {
    pub trace_id: String,
    /// `speedscope`, `timeline`, `chrome` (Perfetto), `csv`, `native` or `dftracer` (`.pfw.gz`).
    #[cfg_attr(feature = "openapi", schema(example = "speedscope"))]
    pub format: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExportResponse {
    pub trace_id: String,
    pub format: String,
    /// `/api/trace/download/<file>`.
    pub download_url: String,
    pub file_size_bytes: u64,
}

/// `GET /api/trace/list`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ListResponse {
    /// Stored trace ids, oldest first.
    pub active_traces: Vec<String>,
    pub count: usize,
    /// One row per stored trace (same order), for the viewer's list.
    pub traces: Vec<TraceRow>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TraceRow {
    pub trace_id: String,
    pub model_name: String,
    pub origin: Origin,
    pub original_name: Option<String>,
    pub created_unix_ms: u64,
    pub file_size_bytes: u64,
    pub total_events: usize,
    pub peak_allocated_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub device: Option<String>,
    pub source_format: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeleteResponse {
    pub message: String,
    pub remaining_traces: usize,
}

/// Where to stream an upload: a multipart form's file field or the raw body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
pub struct UploadQuery {
    /// The file's name (for a raw body): kept for downloads and shown in lists.
    pub filename: Option<String>,
    /// The id of a live trace (`POST /api/trace/live`) this upload completes.
    pub trace_id: Option<String>,
    /// With `trace_id` of a job of several nodes: the node whose part this is. The part is
    /// kept until every node's part came (answered 202 with [`NodePartAccepted`]); the last
    /// one is answered with the merged trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<u32>,
}

/// `POST /api/trace/live/{trace_id}` query: which node of a job of several sends the line
/// (an `error` line then ends that node's part only).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
pub struct LiveLineQuery {
    /// The node's rank, as in `POST /api/trace/live`'s `node_rank`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<u32>,
}

/// The answer to a node's part of a job of several nodes that others have yet to send.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodePartAccepted {
    /// The job's live trace; the merged trace is stored under this id.
    pub trace_id: String,
    /// The node whose part was accepted.
    pub node: u32,
    /// `waiting`: the part is kept until the other nodes' parts come.
    pub status: String,
    /// The nodes whose parts (or failures) have not come yet.
    pub waiting_for: Vec<u32>,
    /// How long the server waits for them at most, in seconds from the first part.
    pub wait_s: u64,
}

/// `GET /api/jobs`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobsResponse {
    pub jobs: Vec<JobRow>,
    pub running: usize,
    pub queued: usize,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HealthResponse {
    /// `healthy`.
    pub status: String,
    /// The device requests run on when they name none.
    pub device: String,
    pub version: String,
    pub cuda_available: bool,
    pub cuda_device_count: u32,
    /// False when this collector was built without libtorch (uploads and exports only).
    pub tracing_available: bool,
    pub torch_version: Option<String>,
    pub jobs_running: usize,
    pub jobs_queued: usize,
    pub stored_traces: usize,
    pub store_bytes: u64,
    /// The models requests may name (built-in, then `--models-dir`'s TorchScript files).
    pub models: Vec<String>,
}

/// The query of `GET /api/trace/{trace_id}/advice`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::IntoParams))]
pub struct AdviceQuery {
    /// The memory the run must fit in: bytes, or a size such as `6GiB`, `512MiB`, `1.5GB`.
    /// Without it: the best few changes.
    pub budget: Option<String>,
    /// How many suggestions and checkpoint candidates to list (default 10).
    pub top: Option<usize>,
}
