"""Traces as Parquet tables, read by DuckDB, polars and pandas: `collector convert -o
events.parquet` (and `--table layers|operators`), `tracer.to_pandas()` and `to_polars()`.
Their aggregates (peak, per-layer peaks, counts) equal `collector summary --json`'s."""

import json
import os
import subprocess

import duckdb
import polars as pl
import pytest
import torch
import torch.nn as nn

import memory_tracer
from memory_tracer import MemoryTracer

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data")


def collector(*args):
    r = subprocess.run([memory_tracer.collector_path(), *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def convert(src, out, table=None):
    collector("convert", src, "-o", str(out), *(["--table", table] if table else []))
    return str(out)


@pytest.mark.parametrize("sample", ["resnet18_sgd_2steps.pickle", "mlp_adam_3steps.pickle"])
def test_duckdb_and_polars_agree_with_the_summary(tmp_path, sample):
    src = os.path.join(DATA, sample)
    summary = json.loads(collector("summary", src, "--json", "--top", "100000"))
    events = convert(src, tmp_path / "events.parquet")
    layers = convert(src, tmp_path / "layers.parquet", "layers")
    con = duckdb.connect()
    peak, n, allocs, frees = con.execute(
        "SELECT max(allocated_bytes), count(*), count(*) FILTER (event_type = 'alloc'), count(*) FILTER (event_type = 'free') FROM read_parquet(?)",
        [events],
    ).fetchone()
    assert peak == summary["peak_allocated_bytes"]
    assert n == summary["total_events"]
    assert (allocs, frees) == (summary["total_allocations"], summary["total_deallocations"])
    # The peak's row names the same device as the summary.
    device = con.execute("SELECT device FROM read_parquet(?) ORDER BY allocated_bytes DESC, ts_ns LIMIT 1", [events]).fetchone()[0]
    assert device == summary["peak_device"]
    # Per-layer peaks: the layers table is the summary's layer statistics.
    want = {l["layer_name"]: l["peak_allocated"] for l in summary["top_layers"]}
    got = dict(con.execute("SELECT layer, peak_allocated_bytes FROM read_parquet(?)", [layers]).fetchall())
    assert got == want
    # polars reads the same file with the same types.
    df = pl.read_parquet(events)
    assert df.height == summary["total_events"]
    assert df["allocated_bytes"].max() == summary["peak_allocated_bytes"]
    assert df.schema["size_bytes"] == pl.UInt64 and df.schema["ts_ns"] == pl.Datetime("ns")
    assert isinstance(df.schema["layer"], pl.Categorical)


def test_a_trace_without_events_is_an_empty_table(tmp_path):
    events = convert(os.path.join(DATA, "no_history.pickle"), tmp_path / "e.parquet")
    df = pl.read_parquet(events)
    assert df.height == 0
    assert "allocated_bytes" in df.columns and df.schema["allocated_bytes"] == pl.UInt64
    assert duckdb.connect().execute("SELECT count(*) FROM read_parquet(?)", [events]).fetchone()[0] == 0


def test_the_tracer_hands_over_dataframes(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tracer = MemoryTracer(device="cpu", ops="all")
    with tracer.trace(model):
        for _ in range(2):
            model(torch.randn(16, 64)).sum().backward()
            opt.step()
            opt.zero_grad()
    s = tracer.get_summary()
    events = tracer.to_pandas()
    assert len(events) == s["total_events"]
    assert int(events["allocated_bytes"].max()) == s["peak_allocated_bytes"]
    assert str(events["size_bytes"].dtype) == "uint64"
    assert {"forward", "backward"} <= set(events["phase"].astype(str))
    layers = tracer.to_polars("layers")
    stats = tracer.get_layer_stats()
    assert dict(zip(layers["layer"], layers["peak_allocated_bytes"])) == {k: v.peak_allocated for k, v in stats.items()}
    ops = tracer.to_polars("operators")
    assert ops.height > 0 and (ops["duration_ns"] >= 0).all()
    with pytest.raises(ValueError, match="unknown table"):
        tracer.to_pandas("nope")
