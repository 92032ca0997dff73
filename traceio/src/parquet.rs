//! A trace as Apache Parquet tables, for dataframes and SQL (pandas, polars, DuckDB):
//!
//! - `events`: one row per memory event: `ts_ns` (nanosecond timestamp, the trace's clock),
//!   `event_type`, `size_bytes`, `address`, `allocated_bytes` and `reserved_bytes` (the device's
//!   totals after the event), `layer`, `phase`, `category` (what an allocation is for; null
//!   on other events), `device`, `rank` (null outside distributed jobs), `stream`;
//! - `layers`: one row per layer with its statistics (`collector summary`'s);
//! - `operators`: one row per operator: `name`, `phase`, `layer`, `start_ns`, `end_ns`,
//!   `duration_ns`, `thread`, `seq_nr`.
//!
//! Bytes are `UInt64`; names (layer, operator, phase, category, event type, device) are
//! dictionary-encoded. Events are written a row group at a time ([`ROW_GROUP_ROWS`]), so a
//! multi-gigabyte trace never needs its whole table in memory twice.

use anyhow::Context;
use arrow_array::builder::{StringDictionaryBuilder, TimestampNanosecondBuilder, UInt16Builder, UInt32Builder, UInt64Builder};
use arrow_array::types::UInt32Type;
use arrow_array::{ArrayRef, Float64Array, Int64Array, RecordBatch, StringArray, TimestampNanosecondArray, UInt64Array};
use arrow_schema::{DataType, Field, Schema, TimeUnit};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use shared::analysis::categories::categorize;
use shared::Trace;
use std::io::Write;
use std::sync::Arc;

/// Rows per row group (and per batch built in memory) of the `events` table.
pub const ROW_GROUP_ROWS: usize = 1 << 20;

/// Which table to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Table {
    Events,
    Layers,
    Operators,
}

/// Writes `table` of `trace` as one Parquet file; returns the rows written.
pub fn write(trace: &Trace, table: Table, out: impl Write + Send) -> anyhow::Result<u64> {
    let props = WriterProperties::builder().set_compression(Compression::SNAPPY).set_max_row_group_size(ROW_GROUP_ROWS).build();
    match table {
        Table::Events => write_batches(events_schema(), out, props, |push| events(trace, push)),
        Table::Layers => write_batches(layers_schema(), out, props, |push| push(layers(trace)?)),
        Table::Operators => write_batches(operators_schema(), out, props, |push| push(operators(trace)?)),
    }
}

/// Runs `produce`, writing each batch it pushes.
fn write_batches<W: Write + Send>(
    schema: Arc<Schema>,
    out: W,
    props: WriterProperties,
    produce: impl FnOnce(&mut dyn FnMut(RecordBatch) -> anyhow::Result<()>) -> anyhow::Result<()>,
) -> anyhow::Result<u64> {
    let mut writer = ArrowWriter::try_new(out, schema, Some(props)).context("cannot start the Parquet file")?;
    let mut rows = 0u64;
    produce(&mut |batch| {
        rows += batch.num_rows() as u64;
        writer.write(&batch).context("cannot write a Parquet row group")?;
        writer.flush().context("cannot write a Parquet row group")
    })?;
    writer.close().context("cannot finish the Parquet file")?;
    Ok(rows)
}

fn dictionary() -> DataType {
    DataType::Dictionary(Box::new(DataType::UInt32), Box::new(DataType::Utf8))
}

fn timestamp() -> DataType {
    DataType::Timestamp(TimeUnit::Nanosecond, None)
}

fn events_schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("ts_ns", timestamp(), false),
        Field::new("event_type", dictionary(), false),
        Field::new("size_bytes", DataType::UInt64, false),
        Field::new("address", DataType::UInt64, false),
        Field::new("allocated_bytes", DataType::UInt64, false),
        Field::new("reserved_bytes", DataType::UInt64, false),
        Field::new("layer", dictionary(), true),
        Field::new("phase", dictionary(), false),
        Field::new("category", dictionary(), true),
        Field::new("device", dictionary(), false),
        Field::new("rank", DataType::UInt32, true),
        Field::new("stream", DataType::UInt16, false),
    ]))
}

/// The events in batches of [`ROW_GROUP_ROWS`].
fn events(trace: &Trace, push: &mut dyn FnMut(RecordBatch) -> anyhow::Result<()>) -> anyhow::Result<()> {
    let ev = &trace.events;
    let mut category = vec![None; ev.len()];
    for c in categorize(trace) {
        if let Some(slot) = category.get_mut(c.event as usize) {
            *slot = Some(c.category.as_str());
        }
    }
    let devices: Vec<String> = trace.devices.iter().map(ToString::to_string).collect();
    let mut cursor = ev.cursor();
    // An empty trace is one empty batch, so the file still has its schema.
    let starts: Vec<usize> = if ev.is_empty() { vec![0] } else { (0..ev.len()).step_by(ROW_GROUP_ROWS).collect() };
    for start in starts {
        let end = (start + ROW_GROUP_ROWS).min(ev.len());
        push(event_batch(trace, start, &category[start..end], &devices, &mut cursor)?)?;
    }
    Ok(())
}

