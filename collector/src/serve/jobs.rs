//! Trace jobs: a bounded queue, at most `--jobs-per-device` runs per device at a time, each in
//! its own `collector trace` process.
//!
//! A child process per job keeps the server whole whatever the model does: CUDA running out
//! of memory, a libtorch abort or a crash ends the child, the job answers a clear error, and
//! the device memory goes back to the driver with the process. The child reports progress
//! as JSON lines on stdout (`collector trace --progress-json`), which the job republishes to
//! its followers (Server-Sent Events).

use super::fault::{blocking, Fault};
use super::store::{Store, StoreError};
use protocol::{ChildLine, FailureClass, JobRow, JobState, LiveEvent, Origin, TraceResponse};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::io::{AsyncBufReadExt, AsyncReadExt};
use tokio::sync::{broadcast, watch, Semaphore};

/// The built-in models a request may name.
pub const MODELS: [&str; 9] = protocol::MODEL_ZOO;

/// What one job runs.
#[derive(Clone, Debug)]
pub struct JobSpec {
    pub model: String,
    /// A TorchScript file from `--models-dir` (then `model` is its name).
    pub torchscript: Option<std::path::PathBuf>,
    /// The full shape, batch first, when the request gave one.
    pub input_shape: Option<Vec<i64>>,
    /// The batch size over the model's default shape.
    pub batch_size: Option<i64>,
    /// `cpu` or `cuda:N`.
    pub device: String,
    pub mode: String,
    pub iterations: u32,
    pub max_events: u64,
    pub fragmentation: bool,
    /// `sgd`, `adam` or `adamw`.
    pub optimizer: String,
    /// A torchrun job of several ranks instead of one process.
    pub distributed: Option<Distributed>,
}

/// A built-in model run by `world_size` ranks under torchrun
/// (`python -m memory_tracer.zoo`, traced by `collector trace -- ...`).
#[derive(Clone, Debug)]
pub struct Distributed {
    pub world_size: u32,
    /// `ddp` or `fsdp`.
    pub strategy: String,
    /// The Python with torch that runs torchrun.
    pub python: std::path::PathBuf,
}

impl JobSpec {
    fn args(&self, output: &std::path::Path) -> Vec<String> {
        match &self.distributed {
            Some(d) => self.torchrun_args(d, output),
            None => self.process_args(output),
        }
    }

