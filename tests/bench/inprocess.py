"""What tracing costs a training step, measured inside one process: the modes take turns in
blocks of steps (every mode once per round, in a rotated order), so the differences between
processes (CPU placement and speed, cuDNN's choices, clocks: up to ±25 % on the GPU machines)
cancel and what is left is each mode's own cost per step.

    PYTHONPATH=<memory_tracer package> MEMORY_TRACER_COLLECTOR=<collector> \\
        python tests/bench/inprocess.py --model resnet50 [--batch 32] [--rounds 10] \\
        [--block 6] [--pairs N [--settle K]] [--device cuda] [--json OUT]

With `--pairs N` each mode instead runs N pairs of steps, one traced and one untraced, in
alternating order (the capture paused, which takes every hook out, and resumed around its
step; the recorder turned on and off), and its overhead is the median over the pairs of
traced / untraced - 1: neighbouring steps share the machine's state, so the pairs cancel
what drifts. After each switch `--settle K` steps (default 1) run unmeasured, so a pair
compares steady steps, as a trace that is not paused runs them: a switch has costs of its
own that land on the next step (on Python 3.12+ the capture's sys.monitoring events, set or
cleared, make CPython instrument again every function that next step calls). Those first
steps after resuming are kept too (`first_after_resume`, each with its pair's untraced step, in
the JSON; the table's last column).

Modes: untraced (no capture installed: every hook is taken out between blocks);
MemoryTracer's default (ops="backward": every allocation with module path, phase, iteration,
backward attributed to modules); ops="none"; ops="none" with module_scopes=False (phases and
iterations only); the default with holders=True (who holds each storage, `collector why`); and, on CUDA, PyTorch's recorder with stacks="all", stacks="python" and
context=None. A block starts its mode, runs `--block` steps (the first one not measured), and
stops it; starting and stopping are not timed. Prints a markdown table: each mode's median
step time, host time (until the step's work was queued) and host CPU time (what the Python
thread spent queuing it, which waiting for a core does not lengthen) over all its measured
steps, and the overhead against untraced: of the medians of all steps, and the median and
range of the per-round ratios."""
import argparse
import contextlib
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_steps  # noqa: E402

import memory_tracer  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--model", required=True, choices=["resnet50", "llama", "mlp"])
p.add_argument("--batch", type=int)
p.add_argument("--rounds", type=int, default=10)
p.add_argument("--block", type=int, default=6)
p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
p.add_argument("--pairs", type=int, default=0)
p.add_argument("--settle", type=int, default=1, help="with --pairs: unmeasured steps after each switch (default 1)")
p.add_argument("--json")
p.add_argument("--modes", help="modes to run beside untraced, separated by ',' or ';' (default: all)")
p.add_argument("--compile", action="store_true", help="torch.compile the model (default mode)")
a = p.parse_args()
if a.block < 2:
    p.error("--block must be at least 2 (a block's first step is not measured)")
dev = torch.device(a.device)
if dev.type == "cpu":
    torch.set_num_threads(1)
model, loss_fn, opt, amp = train_steps.build(a.model, a.batch, dev, compile=a.compile)

TRACERS = {
    "memory_tracer (default)": {},
    "memory_tracer ops=none": {"ops": "none"},
    "memory_tracer module_scopes=False": {"module_scopes": False},
    "memory_tracer ops=none, module_scopes=False": {"ops": "none", "module_scopes": False},
    "memory_tracer holders=True": {"holders": True},
    "memory_tracer ledger=True": {"ledger": True},
}
RECORDERS = {'recorder stacks="all"': "all", 'recorder stacks="python"': "python", "recorder context=None": "none"}
modes = ["untraced"] + list(TRACERS) + (list(RECORDERS) if dev.type == "cuda" else [])
if a.modes:
    # ';' between modes when a mode's name has a comma ("memory_tracer ops=none, module_scopes=False")
    wanted = [m.strip() for m in a.modes.split(";" if ";" in a.modes else ",")]
    unknown = [m for m in wanted if m not in modes]
    if unknown:
        p.error(f"--modes: unknown {unknown}; the modes are {modes[1:]}")
    modes = ["untraced"] + [m for m in modes[1:] if m in wanted]


def block(mode):
    """Runs one block in `mode`; its measured steps' (host ms, step ms, host CPU ms)."""
    steps = []
    if mode in TRACERS:
        tracer = memory_tracer.MemoryTracer(device=str(dev), max_events=10_000_000, **TRACERS[mode])
        with tracer.trace(model):
            for _ in range(a.block):
                steps.append(train_steps.timed_step(dev, loss_fn, opt, amp))
    else:
        if mode in RECORDERS:
            train_steps.recorder(RECORDERS[mode])
        for _ in range(a.block):
            steps.append(train_steps.timed_step(dev, loss_fn, opt, amp))
        if mode in RECORDERS:
            train_steps.recorder(None)
    return steps[1:]


