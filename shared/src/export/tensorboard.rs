//! TensorBoard's event-file format (`events.out.tfevents.*`): per iteration, the scalars
//! TensorBoard users expect next to their loss curves, step = iteration:
//!
//! - `memory/peak_allocated`, `memory/peak_reserved` (bytes), `memory/fragmentation` (at the
//!   iteration's peak, 0–1);
//! - `memory/peak_<phase>` (forward, backward, optimizer, other: the highest allocated bytes
//!   while that phase ran);
//! - `memory/allocated_at_end` and `memory/leak_growth` (bytes more than the previous
//!   iteration's end).
//!
//! The file is TFRecord-framed (`u64` length, masked CRC-32C of it, the bytes, their masked
//! CRC-32C) `Event` protocol buffers, as `tensorflow/core/util/event.proto` and
//! `tensorboard/compat/proto/summary.proto` define them: a `file_version` event first, then
//! one `Summary` of simple values per iteration. Wall times are the trace's own clock (its
//! start plus each iteration's end), so the file is the same every time it is written.

use crate::analysis::iterations::{per_iteration, IterationMemory};
use crate::model::Trace;
use prost::Message;
use std::io::Write;

/// `tensorflow.Event`, the fields written here.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    #[prost(int64, tag = "2")]
    pub step: i64,
    #[prost(oneof = "What", tags = "3, 5")]
    pub what: Option<What>,
}

/// `Event.what`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum What {
    #[prost(string, tag = "3")]
    FileVersion(String),
    #[prost(message, tag = "5")]
    Summary(Summary),
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Summary {
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<SummaryValue>,
}

/// `tensorflow.Summary.Value` with a simple (scalar) value.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SummaryValue {
    #[prost(string, tag = "1")]
    pub tag: String,
    /// In the `value` oneof, so a 0 is written (a plain proto3 field would leave it out, and
    /// TensorBoard would drop the point).
    #[prost(oneof = "Value", tags = "2")]
    pub value: Option<Value>,
}

/// `Summary.Value.value`, the simple value only.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Value {
    #[prost(float, tag = "2")]
    SimpleValue(f32),
}

/// One step's scalars, as `SummaryWriter.add_scalar(tag, value, step, walltime)` takes them.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Step {
    /// The iteration (0, 1, …).
    pub step: i64,
    /// Unix seconds: the trace's start plus the iteration's end (the trace's own clock).
    pub wall_time: f64,
    /// (tag, value) in a fixed order.
    pub scalars: Vec<(String, f64)>,
}

/// The scalars of every iteration of `trace`.
pub fn steps(trace: &Trace) -> Vec<Step> {
    let start_s = trace.meta.start_unix_ns.unwrap_or(0) as f64 / 1e9;
    per_iteration(trace)
        .iterations
        .iter()
        .map(|it| Step { step: i64::from(it.index), wall_time: start_s + it.end_s, scalars: scalars(it) })
        .collect()
}

/// The scalars of one iteration, by tag.
fn scalars(it: &IterationMemory) -> Vec<(String, f64)> {
    let mut out = vec![
        ("memory/peak_allocated".to_owned(), it.peak_allocated_bytes as f64),
        ("memory/peak_reserved".to_owned(), it.peak_reserved_bytes as f64),
        ("memory/fragmentation".to_owned(), it.fragmentation),
    ];
    out.extend(it.phase_peaks_bytes.iter().map(|(phase, b)| (format!("memory/peak_{phase}"), *b as f64)));
    out.push(("memory/allocated_at_end".to_owned(), it.allocated_at_end_bytes as f64));
    out.push(("memory/leak_growth".to_owned(), it.growth_bytes as f64));
    out
}

