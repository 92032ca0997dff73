//! Device facts from the CUDA driver through `cudarc`, loaded at run time.
//!
//! Everything here fails softly: without `libcuda` or a GPU the functions return `None` and
//! tracing on the CPU goes on. `cudarc` panics when a symbol is missing, so calls are wrapped in
//! `catch_unwind` as well as checked for errors.

use cudarc::driver::{result, sys};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// `cpu`, `cuda` or `cuda:N` → `cpu` / `cuda:N`.
pub fn parse(s: &str) -> Result<String, String> {
    let bad = || format!("unknown device `{s}`; expected cpu, cuda or cuda:N");
    match s {
        "cpu" => Ok("cpu".into()),
        "cuda" => Ok("cuda:0".into()),
        _ => {
            let n = s.strip_prefix("cuda:").ok_or_else(bad)?;
            n.parse::<u32>().ok().filter(|&n| n < 256).map(|n| format!("cuda:{n}")).ok_or_else(bad)
        }
    }
}

/// What the driver says about one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceFacts {
    pub ordinal: i32,
    pub name: String,
    pub total_bytes: u64,
}

fn soft<T>(f: impl FnOnce() -> Option<T>) -> Option<T> {
    catch_unwind(AssertUnwindSafe(f)).ok().flatten()
}

fn driver_ready() -> bool {
    // SAFETY: only tries to dlopen libcuda.
    soft(|| unsafe { sys::is_culib_present() }.then_some(())).is_some() && soft(|| result::init().ok()).is_some()
}

/// Name and total memory of CUDA device `ordinal`, if the driver is there.
pub fn facts(ordinal: i32) -> Option<DeviceFacts> {
    if !driver_ready() {
        return None;
    }
    soft(|| {
        let dev = result::device::get(ordinal).ok()?;
        let name = result::device::get_name(dev).ok()?;
        // SAFETY: `dev` is a valid device handle from the driver.
        let total = unsafe { result::device::total_mem(dev) }.ok()?;
        Some(DeviceFacts { ordinal, name, total_bytes: total as u64 })
    })
}

/// Number of CUDA devices the driver sees (0 without a driver).
pub fn count() -> i32 {
    if !driver_ready() {
        return 0;
    }
    soft(|| result::device::get_count().ok()).unwrap_or(0)
}

/// One sample of used device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UsedSample {
    /// The caller's clock at the sample (see [`UsedMemorySampler::start`]).
    pub ts_ns: u64,
    pub used_bytes: u64,
    pub total_bytes: u64,
}

/// Samples the driver's used memory of a device on a background thread until stopped.
#[derive(Debug)]
pub struct UsedMemorySampler {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<Vec<UsedSample>>>,
}

impl UsedMemorySampler {
    /// Starts sampling every `period`, stamping samples with `clock`; `None` without a driver.
    pub fn start(ordinal: i32, period: Duration, clock: fn() -> u64) -> Option<Self> {
        if !driver_ready() {
            return None;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let handle = std::thread::Builder::new()
            .name("mt-device-sampler".into())
            .spawn(move || {
                let ok = soft(|| {
                    let dev = result::device::get(ordinal).ok()?;
                    // SAFETY: retains the primary context (the one PyTorch uses) and makes it
                    // current on this thread only; released below.
                    let ctx = unsafe { result::primary_ctx::retain(dev) }.ok()?;
                    // SAFETY: `ctx` was just retained.
                    unsafe { result::ctx::set_current(ctx) }.ok()?;
                    Some(dev)
                });
                let _ = ready_tx.send(ok.is_some());
                let Some(dev) = ok else { return Vec::new() };
                let mut samples = Vec::new();
                loop {
                    if let Some((free, total)) = soft(|| result::mem_get_info().ok()) {
                        samples.push(UsedSample { ts_ns: clock(), used_bytes: (total - free) as u64, total_bytes: total as u64 });
                    }
                    if flag.load(Ordering::Relaxed) {
                        break;
                    }
                    std::thread::sleep(period);
                }
                // SAFETY: balances the retain above.
                soft(|| unsafe { result::primary_ctx::release(dev) }.ok());
                samples
            })
            .ok()?;
        if !ready_rx.recv().unwrap_or(false) {
            let _ = handle.join();
            return None;
        }
        Some(Self { stop, handle: Some(handle) })
    }

    /// Stops the thread and returns the samples.
    pub fn finish(mut self) -> Vec<UsedSample> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.take().and_then(|h| h.join().ok()).unwrap_or_default()
    }
}

impl Drop for UsedMemorySampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
