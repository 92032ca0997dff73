"""What naming lines outside modules costs (Python 3.12+, sys.monitoring): ns per line of the
program's own code executed, and per allocation made outside modules, on the CPU. Rounds
interleave three modes in one process: untraced, traced without module scopes (no line
events), traced by default (line events); medians of rounds, with their range.
    PYTHONPATH=<memory_tracer package> MEMORY_TRACER_COLLECTOR=<collector> python user_lines_cost.py
"""

import argparse
import statistics
import sys
import time

import memory_tracer
import torch

p = argparse.ArgumentParser()
p.add_argument("--rounds", type=int, default=9)
p.add_argument("--n", type=int, default=20000)
a = p.parse_args()

x = torch.zeros(4)


def lines(n):
    # Ten lines of the program's own code per turn, no allocation.
    acc = 0
    for i in range(n):
        acc += i
        acc ^= 3
        acc -= 1
        acc += 2
        acc &= 0xFFFF
        acc |= 1
        acc += i & 7
        acc -= i & 3
        acc ^= 5
    return acc


def allocations(n):
    # One allocation (and its free) per turn, outside every module.
    for _ in range(n):
        y = x + 1  # noqa: F841


MODES = {"untraced": None, "traced, module_scopes=False": {"module_scopes": False}, "traced (default)": {}}


def timed(mode, fn):
    opts = MODES[mode]
    if opts is None:
        t = time.perf_counter_ns()
        fn(a.n)
        return time.perf_counter_ns() - t
    tracer = memory_tracer.MemoryTracer(device="cpu", max_events=10_000_000, **opts)
    with tracer.trace(None):
        t = time.perf_counter_ns()
        fn(a.n)
        return time.perf_counter_ns() - t


print(f"Python {sys.version_info[0]}.{sys.version_info[1]}, torch {torch.__version__}, {a.rounds} rounds of {a.n} turns")
print("| work | mode | ns per turn | over untraced | range over rounds |")
print("|---|---|---|---|---|")
for name, fn in (("10 lines", lines), ("1 allocation", allocations)):
    per = {m: [] for m in MODES}
    for r in range(a.rounds):
        order = list(MODES)[r % 3 :] + list(MODES)[: r % 3]
        for m in order:
            per[m].append(timed(m, fn) / a.n)
    base = statistics.median(per["untraced"])
    for m, v in per.items():
        med = statistics.median(v)
        over = "" if m == "untraced" else f"{med - base:+.0f}"
        print(f"| {name} | {m} | {med:.0f} | {over} | {min(v):.0f} … {max(v):.0f} |")
