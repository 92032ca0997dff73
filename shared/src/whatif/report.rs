//! The what-if of a trace as a report: one device's replay under the run's own settings and
//! under each setting asked for, with the recorded peaks and whether the own replay gave them
//! back (what `collector whatif` prints).

use super::compare_with_recorded;
use super::conf::{AllocConf, ConfError};
use super::outcome::{Outcome, SegmentAddresses, SimOptions};
use super::requests::{requests, DeviceRequests, Requests};
use super::sim::simulate;
use crate::model::{Phase, Trace};
use serde::Serialize;

/// What to try on a trace.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WhatIfOptions {
    /// `PYTORCH_CUDA_ALLOC_CONF` strings, each applied over the run's own settings.
    pub settings: Vec<String>,
    /// The device's memory, for out-of-memory predictions. Default (`None`): the trace's own
    /// device's, else no limit.
    pub device_memory_bytes: Option<u64>,
    /// Which device (`cuda:1`, as the trace names it). Default: the one with the highest
    /// recorded reserved peak.
    pub device: Option<String>,
}

/// Why a trace could not be replayed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WhatIfError {
    #[error(transparent)]
    Conf(#[from] ConfError),
    /// One of [`WhatIfOptions::settings`] could not be read.
    #[error("--alloc-conf {setting:?}: {reason}")]
    Setting { setting: String, reason: ConfError },
    #[error("the trace has no device {asked} (it has {available})")]
    NoDevice { asked: String, available: String },
    #[error("the trace has no CUDA device whose caching allocator could be replayed")]
    NoCudaDevice,
}

/// The recorded run's own numbers.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Recorded {
    pub allocated_peak_bytes: u64,
    /// `None` where the trace does not know the device's reserved memory.
    pub reserved_peak_bytes: Option<u64>,
    /// Whether the replay under the run's own settings gave every recorded reserved total
    /// back; `None` where there is nothing recorded to compare with.
    pub replay_exact: Option<bool>,
    /// Seconds into the trace where that replay first left the recorded reserved curve.
    pub first_divergence_s: Option<f64>,
}

/// Where a setting first ran out of memory.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OomReport {
    /// Seconds into the trace.
    pub at_s: f64,
    /// The module (layer scope) the failing allocation came from.
    pub module: Option<String>,
    pub phase: Phase,
    /// The request, rounded as the allocator rounds it.
    pub request_bytes: u64,
    pub allocated_bytes: u64,
    pub reserved_bytes: u64,
    /// The recorded run ran out of memory there too.
    pub recorded: bool,
}

/// One setting's replay.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SettingOutcome {
    /// The setting as given (empty: the run's own).
    pub alloc_conf: String,
    /// The configuration replayed (the run's own with the setting over it), canonically.
    pub effective: String,
    pub allocated_peak_bytes: u64,
    pub reserved_peak_bytes: u64,
    /// Against the replay under the run's own settings.
    pub reserved_change_pct: f64,
    /// Lowest and highest reserved peak over where new segments may go, for a setting across
    /// the expandable divide from the run's own (see the module's "The model"): the recorded
    /// addresses do not say where the driver would put them, and best fit breaks ties by
    /// address. `None` within one regime, where the replay is exact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_peak_range_bytes: Option<[u64; 2]>,
    pub reserved_unallocated_at_peak_bytes: u64,
    pub segments_at_peak: u64,
    pub max_segments: u64,
    pub alloc_retries: u64,
    pub ooms: u64,
    pub oom: Option<OomReport>,
    /// Keys of the setting that change no placement.
    pub not_modelled: Vec<String>,
}