    /// `collector trace -- python -m torch.distributed.run ... -m memory_tracer.zoo ...`.
    fn torchrun_args(&self, d: &Distributed, output: &std::path::Path) -> Vec<String> {
        let mut a: Vec<String> = vec!["trace".into(), "--progress-json".into(), "--format".into(), "native".into(), "--output".into()];
        a.push(output.display().to_string());
        a.extend(["--max-events".into(), self.max_events.to_string()]);
        if !self.fragmentation {
            a.push("--no-fragmentation".into());
        }
        a.extend(["--".into(), d.python.display().to_string()]);
        a.extend(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node"].map(String::from));
        a.push(d.world_size.to_string());
        a.extend(["-m", "memory_tracer.zoo", "--model"].map(String::from));
        a.push(self.model.clone());
        let kind = if self.device.starts_with("cuda") { "cuda" } else { "cpu" };
        for (flag, value) in
            [("--strategy", &d.strategy), ("--device", &kind.to_owned()), ("--mode", &self.mode), ("--optimizer", &self.optimizer)]
        {
            a.extend([flag.to_owned(), value.clone()]);
        }
        a.extend(["--iterations".into(), self.iterations.to_string()]);
        self.shape_args(&mut a);
        a
    }

    fn process_args(&self, output: &std::path::Path) -> Vec<String> {
        let mut a: Vec<String> = match &self.torchscript {
            Some(p) => vec!["trace".into(), "--torchscript".into(), p.display().to_string()],
            None => vec!["trace".into(), "--model".into(), self.model.clone()],
        };
        a.extend([
            "--device".into(),
            self.device.clone(),
            "--mode".into(),
            self.mode.clone(),
            "--iterations".into(),
            self.iterations.to_string(),
            "--optimizer".into(),
            self.optimizer.clone(),
            "--max-events".into(),
            self.max_events.to_string(),
            "--format".into(),
            "native".into(),
            "--output".into(),
            output.display().to_string(),
            "--progress-json".into(),
        ]);
        self.shape_args(&mut a);
        if !self.fragmentation {
            a.push("--no-fragmentation".into());
        }
        a
    }

    /// `--input-shape` and `--batch-size`, spelled alike by `collector trace` and the zoo.
    fn shape_args(&self, a: &mut Vec<String>) {
        if let Some(s) = &self.input_shape {
            a.push("--input-shape".into());
            a.push(s.iter().map(i64::to_string).collect::<Vec<_>>().join(","));
        }
        if let Some(b) = self.batch_size {
            a.push("--batch-size".into());
            a.push(b.to_string());
        }
    }
}

#[derive(Clone, Debug)]
enum Outcome {
    Pending,
    Done(TraceResponse),
    Failed(Fault),
}

/// What a job publishes to its followers: a wire event, or its failure, which the API layer
/// turns into `LiveEvent::Failed` with the status code it answers.
#[derive(Clone, Debug)]
pub enum JobEvent {
    Live(LiveEvent),
    Failed(Fault),
}

impl JobEvent {
    /// Whether nothing follows this event (the job is done or failed).
    pub fn is_terminal(&self) -> bool {
        match self {
            JobEvent::Live(e) => e.is_terminal(),
            JobEvent::Failed(_) => true,
        }
    }
}

/// A job and its followers.
#[derive(Debug)]
pub struct Job {
    id: String,
    spec: JobSpec,
    created: Instant,
    outcome: watch::Sender<Outcome>,
    /// Everything published so far (late followers replay it), and the channel; one lock so
    /// a follower neither misses nor repeats an event.
    log: Mutex<(Vec<JobEvent>, JobState, u32)>,
    tx: broadcast::Sender<JobEvent>,
    /// A live trace of several nodes: their parts, gathered until every node sent its own.
    nodes: Option<Mutex<NodeParts>>,
}

/// The parts of a live trace run on several nodes (`LiveRequest::job`), gathered until every
/// node sent its own or ended with an error, or the wait for the others ran out.
#[derive(Clone, Debug)]
pub struct NodeParts {
    /// The job's name, as every node gives it.
    pub job: String,
    /// How many nodes run the job.
    pub nnodes: u32,
    /// How long the others are waited for once the first part or failure came.
    pub wait: std::time::Duration,
    /// Nodes that announced themselves (`POST /api/trace/live`).
    pub joined: BTreeSet<u32>,
    /// Each node's uploaded part: a file in the store's temporary folder, and its name.
    pub parts: BTreeMap<u32, (std::path::PathBuf, String)>,
    /// Nodes that ended with an error instead of a part, and why.
    pub failed: BTreeMap<u32, String>,
    /// Whether the first part or failure came (the wait runs from then).
    pub waiting: bool,
    /// Set once the merge began: later parts are refused.
    pub merging: bool,
}

impl NodeParts {
    /// The nodes whose part or failure has not come.
    pub fn waiting_for(&self) -> Vec<u32> {
        (0..self.nnodes).filter(|k| !self.parts.contains_key(k) && !self.failed.contains_key(k)).collect()
    }

    /// Why the nodes without a part have none (empty when every node sent its part).
    pub fn absent(&self) -> Vec<String> {
        (0..self.nnodes)
            .filter(|k| !self.parts.contains_key(k))
            .map(|k| match self.failed.get(&k) {
                Some(why) => format!("node {k} failed: {why}"),
                None if self.joined.contains(&k) => format!("node {k} sent no part within {} s", self.wait.as_secs()),
                None => format!("node {k} never joined within {} s", self.wait.as_secs()),
            })
            .collect()
    }
}

/// How a node of a live trace of several nodes ended.
#[derive(Debug)]
pub enum NodeEnd {
    /// Its part: a file in the store's temporary folder, and the name it was sent under.
    Part(std::path::PathBuf, String),
    /// It failed, and why.
    Failed(String),
}

/// Where a live trace of several nodes is after a node's end.
#[derive(Debug)]
pub struct NodeProgress {
    /// The nodes still awaited.
    pub waiting_for: Vec<u32>,
    /// This was the first node to end: the wait for the others starts now.
    pub first: bool,
    /// How long the others are waited for.
    pub wait: std::time::Duration,
    /// Every node ended: the caller merges the parts (no other will).
    pub complete: bool,
}

impl Job {
    fn publish(&self, e: LiveEvent) {
        self.emit(JobEvent::Live(e));
    }

