"""Memory scalars in TensorBoard, read back by TensorBoard's own EventAccumulator:
`collector convert --format tensorboard` into a run folder that already holds another run's
events, `MemoryTracer(tensorboard_dir=...)`, and `tracer.to_tensorboard(SummaryWriter)`, each
compared with `collector summary --json` and `collector leaks --json` on the same trace."""

import json
import os
import subprocess

import pytest
import torch
import torch.nn as nn

import memory_tracer
from memory_tracer import MemoryTracer

from tensorboard.backend.event_processing import event_accumulator  # noqa: E402  (pip install memory_tracer[tensorboard])

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "data")
TAGS = ["memory/peak_allocated", "memory/peak_reserved", "memory/fragmentation", "memory/allocated_at_end", "memory/leak_growth"]


def collector(*args):
    r = subprocess.run([memory_tracer.collector_path(), *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def scalars(logdir):
    acc = event_accumulator.EventAccumulator(str(logdir), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def train(tracer, steps=4):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.Adam(model.parameters())
    kept = []
    with tracer.trace(model):
        for _ in range(steps):
            loss = model(torch.randn(32, 64)).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            kept.append(torch.ones(4096))  # 16 KiB kept per iteration: a leak
    return model


def test_convert_adds_a_run_next_to_the_loss_curves(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    logdir = tmp_path / "runs" / "exp1"
    with SummaryWriter(str(logdir)) as w:  # the training run's own loss curve
        for step in range(3):
            w.add_scalar("loss", 1.0 / (step + 1), step)
    before = set(os.listdir(logdir))
    snapshot = os.path.join(DATA, "resnet18_sgd_2steps.pickle")
    collector("convert", snapshot, "-o", str(logdir), "--format", "tensorboard")
    collector("convert", snapshot, "-o", str(logdir), "--format", "tensorboard")
    after = set(os.listdir(logdir))
    assert before < after and len(after - before) == 2, "each convert adds its own event file, nothing is overwritten"
    got = scalars(logdir)
    assert [v for _, v in got["loss"]] == pytest.approx([1.0, 0.5, 1 / 3]), "the run's own scalars are still there"
    for tag in TAGS:
        assert tag in got, tag
    summary = json.loads(collector("summary", snapshot, "--json"))
    peaks = [v for _, v in got["memory/peak_allocated"]]
    # float32 in the event file: equal to 24 bits of mantissa.
    assert max(peaks) == pytest.approx(summary["peak_allocated_bytes"], rel=1e-7)
    assert any(t.startswith("memory/peak_") and t.split("_", 1)[1] in ("forward", "backward", "optimizer", "other") for t in got)


def test_the_tracer_writes_each_iteration_and_its_leak(tmp_path):
    logdir = tmp_path / "tb"
    tracer = MemoryTracer(device="cpu", tensorboard_dir=logdir)
    train(tracer)
    got = scalars(logdir)
    trace = tmp_path / "t.mtrace.json"
    tracer.save(trace)
    leaks = json.loads(collector("leaks", str(trace), "--json"))
    ends = leaks["allocated_at_end_bytes"]
    assert [v for _, v in got["memory/allocated_at_end"]] == pytest.approx(ends, rel=1e-7)
    growth = [v for _, v in got["memory/leak_growth"]]
    assert growth[0] == 0 and growth[1:] == pytest.approx([b - a for a, b in zip(ends, ends[1:])], rel=1e-6)
    assert all(g >= 16384 for g in growth[2:]), growth
    steps = [s for s, _ in got["memory/peak_allocated"]]
    assert steps == list(range(len(ends)))
    summary = json.loads(collector("summary", str(trace), "--json"))
    assert max(v for _, v in got["memory/peak_allocated"]) <= summary["peak_allocated_bytes"]


def test_to_tensorboard_feeds_a_summary_writer(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    tracer = MemoryTracer(device="cpu")
    train(tracer, steps=3)
    with SummaryWriter(str(tmp_path / "w")) as w:
        n = tracer.to_tensorboard(w)
    got = scalars(tmp_path / "w")
    assert n == len(got["memory/peak_allocated"]) >= 3
    # The same numbers `collector convert` writes.
    trace = tmp_path / "t.mtrace.json"
    tracer.save(trace)
    collector("convert", str(trace), "-o", str(tmp_path / "c"), "--format", "tensorboard")
    assert scalars(tmp_path / "c") == got


def test_a_file_in_the_way_is_a_clear_error(tmp_path):
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("x")
    r = subprocess.run(
        [memory_tracer.collector_path(), "convert", os.path.join(DATA, "mlp_adam_3steps.pickle"), "-o", str(blocker), "--format", "tensorboard"],
        capture_output=True,
        text=True,
    )
    assert r.returncode != 0 and "cannot create the TensorBoard folder" in r.stderr, r.stderr
    assert blocker.read_text() == "x"
