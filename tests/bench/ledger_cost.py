"""What the device ledger costs a ResNet-50 b32 training step on a GPU, and which part: steps
untraced, under the default capture, under `ledger=True` (first launches watched, until they
settle), again once settled, with NVML's per-process samples left out, and untraced after the
ledger let go of CUPTI. Needs PYTHONPATH to hold the memory_tracer package.

    python tests/bench/ledger_cost.py"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import torch
import train_steps  # noqa: E402

import memory_tracer  # noqa: E402
from memory_tracer import _ledger  # noqa: E402

dev = torch.device("cuda")
model, loss_fn, opt, amp = train_steps.build("resnet50", 32, dev)
for _ in range(5):
    train_steps.timed_step(dev, loss_fn, opt, amp)


def run(label, seconds, **kw):
    times = []
    ctx = None if label.startswith("untraced") else memory_tracer.MemoryTracer(device="cuda", max_events=10_000_000, **kw).trace(model)
    if ctx is not None:
        ctx.__enter__()
    t0 = time.time()
    while time.time() - t0 < seconds:
        times.append(train_steps.timed_step(dev, loss_fn, opt, amp)[1])
    if ctx is not None:
        ctx.__exit__(None, None, None)
    late = times[len(times) // 2:]
    print(f"{label}: median step {sorted(times)[len(times) // 2]:.2f} ms, second half {sorted(late)[len(late) // 2]:.2f} ms", flush=True)


run("untraced", 2)
run("default", 3)
run("ledger", 6, ledger=True)
run("ledger again (settled)", 3, ledger=True)
_ledger.Nvml.usage = lambda self, d: None
run("ledger, no NVML samples", 3, ledger=True)
run("untraced after", 2)
