//! The memory timeline decimated to buckets (the viewer's main chart): min/max of allocated and
//! max of reserved per bucket, so the peak survives any zoom, and its column-wise wire form.

use super::peak_device;
use crate::model::{Totals, Trace};
use serde::{Deserialize, Serialize};

/// One bucket of the decimated timeline.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TimelinePoint {
    /// Start of the bucket, seconds since trace start.
    pub t_s: f64,
    pub allocated_min_bytes: u64,
    pub allocated_max_bytes: u64,
    pub reserved_max_bytes: u64,
    /// Allocated bytes after the bucket's last event.
    pub allocated_last_bytes: u64,
    /// Reserved bytes after the bucket's last event.
    pub reserved_last_bytes: u64,
    /// Index of the first event in the bucket.
    pub first_event: usize,
}

/// For the wire forms that write a list in columns (flame graph, timeline points, bands): an
/// error naming every column's length unless they all have the first one's.
pub(crate) fn same_lengths(what: &str, columns: &[(&str, usize)]) -> Result<(), String> {
    let n = columns.first().map_or(0, |c| c.1);
    if columns.iter().all(|c| c.1 == n) {
        return Ok(());
    }
    let lengths: Vec<String> = columns.iter().map(|(name, len)| format!("{name} {len}")).collect();
    Err(format!("{what}'s columns differ in length: {}", lengths.join(", ")))
}

/// A timeline's points as they are written: one list per field (`{"t_s": [...],
/// "allocated_min_bytes": [...], ...}`), for `#[serde(with = "timeline_columns")]` on a
/// `Vec<TimelinePoint>`. The page asks for a window on every frame of a zoom or pan, and a list
/// of objects repeats the seven field names in every bucket: the whole-trace window of a
/// 57.5 MB snapshot is 28.9 KB of JSON that way, 10.3 KB in columns.
pub mod timeline_columns {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use super::TimelinePoint;

    #[derive(Serialize, Deserialize)]
    struct Columns<T, U> {
        t_s: T,
        allocated_min_bytes: U,
        allocated_max_bytes: U,
        reserved_max_bytes: U,
        allocated_last_bytes: U,
        reserved_last_bytes: U,
        first_event: U,
    }

    /// One field of every point, written as a list without collecting it first.
    struct Column<'a, F>(&'a [TimelinePoint], F);

    impl<F: Fn(&TimelinePoint) -> V, V: Serialize> Serialize for Column<'_, F> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.collect_seq(self.0.iter().map(&self.1))
        }
    }

    pub fn serialize<S: Serializer>(points: &[TimelinePoint], s: S) -> Result<S::Ok, S::Error> {
        let u = |f: fn(&TimelinePoint) -> u64| Column(points, f);
        Columns {
            t_s: Column(points, |p: &TimelinePoint| p.t_s),
            allocated_min_bytes: u(|p| p.allocated_min_bytes),
            allocated_max_bytes: u(|p| p.allocated_max_bytes),
            reserved_max_bytes: u(|p| p.reserved_max_bytes),
            allocated_last_bytes: u(|p| p.allocated_last_bytes),
            reserved_last_bytes: u(|p| p.reserved_last_bytes),
            first_event: u(|p| p.first_event as u64),
        }
        .serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<TimelinePoint>, D::Error> {
        let c = Columns::<Vec<f64>, Vec<u64>>::deserialize(d)?;
        let n = c.t_s.len();
        super::same_lengths(
            "a timeline",
            &[
                ("t_s", n),
                ("allocated_min_bytes", c.allocated_min_bytes.len()),
                ("allocated_max_bytes", c.allocated_max_bytes.len()),
                ("reserved_max_bytes", c.reserved_max_bytes.len()),
                ("allocated_last_bytes", c.allocated_last_bytes.len()),
                ("reserved_last_bytes", c.reserved_last_bytes.len()),
                ("first_event", c.first_event.len()),
            ],
        )
        .map_err(serde::de::Error::custom)?;
        (0..n)
            .map(|i| {
                let first_event = usize::try_from(c.first_event[i]).map_err(|_| {
                    serde::de::Error::custom(format!("timeline point {i}: first_event {} is past this machine's indices", c.first_event[i]))
                })?;
                Ok(TimelinePoint {
                    t_s: c.t_s[i],
                    allocated_min_bytes: c.allocated_min_bytes[i],
                    allocated_max_bytes: c.allocated_max_bytes[i],
                    reserved_max_bytes: c.reserved_max_bytes[i],
                    allocated_last_bytes: c.allocated_last_bytes[i],
                    reserved_last_bytes: c.reserved_last_bytes[i],
                    first_event,
                })
            })
            .collect()
    }
}

