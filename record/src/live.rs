//! Live memory totals from capture records, for followers of a running trace (`collector
//! serve`'s live chart, `--progress-json`): the same totals the trace will hold, decimated so
//! a report stays small but keeps every bucket's peak.

use crate::layout::{self as ffi, MtRecord};

/// One live sample: nanoseconds since the run started, allocated and reserved bytes.
pub type LivePoint = [u64; 3];

/// The most points one report carries.
pub const LIVE_POINTS_PER_REPORT: usize = 2048;

/// Which device's memory a run's live totals follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LiveDevice {
    Cpu,
    Cuda(i8),
    /// The first CUDA device memory is recorded on, else the CPU (Python programs, whose
    /// device is known only once they allocate).
    Auto,
}

/// Running totals of the memory records seen so far. Mirrors `assemble`: on CUDA the shim's
/// totals; on the CPU a running sum of the blocks allocated since the start (frees of older
/// blocks are left out, as the trace leaves them out).
#[derive(Debug)]
pub struct LiveTotals {
    start_ns: u64,
    device: LiveDevice,
    cpu_live: shared::hash::FastMap<u64, u64>,
    cpu_allocated: u64,
}

impl LiveTotals {
    /// Totals for `device`, timed from `start_ns` (the shim's steady clock).
    pub fn new(start_ns: u64, device: LiveDevice) -> Self {
        Self { start_ns, device, cpu_live: Default::default(), cpu_allocated: 0 }
    }

    /// The points of `records` (new ones only), decimated to [`LIVE_POINTS_PER_REPORT`].
    pub fn points(&mut self, records: &[MtRecord]) -> Vec<LivePoint> {
        let mut out = Vec::new();
        // In time order, as `assemble` sorts them: a batch holds each thread's records in a
        // run, and a running sum taken thread by thread would add up frees and allocations
        // of different moments (gloo's threads made peaks 3 MiB too high).
        let mut mem: Vec<&MtRecord> = records.iter().filter(|r| r.kind == ffi::MT_MEM).collect();
        mem.sort_by_key(|r| r.ts_ns);
        for r in mem {
            if self.device == LiveDevice::Auto && r.device_type == 1 {
                self.device = LiveDevice::Cuda(r.device_index);
                out.clear();
            }
            let ts = r.ts_ns.saturating_sub(self.start_ns);
            match self.device {
                LiveDevice::Cuda(d) if r.device_type != 0 && r.device_index == d => out.push([ts, r.a, r.b]),
                LiveDevice::Cuda(_) => {}
                LiveDevice::Cpu | LiveDevice::Auto if r.device_type == 0 => {
                    if r.value >= 0 {
                        self.cpu_live.insert(r.id, r.value as u64);
                        self.cpu_allocated += r.value as u64;
                    } else if let Some(size) = self.cpu_live.remove(&r.id) {
                        self.cpu_allocated = self.cpu_allocated.saturating_sub(size);
                    } else {
                        continue;
                    }
                    out.push([ts, self.cpu_allocated, 0]);
                }
                LiveDevice::Cpu | LiveDevice::Auto => {}
            }
        }
        decimate(out, LIVE_POINTS_PER_REPORT)
    }
}

/// At most `max` points: each bucket keeps its point of highest allocated total, so peaks
/// survive (the last point is always kept: it is where the totals stand now).
pub fn decimate(points: Vec<LivePoint>, max: usize) -> Vec<LivePoint> {
    if points.len() <= max || max < 2 {
        return points;
    }
    let last = points[points.len() - 1];
    let per = points.len().div_ceil(max - 1);
    let mut out: Vec<LivePoint> = points[..points.len() - 1].chunks(per).filter_map(|c| c.iter().copied().max_by_key(|p| p[1])).collect();
    out.push(last);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mem(ts: u64, id: u64, value: i64, a: u64, device_type: i8) -> MtRecord {
        MtRecord { ts_ns: ts, id, value, a, b: a * 2, kind: ffi::MT_MEM, device_type, device_index: 0, ..Default::default() }
    }

    #[test]
    fn auto_follows_the_first_cuda_device_and_cpu_leaves_out_older_frees() {
        let mut cpu = LiveTotals::new(10, LiveDevice::Auto);
        let p = cpu.points(&[mem(11, 1, 64, 0, 0), mem(12, 9, -32, 0, 0), mem(13, 1, -64, 0, 0)]);
        assert_eq!(p, [[1, 64, 0], [3, 0, 0]], "the free of a block allocated before is left out");
        let p = cpu.points(&[mem(14, 2, 16, 0, 0), mem(15, 3, 512, 512, 1), mem(16, 4, 8, 0, 0)]);
        assert_eq!(p, [[5, 512, 1024]], "CUDA from its first record on; CPU points dropped");
        let big: Vec<LivePoint> = (0..10_000u64).map(|i| [i, i % 97, 0]).collect();
        let d = decimate(big, 100);
        assert!(d.len() <= 100 && d.last() == Some(&[9999, 9999 % 97, 0]));
        assert_eq!(d.iter().map(|p| p[1]).max(), Some(96));
    }

    /// Two threads' runs in one batch: the totals follow time, not the batch's order.
    #[test]
    fn a_batch_is_summed_in_time_order() {
        let mut cpu = LiveTotals::new(0, LiveDevice::Cpu);
        // Thread B allocates 50 at t=2 and 70 at t=4; thread A allocates 100 at t=1 and frees
        // it at t=3. In time: 100, 150, 50, 120; in the batch's order it would reach 220.
        let p = cpu.points(&[mem(2, 2, 50, 0, 0), mem(4, 3, 70, 0, 0), mem(1, 1, 100, 0, 0), mem(3, 1, -100, 0, 0)]);
        assert_eq!(p, [[1, 100, 0], [2, 150, 0], [3, 50, 0], [4, 120, 0]]);
    }
}