def paired(mode):
    """N (traced, untraced) pairs of `mode`: [(host, step, host CPU) traced, ... untraced]."""
    step = lambda: train_steps.timed_step(dev, loss_fn, opt, amp)  # noqa: E731
    if mode in TRACERS:
        tracer = memory_tracer.MemoryTracer(device=str(dev), max_events=10_000_000, **TRACERS[mode])
        session, on, off = tracer.trace(model), memory_tracer.resume, memory_tracer.pause
    else:
        session = contextlib.nullcontext()
        on, off = lambda: train_steps.recorder(RECORDERS[mode]), lambda: train_steps.recorder(None)  # noqa: E731

    first = []  # with --settle: each pair's first traced step after resuming, and its untraced step

    def settled(switch):
        """Switches, runs --settle steps unmeasured (the first of them kept), then the
        measured one."""
        switch()
        if a.settle > 0:
            kept = step()
            for _ in range(a.settle - 1):
                step()
            return kept, step()
        return None, step()

    def pair(traced_first):
        order = [on, off] if traced_first else [off, on]
        got = {sw: settled(sw) for sw in order}
        if not traced_first:
            off()
        if a.settle > 0:
            first.append((got[on][0], got[off][1]))
        return got[on][1], got[off][1]

    pairs = []
    with session:
        off()  # a tracer starts recording: untraced until its first step
        for i in range(a.pairs):
            pairs.append(pair(i % 2 == 0))
        off()
    return pairs, first


for _ in range(3):  # warm-up: cuDNN, the allocator's pool, the capture library's first load
    train_steps.timed_step(dev, loss_fn, opt, amp)
block("memory_tracer (default)")

if a.pairs > 0:
    title = f"{a.model}{' b' + str(a.batch) if a.batch else ''}{' compiled' if a.compile else ''} on {dev.type}, {a.pairs} pairs of steps"
    print(f"| {title} | traced step | untraced step | overhead: median of pairs (interquartile range) | host CPU overhead: median of pairs "
          f"| first step after resuming: against untraced (settle {a.settle}) |")
    print("|---|---|---|---|---|---|")
    result = {"model": a.model, "batch": a.batch, "compiled": a.compile, "device": dev.type, "pairs": a.pairs, "settle": a.settle, "modes": {}}
    for m in modes[1:]:
        ps, first = paired(m)
        step_rel = [(t[1] / u[1] - 1) * 100 for t, u in ps]
        cpu_rel = [(t[2] / u[2] - 1) * 100 for t, u in ps]
        q1, _, q3 = statistics.quantiles(step_rel, n=4)
        first_rel = f"{statistics.median((t[1] / u[1] - 1) * 100 for t, u in first):+.1f} %" if first else "–"
        print(f"| {m} | {statistics.median(t[1] for t, _ in ps):.2f} ms | {statistics.median(u[1] for _, u in ps):.2f} ms "
              f"| {statistics.median(step_rel):+.1f} % ({q1:+.1f} … {q3:+.1f}) | {statistics.median(cpu_rel):+.1f} % | {first_rel} |", flush=True)
        result["modes"][m] = {"pairs": ps, "first_after_resume": first}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    sys.exit(0)

per_round = {m: [] for m in modes}  # per round: (median host, median step, median host CPU)
every = {m: ([], [], []) for m in modes}
for r in range(a.rounds):
    order = modes[r % len(modes):] + modes[: r % len(modes)]
    for m in order:
        steps = block(m)
        columns = [[s[k] for s in steps] for k in range(3)]
        for k in range(3):
            every[m][k].extend(columns[k])
        per_round[m].append(tuple(statistics.median(c) for c in columns))
    print(f"round {r + 1}: " + ", ".join(f"{m} {per_round[m][-1][1]:.2f} ms" for m in modes), file=sys.stderr, flush=True)


def rel(m, k):
    return [(x[k] / b[k] - 1) * 100 for x, b in zip(per_round[m], per_round["untraced"])]


title = f"{a.model}{' b' + str(a.batch) if a.batch else ''} on {dev.type}, {a.rounds} rounds × {a.block - 1} steps"
COLUMNS = [(1, "step"), (0, "host time"), (2, "host CPU time")]
print(f"| {title} | " + " | ".join(f"{n} | overhead | per-round median (range)" for _, n in COLUMNS) + " |")
print("|---|" + "---|---|---|" * len(COLUMNS))
result = {"model": a.model, "batch": a.batch, "device": dev.type, "rounds": a.rounds, "block": a.block, "modes": {}}
for m in modes:
    cells = []
    for k, _ in COLUMNS:
        med, base = statistics.median(every[m][k]), statistics.median(every["untraced"][k])
        if m == "untraced":
            cells.append(f"{med:.2f} ms | | ")
        else:
            r = rel(m, k)
            cells.append(f"{med:.2f} ms | {(med / base - 1) * 100:+.1f} % | {statistics.median(r):+.1f} % ({min(r):+.1f} … {max(r):+.1f})")
    print(f"| {m} | " + " | ".join(cells) + " |")
    result["modes"][m] = {"step_ms": every[m][1], "host_ms": every[m][0], "host_cpu_ms": every[m][2], "round_medians": per_round[m]}
if a.json:
    with open(a.json, "w") as f:
        json.dump(result, f, indent=1)