/// Knobs of [`timeline`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct TimelineOptions {
    /// Number of buckets (about one per pixel). Default is 2000.
    pub buckets: usize,
    /// Time window in seconds since trace start; `None` is the whole trace. Default is `None`.
    pub window_s: Option<(f64, f64)>,
    /// Device index to draw; `None` picks the device with the highest allocated peak.
    /// Default is `None`.
    pub device: Option<u8>,
}

impl Default for TimelineOptions {
    fn default() -> Self {
        Self { buckets: 2000, window_s: None, device: None }
    }
}

impl TimelineOptions {
    pub fn with_buckets(mut self, buckets: usize) -> Self {
        self.buckets = buckets;
        self
    }

    pub fn with_window(mut self, start_s: f64, end_s: f64) -> Self {
        self.window_s = Some((start_s, end_s));
        self
    }
}

/// The buckets of a timeline request: its window in trace nanoseconds and the bucket of each
/// time in it. [`timeline`] and [`timeline_index::TimelineIndex`] both use it, so that they
/// put every event in the same bucket.
pub(crate) struct Buckets {
    start: u64,
    pub(crate) w0: u64,
    pub(crate) w1: u64,
    span: f64,
    pub(crate) n: usize,
}

impl Buckets {
    /// `None` when there is nothing to draw (no events, no buckets).
    pub(crate) fn new(trace: &Trace, options: &TimelineOptions) -> Option<Self> {
        let ev = &trace.events;
        if ev.is_empty() || options.buckets == 0 {
            return None;
        }
        let start = trace.start_ns();
        let (w0, w1) = match options.window_s {
            Some((a, b)) if b > a => (start + (a.max(0.0) * 1e9) as u64, start + (b.max(0.0) * 1e9) as u64),
            _ => (start, ev.ts_ns[ev.len() - 1].max(start + 1)),
        };
        Some(Buckets { start, w0, w1, span: (w1 - w0).max(1) as f64, n: options.buckets })
    }

    /// The bucket of time `ts` (`w0 <= ts <= w1`).
    pub(crate) fn of(&self, ts: u64) -> usize {
        (((ts - self.w0) as f64 / self.span) * self.n as f64).min(self.n as f64 - 1.0) as usize
    }

    /// Where bucket `b` starts, in seconds since the trace's start.
    pub(crate) fn start_s(&self, b: usize) -> f64 {
        let t = self.w0 + (b as f64 * self.span / self.n as f64) as u64;
        (t - self.start) as f64 * 1e-9
    }
}

/// The memory timeline decimated to at most `buckets` points: min/max of allocated and max of
/// reserved per time bucket, so the peak survives any zoom level.
pub fn timeline(trace: &Trace, options: &TimelineOptions) -> Vec<TimelinePoint> {
    let ev = &trace.events;
    let Some(buckets) = Buckets::new(trace, options) else {
        return Vec::new();
    };
    let (w0, w1) = (buckets.w0, buckets.w1);
    let device = options.device.unwrap_or_else(|| peak_device(trace));
    let mut out: Vec<TimelinePoint> = Vec::with_capacity(buckets.n.min(ev.len()));
    // Start near the window (the last checkpoint before it), not at the first event, so a
    // zoomed-in window costs what it shows.
    let first_in_window = ev.ts_ns.partition_point(|&t| t < w0);
    let mut cursor = ev.cursor_near(first_in_window);
    let begin = cursor.position();
    let mut prev: Option<Totals> = cursor.all_devices().get(device as usize).copied();
    let mut last_bucket: Option<usize> = None;
    for i in begin..ev.len() {
        let t = cursor.advance();
        if ev.device[i] != device {
            continue;
        }
        let ts = ev.ts_ns[i];
        if ts < w0 {
            prev = Some(t);
            continue;
        }
        if ts > w1 {
            break;
        }
        let b = buckets.of(ts);
        match out.last_mut() {
            Some(p) if last_bucket == Some(b) => {
                p.allocated_min_bytes = p.allocated_min_bytes.min(t.allocated_bytes);
                p.allocated_max_bytes = p.allocated_max_bytes.max(t.allocated_bytes);
                p.reserved_max_bytes = p.reserved_max_bytes.max(t.reserved_bytes);
                p.allocated_last_bytes = t.allocated_bytes;
                p.reserved_last_bytes = t.reserved_bytes;
            }
            _ => {
                // A bucket starts from the level before its first event, so steps draw correctly.
                let before = prev.unwrap_or(t);
                out.push(TimelinePoint {
                    t_s: buckets.start_s(b),
                    allocated_min_bytes: before.allocated_bytes.min(t.allocated_bytes),
                    allocated_max_bytes: before.allocated_bytes.max(t.allocated_bytes),
                    reserved_max_bytes: before.reserved_bytes.max(t.reserved_bytes),
                    allocated_last_bytes: t.allocated_bytes,
                    reserved_last_bytes: t.reserved_bytes,
                    first_event: i,
                });
                last_bucket = Some(b);
            }
        }
        prev = Some(t);
    }
    out
}