/// A trace's what-if.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WhatIfReport {
    /// The device replayed (`cuda:0`).
    pub device: String,
    /// The run's own settings, canonically (empty: PyTorch's defaults).
    pub own_settings: String,
    /// Whether the trace recorded its settings (else PyTorch's defaults were assumed).
    pub own_settings_known: bool,
    /// The memory fraction the run set on this device, applied to every replay.
    pub memory_fraction: Option<f64>,
    /// The run's own settings in words (`settings unknown, PyTorch's defaults assumed`).
    pub own_description: String,
    /// The device's memory (`None`: no limit).
    pub device_memory_bytes: Option<u64>,
    /// What the run held outside PyTorch's allocator on the device (the ledger's, `collector
    /// trace --ledger`): the replays had the device's memory less this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outside_pytorch_bytes: Option<u64>,
    pub recorded: Recorded,
    /// The run's own settings first, then each of [`WhatIfOptions::settings`] in order.
    pub settings: Vec<SettingOutcome>,
    pub notes: Vec<String>,
}

/// Replays one device of `trace` under its own settings and under each of `opts.settings`.
pub fn what_if(trace: &Trace, opts: &WhatIfOptions) -> Result<WhatIfReport, WhatIfError> {
    let parsed = parse_settings(&opts.settings)?;
    let reqs = requests(trace);
    let dev = pick_device(trace, &reqs.devices, opts.device.as_deref())?;
    let Limits { whole_device_bytes: whole_device, outside_pytorch_bytes: outside_pytorch, fraction, sim: sim_opts } =
        limits(trace, &reqs, dev, opts.device_memory_bytes);
    let index = trace.devices.get(dev.device as usize).map_or(0, |d| d.index);
    let device_memory = sim_opts.capacity_bytes;
    let recorded = recorded(trace, dev, &reqs.own_conf, fraction.and(device_memory).map(|m| (m, fraction)))?;
    let own = simulate(dev, &reqs.own_conf, &sim_opts)?;
    let own_reserved = own.reserved_peak_bytes;
    let mut settings = vec![setting_report(trace, String::new(), &reqs.own_conf, &own, own_reserved, Vec::new())];
    for (text, conf) in opts.settings.iter().zip(&parsed) {
        let effective = reqs.own_conf.overridden_by(conf);
        let out = simulate(dev, &effective, &sim_opts)?;
        let not_modelled = conf.unmodelled_keys().into_iter().map(str::to_owned).collect();
        let mut report = setting_report(trace, text.clone(), &effective, &out, own_reserved, not_modelled);
        if effective.expandable_segments.unwrap_or(false) != reqs.own_conf.expandable_segments.unwrap_or(false) {
            report.reserved_peak_range_bytes = Some(placement_range(dev, &effective, &sim_opts, out.reserved_peak_bytes)?);
        }
        settings.push(report);
    }
    let mut notes = reqs.notes.clone();
    if !dev.initial_segments.is_empty() || dev.loose_allocated_bytes > 0 {
        let held: u64 = dev.initial_segments.iter().map(|s| s.size_bytes).sum();
        notes.push(format!(
            "{}: the trace begins mid-run, with {} reserved before its first event: what came before is replayed as that starting state, and the predictions cover only what was recorded",
            dev.name,
            crate::units::format_bytes(held)
        ));
    }
    if let (Some(outside), Some(whole)) = (outside_pytorch, whole_device) {
        notes.push(format!(
            "{}: {} of the {} device held outside PyTorch's allocator in this run (the ledger: CUDA context, libraries, kernels): the replays had {}",
            dev.name,
            crate::units::format_bytes(outside),
            crate::units::format_bytes(whole),
            crate::units::format_bytes(whole.saturating_sub(outside))
        ));
    }
    if dev.inferred_empty_caches > 0 {
        notes.push(format!("{}: {} empty_cache calls inferred from memory given back", dev.name, dev.inferred_empty_caches));
    }
    Ok(WhatIfReport {
        device: dev.name.clone(),
        own_settings: reqs.own_conf.to_string(),
        own_settings_known: reqs.own.known,
        memory_fraction: fraction,
        own_description: reqs.own.info(index).description,
        device_memory_bytes: whole_device,
        outside_pytorch_bytes: outside_pytorch,
        recorded,
        settings,
        notes,
    })
}

