"""The memory_tracer Python API (MemoryTracer, as in the MemoryTracer README) on the CPU,
from an installed wheel: numbers match `collector` on the same trace, exports open, errors
are clear."""

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import memory_tracer
from memory_tracer import LayerMemoryStats, MemoryTracer

HERE = os.path.dirname(os.path.abspath(__file__))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 256)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def train_step(model, opt):
    loss = model(torch.randn(32, 64)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()


def collector(*args):
    r = subprocess.run([memory_tracer.collector_path(), *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_the_package_comes_from_the_wheel():
    assert "site-packages" in memory_tracer.__file__ or os.environ.get("MEMORY_TRACER_WHEEL_DIR", "") in memory_tracer.__file__
    # The wheel's own collector (its script, in bin/ beside the package under pip --target).
    site = os.path.dirname(os.path.dirname(memory_tracer.__file__))
    assert memory_tracer.collector_path() == os.path.join(site, "bin", "collector")


def test_layer_stats_peaks_and_fragmentation_match_the_collector(tmp_path):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.Adam(model.parameters())
    tracer = MemoryTracer(max_events=100_000, device="cpu")
    with tracer.trace(model):
        for _ in range(3):
            train_step(model, opt)
    stats = tracer.get_layer_stats()
    for name in ("fc1", "fc2", "act", "Net", "optimizer.step"):
        assert name in stats, sorted(stats)
        assert isinstance(stats[name], LayerMemoryStats)
    # Adam's state (exp_avg, exp_avg_sq for 4 parameters) is made in the first step.
    assert stats["optimizer.step"].total_allocations >= 8
    assert stats["fc1"].peak_allocated > 0 and stats["fc1"].duration_ms > 0
    peaks = tracer.get_peak_memory_per_layer()
    assert peaks["fc1"] == stats["fc1"].peak_allocated
    frag = tracer.get_fragmentation_stats()
    assert set(frag) == set(stats) and all(v == 0.0 for v in frag.values()), "the CPU allocator caches nothing"

    saved = tmp_path / "run.mtrace.json"
    tracer.save(saved)
    summary = json.loads(collector("summary", str(saved), "--json"))
    assert summary["peak_allocated_bytes"] == tracer.get_summary()["peak_allocated_bytes"]
    assert summary["peak_allocated_bytes"] == max(s.peak_allocated for s in stats.values())
    trace = json.loads(saved.read_text())["trace"]
    assert len(trace["iterations"]) == 3
    # Every field the API's capture sends is one the collector reads.
    assert not [w for w in summary["warnings"] if "does not read" in w], summary["warnings"]


def test_a_tracer_leaves_no_scratch_files_behind(tmp_path):
    """Each tracer keeps its trace in a scratch folder while it lives (for exports); the
    folder goes with the tracer, and what `save()` wrote stays."""
    import gc

    model = Net()
    tracer = MemoryTracer(device="cpu")
    with tracer.trace(model):
        model(torch.randn(8, 64))
    scratch = tracer._dir
    assert os.path.isfile(os.path.join(scratch, "trace.mtrace.json"))
    tracer.save(tmp_path / "kept.mtrace.json")
    del tracer
    gc.collect()
    assert not os.path.exists(scratch), os.listdir(scratch)
    assert (tmp_path / "kept.mtrace.json").stat().st_size > 0


def test_exports_and_summary(tmp_path, capsys):
    model = Net()
    tracer = MemoryTracer(device="cpu")
    with tracer.trace(model):
        model(torch.randn(8, 64))
        memory_tracer.mark("after forward")
    tracer.export_flame_graph(tmp_path / "flame.json")
    flame = json.loads((tmp_path / "flame.json").read_text())
    assert flame["$schema"].startswith("https://www.speedscope.app/")
    tracer.export_timeline(tmp_path / "timeline.json")
    timeline = json.loads((tmp_path / "timeline.json").read_text())
    assert {"events", "layer_stats", "summary"} <= set(timeline)
    tracer.save(tmp_path / "t.mtrace.json")
    trace = json.loads((tmp_path / "t.mtrace.json").read_text())["trace"]
    assert [trace["strings"][m["name"]] for m in trace["marks"]] == ["after forward"]
    tracer.print_summary()
    out = capsys.readouterr().out
    assert "peak allocated" in out and "fc1" in out


def test_trace_module_names_a_scope_and_fragmentation_can_be_off():
    model = Net()
    tracer = MemoryTracer(device="cpu", enable_fragmentation_tracking=False)
    with tracer.trace():
        with tracer.trace_module("preprocess"):
            x = torch.randn(16, 64) * 2
        model(x)
    stats = tracer.get_layer_stats()
    assert stats["preprocess"].total_allocations >= 1
    assert "Net" in stats and "fc1" in stats, "modules are named even without trace(model)"
    assert all(s.avg_fragmentation == 0.0 for s in stats.values())


def test_ops_all_records_operators_and_invalid_ops_are_refused(tmp_path):
    model = Net()
    tracer = MemoryTracer(device="cpu", ops="all")
    with tracer.trace(model):
        model(torch.randn(4, 64)).sum().backward()
    tracer.save(tmp_path / "all.mtrace.json")
    t = json.loads((tmp_path / "all.mtrace.json").read_text())["trace"]
    names = {t["strings"][o["name"]] for o in t["ops"]}
    assert "aten::linear" in names and "AddmmBackward0" in names
    with pytest.raises(ValueError, match="invalid ops"):
        MemoryTracer(ops="some")


def test_the_ledger_is_asked_for_by_the_api_and_a_cpu_trace_has_none(tmp_path):
    """`ledger=True` asks for the device ledger (CUDA only, checked on a GPU by
    tests/gpu/ledger.sh); a CPU trace records the same events as without it and no ledger."""
    model = Net()
    tracer = MemoryTracer(device="cpu", ledger=True)
    assert tracer.ledger
    with tracer.trace(model):
        train_step(model, torch.optim.SGD(model.parameters(), lr=0.1))
    tracer.save(tmp_path / "ledger.mtrace.json")
    t = json.loads((tmp_path / "ledger.mtrace.json").read_text())["trace"]
    assert not t.get("ledger", {}).get("events") and len(t["events"]["ts_ns"]) > 0
    r = subprocess.run([memory_tracer.collector_path(), "ledger", str(tmp_path / "ledger.mtrace.json")], capture_output=True, text=True)
    assert r.returncode != 0 and "has no device ledger" in r.stderr and "(a CUDA program)" in r.stderr, r.stderr


def test_a_second_trace_replaces_the_first_and_errors_are_clear():
    tracer = MemoryTracer(device="cpu")
    with pytest.raises(RuntimeError, match="nothing traced yet"):
        tracer.get_layer_stats()
    with pytest.raises(ValueError, match="max_events"):
        MemoryTracer(max_events=0)
    with pytest.raises(ValueError, match="invalid device"):
        with MemoryTracer(device="tpu").trace():
            pass
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="sees no CUDA device"):
            with MemoryTracer(device="cuda:0").trace():
                pass
    with tracer.trace():
        torch.ones(1000)
    first = tracer.get_summary()["total_events"]
    with tracer.trace():
        for _ in range(5):
            torch.ones(1000)
    assert tracer.get_summary()["total_events"] > first
    with tracer.trace():
        with pytest.raises(RuntimeError, match="already being traced"):
            with MemoryTracer(device="cpu").trace():
                pass


def test_an_exception_inside_trace_propagates_and_the_trace_is_kept():
    tracer = MemoryTracer(device="cpu")
    with pytest.raises(KeyError):
        with tracer.trace():
            torch.ones(100)
            raise KeyError("user error")
    assert tracer.get_summary()["total_events"] >= 1


def test_python_m_memory_tracer_traces_a_program(tmp_path):
    out = tmp_path / "cli.mtrace.json"
    prog = os.path.join(HERE, "programs", "exit3.py")
    r = subprocess.run([sys.executable, "-m", "memory_tracer", "trace", "-q", "-o", str(out), "--", sys.executable, prog], capture_output=True, text=True)
    assert r.returncode == 3, r.stderr
    assert r.stdout == "to stdout\n"
    assert json.loads(out.read_text())["trace"]["events"]
