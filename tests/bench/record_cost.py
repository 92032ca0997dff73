"""What one allocation record costs on this machine: a loop that allocates and frees a small
tensor (no kernel runs) timed (the thread's CPU time, on one core) untraced, under the capture's modes and under PyTorch's
recorder, in interleaved rounds; prints ns per allocation (one alloc + one free) as median
and range over rounds, and the clock source and the cost of one clock read. Needs
PYTHONPATH to hold the memory_tracer package (with its _lib).

    python tests/bench/record_cost.py [--device cuda] [--n 200000] [--rounds 7]"""
import argparse
import os
import statistics
import time

import torch

from memory_tracer import _capture, _shim

p = argparse.ArgumentParser()
p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
p.add_argument("--n", type=int, default=200_000)
p.add_argument("--rounds", type=int, default=11)
a = p.parse_args()
dev = torch.device(a.device)
lib = _shim.load()
if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})

try:
    with open("/sys/devices/system/clocksource/clocksource0/current_clocksource") as f:
        print("clock source:", f.read().strip())
except OSError:
    pass
clock = time.perf_counter_ns
t0 = clock()
for _ in range(1_000_000):
    clock()
print(f"time.perf_counter_ns(): {(clock() - t0) / 1e6:.1f} ns a call (Python call included)")

CAPTURES = {
    "capture, allocations only": {"capture_ops": 0, "module_scopes": False},
    "capture, autograd nodes (default)": {"capture_ops": 2},
}
RECORDERS = {"recorder context=None": {"context": None}, 'recorder stacks="python"': {"stacks": "python"}}
modes = ["untraced"] + list(CAPTURES) + (list(RECORDERS) if dev.type == "cuda" else [])


def loop():
    """The thread's CPU time per iteration (waiting for a core does not count)."""
    t = None
    start = time.thread_time_ns()
    for _ in range(a.n):
        t = torch.empty(256, device=dev)
    del t
    return (time.thread_time_ns() - start) / a.n


def run(mode):
    if mode in CAPTURES:
        fd = os.open(os.devnull, os.O_WRONLY)
        cap = _capture.begin(lib, fd, dict(CAPTURES[mode], max_events=100_000_000), "api", {"mode": "bench"})
        try:
            return loop()
        finally:
            cap.finish("bench")
    if mode in RECORDERS:
        torch.cuda.memory._record_memory_history(max_entries=100_000, **RECORDERS[mode])
        try:
            return loop()
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
    return loop()


loop()
res = {m: [] for m in modes}
for r in range(a.rounds):
    for m in modes[r % len(modes):] + modes[: r % len(modes)]:
        res[m].append(run(m))
base = statistics.median(res["untraced"])
print(f"| mode ({dev.type}) | ns per alloc+free | over untraced | range over rounds |")
print("|---|---|---|---|")
for m in modes:
    v = res[m]
    med = statistics.median(v)
    print(f"| {m} | {med:.0f} | {'' if m == 'untraced' else f'+{med - base:.0f}'} | {min(v):.0f} … {max(v):.0f} |")