/// What a replay of one device runs within.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Limits {
    /// The device's memory: the one asked for, else the trace's (`None`: no limit).
    pub whole_device_bytes: Option<u64>,
    /// What the run held outside PyTorch's allocator on the device (the ledger's), where the
    /// device's memory is known.
    pub outside_pytorch_bytes: Option<u64>,
    /// The memory fraction the run set on the device, where the device's memory is known.
    pub fraction: Option<f64>,
    /// The simulation's options: the device's memory less what was held outside PyTorch, and
    /// the fraction.
    pub sim: SimOptions,
}

/// The limits a replay of `dev` (one of `reqs`' devices) runs within: `device_memory_bytes`
/// (else the trace's device's memory) less what the ledger held outside PyTorch's allocator,
/// and the run's own memory fraction, as [`what_if`] replays every setting.
pub fn limits(trace: &Trace, reqs: &Requests, dev: &DeviceRequests, device_memory_bytes: Option<u64>) -> Limits {
    let whole_device = device_memory_bytes.or(trace.meta.device_total_memory_bytes);
    // With the device ledger, "fits" means the whole device: what the process held beside
    // PyTorch's allocator (context, NCCL, cuBLAS, kernels) is not PyTorch's to use.
    let outside_pytorch = whole_device.and_then(|_| crate::model::outside_pytorch_peak(trace, dev.device));
    let device_memory = whole_device.map(|m| m.saturating_sub(outside_pytorch.unwrap_or(0)));
    let index = trace.devices.get(dev.device as usize).map_or(0, |d| d.index);
    // A memory fraction caps reserved memory at a share of the device (and lets
    // garbage_collection_threshold act): the run's own, for every replay.
    let fraction = reqs.own.fraction_for(index).filter(|_| device_memory.is_some());
    Limits {
        whole_device_bytes: whole_device,
        outside_pytorch_bytes: outside_pytorch,
        fraction,
        sim: SimOptions::with_capacity(device_memory).with_fraction(fraction),
    }
}

/// The lowest and highest reserved peak of `conf` over where new segments go: as recorded
/// (`as_recorded`, already replayed), lowest free address first, highest first.
fn placement_range(dev: &DeviceRequests, conf: &AllocConf, opts: &SimOptions, as_recorded: u64) -> Result<[u64; 2], ConfError> {
    let mut range = [as_recorded, as_recorded];
    for addresses in [SegmentAddresses::Lowest, SegmentAddresses::Highest] {
        let peak = simulate(dev, conf, &opts.clone().placing(addresses))?.reserved_peak_bytes;
        range = [range[0].min(peak), range[1].max(peak)];
    }
    Ok(range)
}

/// Each setting read as `PYTORCH_CUDA_ALLOC_CONF`; the first that cannot be is the error,
/// named. Callers that must refuse before any work (a program to run) call it first.
pub fn parse_settings(settings: &[String]) -> Result<Vec<AllocConf>, WhatIfError> {
    settings.iter().map(|s| AllocConf::parse(s).map_err(|reason| WhatIfError::Setting { setting: s.clone(), reason })).collect()
}

/// The device asked for, or the one with the highest recorded reserved peak.
fn pick_device<'a>(trace: &Trace, devices: &'a [DeviceRequests], asked: Option<&str>) -> Result<&'a DeviceRequests, WhatIfError> {
    if let Some(name) = asked {
        return devices.iter().find(|d| d.name == name).ok_or_else(|| WhatIfError::NoDevice {
            asked: name.to_owned(),
            available: devices.iter().map(|d| d.name.as_str()).collect::<Vec<_>>().join(", "),
        });
    }
    let peaks = peaks_by_device(trace);
    devices
        .iter()
        .filter(|d| !d.requests.is_empty() || !d.initial_segments.is_empty())
        .max_by_key(|d| (peaks.get(d.device as usize).map_or(0, |p| p.1), std::cmp::Reverse(d.device)))
        .ok_or(WhatIfError::NoCudaDevice)
}