/// Writes `trace`'s per-iteration scalars as one event file.
pub fn write(trace: &Trace, mut out: impl Write) -> std::io::Result<()> {
    let start_s = trace.meta.start_unix_ns.unwrap_or(0) as f64 / 1e9;
    let first = Event { wall_time: start_s, step: 0, what: Some(What::FileVersion("brain.Event:2".to_owned())) };
    record(&mut out, &first.encode_to_vec())?;
    for step in steps(trace) {
        let value = step.scalars.into_iter().map(|(tag, v)| SummaryValue { tag, value: Some(Value::SimpleValue(v as f32)) }).collect();
        let event = Event { wall_time: step.wall_time, step: step.step, what: Some(What::Summary(Summary { value })) };
        record(&mut out, &event.encode_to_vec())?;
    }
    out.flush()
}

/// One TFRecord: length, its masked CRC, the data, its masked CRC.
fn record(out: &mut impl Write, data: &[u8]) -> std::io::Result<()> {
    let len = (data.len() as u64).to_le_bytes();
    out.write_all(&len)?;
    out.write_all(&masked_crc(&len).to_le_bytes())?;
    out.write_all(data)?;
    out.write_all(&masked_crc(data).to_le_bytes())
}

/// TFRecord's masked CRC-32C.
fn masked_crc(data: &[u8]) -> u32 {
    const CRC32C: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);
    let c = CRC32C.checksum(data);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The records of an event file, checked: each record's bytes (what TensorBoard's reader does).
    fn read_records(mut bytes: &[u8]) -> Result<Vec<Vec<u8>>, String> {
        let mut out = Vec::new();
        while !bytes.is_empty() {
            let take = |b: &mut &[u8], n: usize| -> Result<Vec<u8>, String> {
                if b.len() < n {
                    return Err(format!("a record is cut short ({} bytes left, {n} expected)", b.len()));
                }
                let (head, tail) = b.split_at(n);
                *b = tail;
                Ok(head.to_vec())
            };
            let len_bytes = take(&mut bytes, 8)?;
            let len_crc = u32::from_le_bytes(take(&mut bytes, 4)?.try_into().unwrap_or_default());
            if masked_crc(&len_bytes) != len_crc {
                return Err("a record's length fails its CRC".to_owned());
            }
            let len = u64::from_le_bytes(len_bytes.try_into().unwrap_or_default());
            let data = take(&mut bytes, usize::try_from(len).map_err(|_| "a record is too long")?)?;
            let data_crc = u32::from_le_bytes(take(&mut bytes, 4)?.try_into().unwrap_or_default());
            if masked_crc(&data) != data_crc {
                return Err("a record's data fails its CRC".to_owned());
            }
            out.push(data);
        }
        Ok(out)
    }

    #[test]
    fn the_crc_is_tensorflows() {
        // CRC-32C of "123456789" is 0xE3069283 (RFC 3720); TensorFlow masks it.
        let c = 0xE306_9283u32;
        assert_eq!(masked_crc(b"123456789"), c.rotate_right(15).wrapping_add(0xa282_ead8));
    }

    #[test]
    fn a_zero_is_written() {
        let v = SummaryValue { tag: "t".into(), value: Some(Value::SimpleValue(0.0)) };
        let bytes = v.encode_to_vec();
        // tag 1 ("t"), then field 2 as a 32-bit float: key 0x15 and four zero bytes.
        assert_eq!(bytes, [0x0a, 0x01, b't', 0x15, 0, 0, 0, 0]);
    }

    #[test]
    fn records_round_trip_and_corruption_is_caught() {
        let mut buf = Vec::new();
        record(&mut buf, b"abc").unwrap();
        record(&mut buf, b"").unwrap();
        assert_eq!(read_records(&buf).unwrap(), vec![b"abc".to_vec(), Vec::new()]);
        let mut bad = buf.clone();
        bad[13] ^= 1;
        assert!(read_records(&bad).unwrap_err().contains("CRC"));
        assert!(read_records(&buf[..buf.len() - 1]).unwrap_err().contains("cut short"));
    }
}
