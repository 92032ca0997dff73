//! `collector sweep`: one trace per batch size, in one process, reduced to peak memory,
//! iteration time and the memory-vs-rank curve of each. A batch size that runs out of memory
//! is recorded as such and the sweep goes on (the allocator's cache is emptied after it).

use crate::models::ModelError;
use crate::run::{trace_model, Progress, RunError, RunOptions};
use shared::analysis::profile::graph_profile;
use shared::analysis::sweep::{RankPoint, SweepReport, SweepRun, SweepStatus, SWEEP_FORMAT, SWEEP_VERSION};
use shared::analysis::{median_f64, summary};
use shared::export::ExportFormat;
use std::path::Path;
use traceio::files::write_export;

/// What the sweep reports as it goes.
#[derive(Debug)]
pub enum SweepProgress<'a> {
    Start { batch_size: u64 },
    Done { run: &'a SweepRun },
}

/// Runs `base` at each batch size, saves each trace into `dir` as
/// `<model>_bs<N>.mtrace.json`, and returns the combined report. Errors that would fail every
/// batch size (an unknown model, no CUDA, a bad option) end the sweep; a failure of one batch
/// size (out of memory, a shape the model refuses) does not.
pub fn sweep(
    base: &RunOptions,
    batch_sizes: &[u64],
    dir: &Path,
    progress: &mut dyn FnMut(SweepProgress<'_>),
) -> anyhow::Result<SweepReport> {
    std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("cannot create the output folder {}: {e}", dir.display()))?;
    let model = base.torchscript.as_ref().map_or_else(|| base.model.name.clone(), |p| p.display().to_string());
    let stem =
        base.torchscript.as_ref().and_then(|p| p.file_stem()).map_or_else(|| base.model.name.clone(), |s| s.to_string_lossy().into_owned());
    let mut runs = Vec::new();
    for &b in batch_sizes {
        progress(SweepProgress::Start { batch_size: b });
        let mut opts = base.clone();
        opts.batch_size = Some(i64::try_from(b).map_err(|_| anyhow::anyhow!("batch size {b} is too large"))?);
        let mut iteration_s = Vec::new();
        let run = match trace_model(&opts, &mut |p| {
            if let Progress::Iteration { seconds, .. } = p {
                iteration_s.push(seconds);
            }
        }) {
            Ok(trace) => {
                let file = format!("{stem}_bs{b}.mtrace.json");
                write_export(&trace, ExportFormat::Native, &dir.join(&file))?;
                let s = summary(&trace);
                let curve = match graph_profile(&trace) {
                    Ok(p) => p
                        .nodes
                        .iter()
                        .map(|n| RankPoint {
                            rank: n.rank as u32,
                            gtype: n.gtype,
                            allocated_bytes: n.median_active_mem_bytes,
                            peak_bytes: n.median_peak_mem_bytes,
                        })
                        .collect(),
                    Err(_) => Vec::new(),
                };
                // The first iteration warms the allocator up; latency is the steady ones'.
                let steady = if iteration_s.len() > 1 { &mut iteration_s[1..] } else { &mut iteration_s[..] };
                let median = median_f64(steady);
                SweepRun {
                    batch_size: b,
                    status: SweepStatus::Ok,
                    error: None,
                    peak_allocated_bytes: Some(s.peak_allocated_bytes),
                    peak_reserved_bytes: Some(s.peak_reserved_bytes),
                    pytorch_max_allocated_bytes: trace.meta.counter(shared::model::Counter::MaxMemoryAllocated),
                    median_iteration_s: median,
                    trace_file: Some(file),
                    curve,
                }
            }
            // These would fail every batch size: stop rather than repeat them.
            Err(
                e @ (RunError::Model(ModelError::Unknown(_) | ModelError::TorchScript { .. } | ModelError::BadOption { .. })
                | RunError::NoCuda(_)
                | RunError::Invalid(_)),
            ) => return Err(e.into()),
            Err(e) => {
                let message = e.to_string();
                SweepRun {
                    batch_size: b,
                    status: if protocol::is_out_of_memory(&message) { SweepStatus::OutOfMemory } else { SweepStatus::Failed },
                    error: Some(message),
                    peak_allocated_bytes: None,
                    peak_reserved_bytes: None,
                    pytorch_max_allocated_bytes: None,
                    median_iteration_s: None,
                    trace_file: None,
                    curve: Vec::new(),
                }
            }
        };
        // Each batch size starts from an empty cache, so reserved peaks do not carry over.
        if matches!(opts.device, crate::run::DeviceChoice::Cuda(_)) {
            crate::session::cuda_empty_cache();
        }
        progress(SweepProgress::Done { run: &run });
        runs.push(run);
    }
    Ok(SweepReport {
        format: SWEEP_FORMAT.into(),
        version: SWEEP_VERSION,
        model,
        mode: base.mode.to_string(),
        device: base.device.to_string(),
        runs,
    })
}