/// (allocated, reserved) peaks of every device, as recorded.
fn peaks_by_device(trace: &Trace) -> Vec<(u64, u64)> {
    let ev = &trace.events;
    let mut peaks: Vec<(u64, u64)> = ev.base_totals.iter().map(|t| (t.allocated_bytes, t.reserved_bytes)).collect();
    let mut cursor = ev.cursor();
    for i in 0..ev.len() {
        let t = cursor.advance();
        if let Some(p) = peaks.get_mut(ev.device[i] as usize) {
            p.0 = p.0.max(t.allocated_bytes);
            p.1 = p.1.max(t.reserved_bytes);
        }
    }
    peaks
}

/// The recorded peaks, and the replay under the run's own settings (no memory limit: every
/// release the trace shows is replayed) held against them.
/// `limit`: the device's memory and the run's memory fraction, where it set one (the replay
/// then caps and collects as the run did).
fn recorded(trace: &Trace, dev: &DeviceRequests, own: &AllocConf, limit: Option<(u64, Option<f64>)>) -> Result<Recorded, WhatIfError> {
    let peaks = peaks_by_device(trace).get(dev.device as usize).copied().unwrap_or_default();
    let reserved_known = !trace.meta.reserved_unknown.contains(&dev.device);
    let opts = match limit {
        Some((memory, fraction)) => SimOptions::with_capacity(Some(memory)).with_fraction(fraction),
        None => SimOptions::default(),
    };
    let out = simulate(dev, own, &opts.recording_totals())?;
    let c = compare_with_recorded(trace, dev, out.totals.as_deref().unwrap_or(&[]));
    let (replay_exact, first_divergence_s) = if reserved_known && c.compared > 0 {
        let at = c.first_divergence.map(|d| seconds_into(trace, trace.events.ts_ns.get(d.event as usize).copied().unwrap_or(0)));
        (Some(c.first_divergence.is_none()), at)
    } else {
        (None, None)
    };
    Ok(Recorded { allocated_peak_bytes: peaks.0, reserved_peak_bytes: reserved_known.then_some(peaks.1), replay_exact, first_divergence_s })
}

fn seconds_into(trace: &Trace, ts_ns: u64) -> f64 {
    ts_ns.saturating_sub(trace.start_ns()) as f64 * 1e-9
}

fn setting_report(
    trace: &Trace,
    alloc_conf: String,
    effective: &AllocConf,
    out: &Outcome,
    own_reserved: u64,
    not_modelled: Vec<String>,
) -> SettingOutcome {
    let oom = out.oom.map(|o| {
        let i = o.at.event as usize;
        let ev = &trace.events;
        let known = i < ev.len();
        OomReport {
            at_s: seconds_into(trace, o.at.ts_ns),
            module: known.then(|| trace.opt_str(ev.layer[i]).map(str::to_owned)).flatten(),
            phase: if known { ev.phase(i) } else { Phase::Other },
            request_bytes: o.requested_bytes,
            allocated_bytes: o.allocated_bytes,
            reserved_bytes: o.reserved_bytes,
            recorded: o.recorded_in_trace,
        }
    });
    let change = if own_reserved == 0 { 0.0 } else { (out.reserved_peak_bytes as f64 - own_reserved as f64) / own_reserved as f64 * 100.0 };
    SettingOutcome {
        alloc_conf,
        effective: effective.to_string(),
        allocated_peak_bytes: out.allocated_peak_bytes,
        reserved_peak_bytes: out.reserved_peak_bytes,
        reserved_change_pct: change,
        reserved_peak_range_bytes: None,
        reserved_unallocated_at_peak_bytes: out.reserved_unallocated_at_peak_bytes,
        segments_at_peak: out.segments_at_peak,
        max_segments: out.max_segments,
        alloc_retries: out.alloc_retries,
        ooms: out.ooms,
        oom,
        not_modelled,
    }
}