    fn emit(&self, e: JobEvent) {
        let mut log = self.log.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match &e {
            JobEvent::Live(LiveEvent::Status { state, .. }) => log.1 = *state,
            JobEvent::Live(LiveEvent::Iteration { done, .. }) => log.2 = *done,
            JobEvent::Live(LiveEvent::Done { .. }) => log.1 = JobState::Done,
            JobEvent::Live(LiveEvent::Failed { .. }) | JobEvent::Failed(_) => log.1 = JobState::Failed,
            _ => {}
        }
        log.0.push(e.clone());
        let _ = self.tx.send(e);
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// Whether this live trace gathers the parts of several nodes.
    pub fn is_multi_node(&self) -> bool {
        self.nodes.is_some()
    }

    fn nodes_lock(&self) -> Result<std::sync::MutexGuard<'_, NodeParts>, Fault> {
        let nodes = self.nodes.as_ref().ok_or_else(|| Fault::Rejected(format!("trace {} is not a job of several nodes", self.id)))?;
        Ok(nodes.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Records node `node`'s end (its part or its failure); refused when the node is not one
    /// of the job's, already ended, or the parts are being merged already.
    pub fn node_end(&self, node: u32, end: NodeEnd) -> Result<NodeProgress, Fault> {
        let mut n = self.nodes_lock()?;
        if node >= n.nnodes {
            return Err(Fault::Rejected(format!("node {node}: job {} runs on {} nodes (0 to {})", n.job, n.nnodes, n.nnodes - 1)));
        }
        if n.merging {
            return Err(Fault::Rejected(format!(
                "node {node} came too late: the parts of job {} are merged already (the wait of {} s for the nodes ran out)",
                n.job,
                n.wait.as_secs()
            )));
        }
        if n.parts.contains_key(&node) || n.failed.contains_key(&node) {
            return Err(Fault::Rejected(format!("node {node} of job {} ended already; expected one part per node", n.job)));
        }
        match end {
            NodeEnd::Part(file, name) => {
                n.parts.insert(node, (file, name));
            }
            NodeEnd::Failed(why) => {
                n.failed.insert(node, why);
            }
        }
        let first = !n.waiting;
        n.waiting = true;
        let waiting_for = n.waiting_for();
        let complete = waiting_for.is_empty();
        n.merging |= complete;
        Ok(NodeProgress { waiting_for, first, wait: n.wait, complete })
    }

    /// Claims the merge when the wait for the nodes ran out: the parts so far, unless a
    /// node's end claimed it first.
    pub fn claim_merge(&self) -> Option<NodeParts> {
        let mut n = self.nodes_lock().ok()?;
        if n.merging {
            return None;
        }
        n.merging = true;
        Some(n.clone())
    }

    /// The parts, once the merge is claimed.
    pub fn node_parts(&self) -> Result<NodeParts, Fault> {
        Ok(self.nodes_lock()?.clone())
    }

    /// What was published so far and a receiver for what comes next.
    pub fn follow(&self) -> (Vec<JobEvent>, broadcast::Receiver<JobEvent>) {
        let log = self.log.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        (log.0.clone(), self.tx.subscribe())
    }

    /// Waits for the job's end: its trace, or its error.
    pub async fn wait(&self) -> Result<TraceResponse, Fault> {
        let mut rx = self.outcome.subscribe();
        let end = rx.wait_for(|o| !matches!(o, Outcome::Pending)).await.map_err(|e| Fault::internal("the job vanished", e))?.clone();
        match end {
            Outcome::Done(r) => Ok(r),
            Outcome::Failed(f) => Err(f),
            Outcome::Pending => Err(Fault::internal("the job vanished", "no outcome")),
        }
    }

    fn row(&self) -> JobRow {
        let log = self.log.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let error = match &*self.outcome.borrow() {
            Outcome::Failed(f) => Some(f.to_string()),
            _ => None,
        };
        JobRow {
            trace_id: self.id.clone(),
            state: log.1,
            model_name: self.spec.model.clone(),
            device: self.spec.device.clone(),
            iterations_done: log.2,
            iterations: self.spec.iterations,
            age_s: self.created.elapsed().as_secs_f64(),
            error,
            world_size: self.spec.distributed.as_ref().map_or(1, |d| d.world_size),
            strategy: self.spec.distributed.as_ref().map(|d| d.strategy.clone()),
        }
    }
}

/// The job queue.
#[derive(Debug)]
pub struct Jobs {
    /// The collector binary children run (`None`: built without tracing).
    exe: Option<std::path::PathBuf>,
    /// Where finished traces go.
    store: Arc<Store>,
    /// `RLIMIT_AS` of CPU trace children (`--trace-memory-limit`), when set.
    address_space_bytes: Option<u64>,
    per_device: usize,
    max_queue: usize,
    timeout: std::time::Duration,
    slots: Mutex<HashMap<String, Arc<Semaphore>>>,
    queued: AtomicUsize,
    running: AtomicUsize,
    active: Mutex<HashMap<String, Arc<Job>>>,
    /// Recently finished jobs, newest last (followers and `GET /api/jobs` still see them).
    finished: Mutex<VecDeque<Arc<Job>>>,
    /// Mean run time of the last jobs, ms (for Retry-After).
    mean_ms: AtomicU64,
    /// Set when the server stops: no trace process starts after it.
    stopping: std::sync::atomic::AtomicBool,
}

const FINISHED_KEPT: usize = 100;

/// How many jobs run and wait, for how long, under what memory limit.
#[derive(Clone, Copy, Debug)]
pub struct JobLimits {
    /// Runs at a time per device.
    pub per_device: usize,
    /// Jobs that may wait; more are refused as busy.
    pub max_queue: usize,
    /// A run's longest time; it is stopped after it.
    pub timeout: std::time::Duration,
    /// `RLIMIT_AS` of CPU trace children, when set.
    pub address_space_bytes: Option<u64>,
}

impl Jobs {
    pub fn new(exe: Option<std::path::PathBuf>, store: Arc<Store>, limits: JobLimits) -> Self {
        let JobLimits { per_device, max_queue, timeout, address_space_bytes } = limits;
        Self {
            exe,
            store,
            address_space_bytes,
            per_device: per_device.max(1),
            max_queue,
            timeout,
            slots: Mutex::new(HashMap::new()),
            queued: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            active: Mutex::new(HashMap::new()),
            finished: Mutex::new(VecDeque::new()),
            mean_ms: AtomicU64::new(5_000),
            stopping: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// From now on no trace process starts (the server is stopping).
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    /// (running, queued).
    pub fn counts(&self) -> (usize, usize) {
        (self.running.load(Ordering::Relaxed), self.queued.load(Ordering::Relaxed))
    }

    /// The job `id`, running or finished. Both lists are held at once (`active`, then
    /// `finished`, the order [`Self::finish`] takes them in): a job that ends meanwhile is found
    /// in one of them, never in neither.
    pub fn get(&self, id: &str) -> Option<Arc<Job>> {
        let active = self.active.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(j) = active.get(id) {
            return Some(j.clone());
        }
        self.finished.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter().find(|j| j.id == id).cloned()
    }

    pub fn rows(&self) -> Vec<JobRow> {
        let active = self.active.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut rows: Vec<JobRow> = active.values().map(|j| j.row()).collect();
        rows.extend(self.finished.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter().rev().map(|j| j.row()));
        drop(active);
        rows.sort_by(|a, b| a.trace_id.cmp(&b.trace_id));
        rows
    }

    /// Drops a finished job whose trace was evicted or deleted (its events then answer 404).
    pub fn forget(&self, id: &str) {
        self.finished.lock().unwrap_or_else(std::sync::PoisonError::into_inner).retain(|j| j.id != id);
    }

    /// Queues a job, or answers 429 (with Retry-After) when `max_queue` jobs already wait.
    pub fn submit(self: &Arc<Self>, id: String, spec: JobSpec) -> Result<Arc<Job>, Fault> {
        let Some(exe) = self.exe.clone() else {
            return Err(Fault::Unavailable(
                "this collector was built without tracing (libtorch); it stores, exports and serves traces only".into(),
            ));
        };
        let waiting = self.queued.fetch_add(1, Ordering::SeqCst);
        if waiting >= self.max_queue {
            self.queued.fetch_sub(1, Ordering::SeqCst);
            let mean_s = self.mean_ms.load(Ordering::Relaxed).div_ceil(1000);
            let retry = mean_s * (waiting as u64 + 1) / self.per_device as u64;
            return Err(Fault::Busy {
                detail: format!("the trace queue is full ({waiting} jobs waiting; --max-queue {}); retry later", self.max_queue),
                retry_after_s: retry,
            });
        }
        let slot = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(spec.device.clone())
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_device)))
            .clone();
        let (tx, _) = broadcast::channel(1024);
        let job = Arc::new(Job {
            id: id.clone(),
            created: Instant::now(),
            outcome: watch::Sender::new(Outcome::Pending),
            log: Mutex::new((Vec::new(), JobState::Queued, 0)),
            tx,
            spec,
            nodes: None,
        });
        job.publish(LiveEvent::Status { state: JobState::Queued, device: job.spec.device.clone(), model: job.spec.model.clone() });
        self.active.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(id, job.clone());
        let (jobs, j) = (self.clone(), job.clone());
        tokio::spawn(async move {
            let permit = slot.acquire_owned().await;
            jobs.queued.fetch_sub(1, Ordering::SeqCst);
            jobs.running.fetch_add(1, Ordering::SeqCst);
            let started = Instant::now();
            let result = match permit {
                Ok(_permit) => run_child(&jobs, &exe, &j).await,
                Err(e) => Err(Fault::internal("the job queue closed", e)),
            };
            let ms = started.elapsed().as_millis() as u64;
            let old = jobs.mean_ms.load(Ordering::Relaxed);
            jobs.mean_ms.store((old * 3 + ms) / 4, Ordering::Relaxed);
            jobs.running.fetch_sub(1, Ordering::SeqCst);
            let (stored, id) = (result.is_ok(), j.id.clone());
            jobs.finish(j, result);
            // A delete or eviction between the trace's insert and `finish` found no finished
            // job to forget: its followers would be told of a trace that is gone.
            if stored {
                let (store, id2) = (jobs.store.clone(), id.clone());
                let gone = tokio::task::spawn_blocking(move || matches!(store.get(&id2), Err(StoreError::NotFound(_))));
                if gone.await.unwrap_or(false) {
                    jobs.forget(&id);
                }
            }
        });
        Ok(job)
    }

    /// Publishes a job's end (its trace or its error) and moves it to the finished ones.
    fn finish(&self, j: Arc<Job>, result: Result<TraceResponse, Fault>) {
        match result {
            Ok(r) => {
                j.publish(LiveEvent::Done { trace: r.clone() });
                j.outcome.send_replace(Outcome::Done(r));
            }
            Err(f) => {
                j.emit(JobEvent::Failed(f.clone()));
                j.outcome.send_replace(Outcome::Failed(f));
            }
        }
        // One move under both locks: a follower asking meanwhile finds the job in one list.
        let mut active = self.active.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut finished = self.finished.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        active.remove(&j.id);
        finished.push_back(j);
        while finished.len() > FINISHED_KEPT {
            finished.pop_front();
        }
    }

    /// Registers a trace recorded outside the server (`collector trace --serve`): followers
    /// see the progress its recorder posts, and it ends when the recorder uploads the trace.
    pub fn external(&self, id: String, model: String, device: String) -> Arc<Job> {
        let job = external_job(id.clone(), model, device, None);
        self.active.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(id, job.clone());
        job
    }

    /// Node `node_rank` of job `name` run on `nnodes` nodes joins the running live trace of
    /// that job, or registers it (under a new id) when none runs; it ends once every node sent
    /// its part or failed, or `wait` after the first did. Refused when the job runs on another
    /// number of nodes.
    pub fn external_node(
        &self,
        name: String,
        nnodes: u32,
        node_rank: u32,
        wait: std::time::Duration,
        model: String,
        device: String,
    ) -> Result<Arc<Job>, Fault> {
        let mut active = self.active.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let running = active
            .values()
            .find(|j| j.nodes.as_ref().is_some_and(|n| n.lock().unwrap_or_else(std::sync::PoisonError::into_inner).job == name));
        if let Some(job) = running {
            let mut n = job.nodes_lock()?;
            if n.nnodes != nnodes {
                return Err(Fault::Rejected(format!(
                    "job {name} runs on {} nodes (as its first node said), this node says {nnodes}; every node must give the same --nnodes",
                    n.nnodes
                )));
            }
            n.joined.insert(node_rank);
            drop(n);
            return Ok(job.clone());
        }
        let parts = NodeParts {
            job: name,
            nnodes,
            wait,
            joined: BTreeSet::from([node_rank]),
            parts: BTreeMap::new(),
            failed: BTreeMap::new(),
            waiting: false,
            merging: false,
        };
        let id = self.store.new_id();
        let job = external_job(id.clone(), model, device, Some(parts));
        active.insert(id, job.clone());
        Ok(job)
    }

    /// The running external job `id`, if there is one.
    pub fn external_job(&self, id: &str) -> Option<Arc<Job>> {
        self.active.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(id).filter(|j| j.spec.mode == EXTERNAL_MODE).cloned()
    }

    /// One progress line of a running external job; an `error` line ends it (422).
    pub fn external_line(&self, job: Arc<Job>, line: ChildLine) {
        match line {
            ChildLine::Started { iterations } => job.publish(LiveEvent::Started { iterations }),
            ChildLine::Iteration { done, of, seconds } => job.publish(LiveEvent::Iteration { done, of, seconds }),
            ChildLine::Memory { points, rank } => job.publish(LiveEvent::Memory { points, rank }),
            ChildLine::Done { .. } => {}
            ChildLine::Error { detail, .. } => self.finish(job, Err(Fault::Rejected(detail))),
        }
    }

    /// Ends a running external job with the trace its recorder uploaded, or an error.
    pub fn external_end(&self, job: Arc<Job>, result: Result<TraceResponse, Fault>) {
        self.finish(job, result);
    }
}

/// `JobSpec::mode` of traces recorded outside the server.
const EXTERNAL_MODE: &str = "external";

/// A job recorded outside the server (of several nodes when `nodes` is given), running, its
/// status published.
fn external_job(id: String, model: String, device: String, nodes: Option<NodeParts>) -> Arc<Job> {
    let (tx, _) = broadcast::channel(1024);
    let job = Arc::new(Job {
        id,
        created: Instant::now(),
        outcome: watch::Sender::new(Outcome::Pending),
        log: Mutex::new((Vec::new(), JobState::Running, 0)),
        tx,
        spec: JobSpec {
            model,
            torchscript: None,
            input_shape: None,
            batch_size: None,
            device,
            mode: EXTERNAL_MODE.into(),
            iterations: 0,
            max_events: 0,
            fragmentation: true,
            optimizer: String::new(),
            distributed: None,
        },
        nodes: nodes.map(Mutex::new),
    });
    job.publish(LiveEvent::Status { state: JobState::Running, device: job.spec.device.clone(), model: job.spec.model.clone() });
    job
}

/// Runs one job's child process and stores its trace.
async fn run_child(jobs: &Arc<Jobs>, exe: &std::path::Path, job: &Arc<Job>) -> Result<TraceResponse, Fault> {
    job.publish(LiveEvent::Status { state: JobState::Running, device: job.spec.device.clone(), model: job.spec.model.clone() });
    let out = jobs.store.temp_path(&format!("{}.mtrace.json", job.id));
    if jobs.stopping.load(Ordering::SeqCst) {
        return Err(Fault::Unavailable("the server is stopping".into()));
    }
    let mut cmd = tokio::process::Command::new(exe);
    cmd.args(job.spec.args(&out))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    super::isolate::die_with_parent(&mut cmd);
    if let (false, Some(bytes)) = (job.spec.device.starts_with("cuda"), jobs.address_space_bytes) {
        super::isolate::limit_address_space(&mut cmd, bytes);
    }
    let mut child = cmd.spawn().map_err(|e| Fault::internal("cannot start the tracing process", e))?;
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(Fault::internal("cannot start the tracing process", "no pipes"));
    };
    // The last 16 KiB of stderr, for errors the child could not report as a line.
    let stderr_tail = tokio::spawn(async move {
        let mut tail = Vec::new();
        let mut r = tokio::io::BufReader::new(stderr);
        let mut buf = [0u8; 8192];
        while let Ok(n) = r.read(&mut buf).await {
            if n == 0 {
                break;
            }
            tail.extend_from_slice(&buf[..n]);
            if tail.len() > 16384 {
                tail.drain(..tail.len() - 16384);
            }
        }
        String::from_utf8_lossy(&tail).into_owned()
    });
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let mut info = None;
    let mut reported = None;
    let run = async {
        while let Ok(Some(line)) = lines.next_line().await {
            match serde_json::from_str::<ChildLine>(&line) {
                Ok(ChildLine::Started { iterations }) => job.publish(LiveEvent::Started { iterations }),
                Ok(ChildLine::Iteration { done, of, seconds }) => job.publish(LiveEvent::Iteration { done, of, seconds }),
                Ok(ChildLine::Memory { points, rank }) => job.publish(LiveEvent::Memory { points, rank }),
                Ok(ChildLine::Done { info: i }) => info = Some(i),
                Ok(ChildLine::Error { class, detail }) => reported = Some((class, detail)),
                Err(_) => {}
            }
        }
        child.wait().await
    };
    let status = match tokio::time::timeout(jobs.timeout, run).await {
        Ok(s) => s.map_err(|e| Fault::internal("cannot wait for the tracing process", e))?,
        Err(_) => {
            let _ = child.kill().await;
            let _ = tokio::fs::remove_file(&out).await;
            return Err(Fault::Rejected(format!(
                "the trace took longer than this server's limit of {} s (--job-timeout-s) and was stopped",
                jobs.timeout.as_secs()
            )));
        }
    };
    let tail = stderr_tail.await.unwrap_or_default();
    let fail = |e: Fault| {
        let out = out.clone();
        async move {
            let _ = tokio::fs::remove_file(&out).await;
            Err(e)
        }
    };
    if let Some((class, detail)) = reported {
        let e = match class {
            FailureClass::NoCuda => Fault::Unavailable(detail),
            FailureClass::Invalid | FailureClass::Model => Fault::Rejected(detail),
            FailureClass::OutOfMemory => Fault::Rejected(format!("{detail} (try a smaller batch_size or input_shape)")),
            FailureClass::Internal => Fault::internal("the tracing process failed", detail),
        };
        return fail(e).await;
    }
    let Some(info) = info.filter(|_| status.success()) else {
        let how = match status.code() {
            Some(c) => format!("exit status {c}"),
            None => {
                use std::os::unix::process::ExitStatusExt;
                format!("signal {}", status.signal().unwrap_or(0))
            }
        };
        let last = tail.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").to_owned();
        return fail(Fault::internal("the tracing process died", format!("{how}: {last}"))).await;
    };
    let (js, id) = (jobs.clone(), job.id.clone());
    blocking(move || {
        let (stored, evicted) = js
            .store
            .insert(&id, Origin::Traced, None, &out, ".mtrace.json", info)
            .map_err(|e| Fault::storing(e, "cannot store the trace"))?;
        for e in evicted {
            js.forget(&e);
        }
        Ok(TraceResponse::from(&stored))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A follower asking for a job while it ends finds it, running or finished, every time
    /// (the move between the two lists was two steps: a job could be in neither, its events 404).
    #[test]
    fn a_job_that_ends_is_found_throughout() {
        let root = std::env::temp_dir().join(format!("mt-jobs-end-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let store = Store::open(&root, None, super::super::store::StoreLimits { max_traces: 10, max_bytes: u64::MAX }).unwrap();
        let limits = JobLimits { per_device: 1, max_queue: 1, timeout: std::time::Duration::from_secs(1), address_space_bytes: None };
        let jobs = Arc::new(Jobs::new(None, Arc::new(store), limits));
        let running: Vec<Arc<Job>> = (0..5_000).map(|k| jobs.external(format!("job{k}"), "m".into(), "cpu".into())).collect();
        let ids: Vec<String> = running.iter().map(|j| j.id.clone()).collect();
        // Asks for each job in turn until it is among the finished ones, while it ends (the
        // next one ends only once the asker is on it: the finished list keeps the last 100).
        let on = Arc::new(AtomicUsize::new(0));
        let asker = {
            let (jobs, on) = (jobs.clone(), on.clone());
            std::thread::spawn(move || {
                for (k, id) in ids.iter().enumerate() {
                    on.store(k, Ordering::SeqCst);
                    loop {
                        assert!(jobs.get(id).is_some(), "{id} was in neither list");
                        if jobs.finished.lock().unwrap().iter().any(|j| &j.id == id) {
                            break;
                        }
                    }
                }
            })
        };
        for (k, j) in running.into_iter().enumerate() {
            while on.load(Ordering::SeqCst) < k && !asker.is_finished() {
                std::hint::spin_loop();
            }
            jobs.external_end(j, Err(Fault::Rejected("ended".into())));
        }
        let asked = asker.join();
        let _ = std::fs::remove_dir_all(&root);
        assert!(asked.is_ok(), "a follower found no job while it ended");
    }
}