/// The events from `start` on, one per entry of `category`; `cursor` is at `start`.
fn event_batch(
    trace: &Trace,
    start: usize,
    category: &[Option<&'static str>],
    devices: &[String],
    cursor: &mut shared::model::TotalsCursor<'_>,
) -> anyhow::Result<RecordBatch> {
    let ev = &trace.events;
    let n = category.len();
    let mut ts = TimestampNanosecondBuilder::with_capacity(n);
    let mut kind = StringDictionaryBuilder::<UInt32Type>::new();
    let (mut size, mut address) = (UInt64Builder::with_capacity(n), UInt64Builder::with_capacity(n));
    let (mut allocated, mut reserved) = (UInt64Builder::with_capacity(n), UInt64Builder::with_capacity(n));
    let (mut layer, mut phase, mut cat, mut device) = (
        StringDictionaryBuilder::<UInt32Type>::new(),
        StringDictionaryBuilder::<UInt32Type>::new(),
        StringDictionaryBuilder::<UInt32Type>::new(),
        StringDictionaryBuilder::<UInt32Type>::new(),
    );
    let (mut rank, mut stream) = (UInt32Builder::with_capacity(n), UInt16Builder::with_capacity(n));
    for (k, c) in category.iter().enumerate() {
        let i = start + k;
        let totals = cursor.advance();
        ts.append_value(i64::try_from(ev.ts_ns[i]).unwrap_or(i64::MAX));
        kind.append_value(ev.event_type(i).as_str());
        size.append_value(ev.size_bytes[i]);
        address.append_value(ev.address[i]);
        allocated.append_value(totals.allocated_bytes);
        reserved.append_value(totals.reserved_bytes);
        match trace.strings.get(ev.layer[i]) {
            Some(name) => layer.append_value(name),
            None => layer.append_null(),
        }
        phase.append_value(ev.phase(i).as_str());
        match c {
            Some(c) => cat.append_value(c),
            None => cat.append_null(),
        }
        let d = usize::from(ev.device[i]);
        device.append_value(devices.get(d).map_or("unknown", String::as_str));
        rank.append_option(trace.devices.get(d).and_then(|d| d.rank));
        stream.append_value(ev.stream[i]);
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(ts.finish()),
        Arc::new(kind.finish()),
        Arc::new(size.finish()),
        Arc::new(address.finish()),
        Arc::new(allocated.finish()),
        Arc::new(reserved.finish()),
        Arc::new(layer.finish()),
        Arc::new(phase.finish()),
        Arc::new(cat.finish()),
        Arc::new(device.finish()),
        Arc::new(rank.finish()),
        Arc::new(stream.finish()),
    ];
    RecordBatch::try_new(events_schema(), columns).context("cannot build a batch of events")
}

fn layers_schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("layer", DataType::Utf8, false),
        Field::new("peak_allocated_bytes", DataType::UInt64, false),
        Field::new("peak_reserved_bytes", DataType::UInt64, false),
        Field::new("total_allocations", DataType::UInt64, false),
        Field::new("total_deallocations", DataType::UInt64, false),
        Field::new("allocated_bytes_total", DataType::UInt64, false),
        Field::new("avg_fragmentation", DataType::Float64, false),
        Field::new("duration_ms", DataType::Float64, false),
    ]))
}

fn layers(trace: &Trace) -> anyhow::Result<RecordBatch> {
    let stats: Vec<_> = shared::analysis::layer_stats(trace).into_values().collect();
    let u64s =
        |f: fn(&shared::analysis::LayerMemoryStats) -> u64| -> ArrayRef { Arc::new(UInt64Array::from_iter_values(stats.iter().map(f))) };
    let f64s =
        |f: fn(&shared::analysis::LayerMemoryStats) -> f64| -> ArrayRef { Arc::new(Float64Array::from_iter_values(stats.iter().map(f))) };
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(stats.iter().map(|s| s.layer_name.as_str()))),
        u64s(|s| s.peak_allocated),
        u64s(|s| s.peak_reserved),
        u64s(|s| s.total_allocations),
        u64s(|s| s.total_deallocations),
        u64s(|s| s.allocated_bytes_total),
        f64s(|s| s.avg_fragmentation),
        f64s(|s| s.duration_ms),
    ];
    RecordBatch::try_new(layers_schema(), columns).context("cannot build the layers table")
}

fn operators_schema() -> Arc<Schema> {
    Arc::new(Schema::new(vec![
        Field::new("name", dictionary(), false),
        Field::new("phase", dictionary(), false),
        Field::new("layer", dictionary(), true),
        Field::new("start_ns", timestamp(), false),
        Field::new("end_ns", timestamp(), false),
        Field::new("duration_ns", DataType::UInt64, false),
        Field::new("thread", DataType::UInt64, false),
        Field::new("seq_nr", DataType::Int64, false),
    ]))
}

fn operators(trace: &Trace) -> anyhow::Result<RecordBatch> {
    let ops = &trace.ops;
    let mut name = StringDictionaryBuilder::<UInt32Type>::new();
    let mut phase = StringDictionaryBuilder::<UInt32Type>::new();
    let mut layer = StringDictionaryBuilder::<UInt32Type>::new();
    for o in ops {
        name.append_value(trace.str(o.name));
        phase.append_value(o.phase.as_str());
        match trace.strings.get(o.layer) {
            Some(l) => layer.append_value(l),
            None => layer.append_null(),
        }
    }
    let ns = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let columns: Vec<ArrayRef> = vec![
        Arc::new(name.finish()),
        Arc::new(phase.finish()),
        Arc::new(layer.finish()),
        Arc::new(TimestampNanosecondArray::from_iter_values(ops.iter().map(|o| ns(o.start_ns)))),
        Arc::new(TimestampNanosecondArray::from_iter_values(ops.iter().map(|o| ns(o.end_ns)))),
        Arc::new(UInt64Array::from_iter_values(ops.iter().map(|o| o.end_ns.saturating_sub(o.start_ns)))),
        Arc::new(UInt64Array::from_iter_values(ops.iter().map(|o| o.thread))),
        Arc::new(Int64Array::from_iter_values(ops.iter().map(|o| o.seq_nr))),
    ];
    RecordBatch::try_new(operators_schema(), columns).context("cannot build the operators table")
}
