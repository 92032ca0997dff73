"""What tracing costs a training program, as a user sees it: whole processes, each printing
the median time of its steps after warm-up (tests/bench/train_steps.py), in interleaved
rounds (every mode once per round, in a rotated order: processes differ by up to ±15 % on a
GPU from cuDNN's algorithm choice and clocks, so single runs prove little).

    python tests/bench/overhead.py --collector target/release/collector --model resnet50 \
        [--batch 32] [--rounds 5] [--steps 60] [--device cuda] [--json OUT]

Modes: untraced; `collector trace` (default capture: every allocation with module path,
phase, iteration, backward attributed to modules); `collector trace --ops none` (no autograd
nodes); `collector trace --ops none --no-module-scopes` (allocations with phases and
iterations only); and, on CUDA, PyTorch's recorder with stacks="all", stacks="python" and
context=None. Prints a markdown table: each mode's median step time over the rounds, its
overhead against the untraced run of the same round (median and range), and the same for the
host time (until the step's work is queued, before the device is synchronized)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
p = argparse.ArgumentParser()
p.add_argument("--collector", required=True)
p.add_argument("--model", required=True)
p.add_argument("--batch", type=int)
p.add_argument("--rounds", type=int, default=5)
p.add_argument("--steps", type=int, default=60)
p.add_argument("--device", default="cuda")
p.add_argument("--python", default=sys.executable)
p.add_argument("--json")
p.add_argument("--cpus", help="run every process on these CPUs (taskset -c LIST): one core set for all modes takes the scheduler's placement out of the comparison")
a = p.parse_args()

program = [a.python, os.path.join(here, "train_steps.py"), "--model", a.model, "--steps", str(a.steps), "--device", a.device]
if a.batch:
    program += ["--batch", str(a.batch)]
tmp = tempfile.mkdtemp(prefix="mt-overhead-")
modes = {
    "untraced": program,
    "collector (default)": [a.collector, "trace", "-q", "-o", os.path.join(tmp, "t.mtrace.json"), "--"] + program,
    "collector --ops none": [a.collector, "trace", "-q", "--ops", "none", "-o", os.path.join(tmp, "n.mtrace.json"), "--"] + program,
    "collector --ops none --no-module-scopes": [a.collector, "trace", "-q", "--ops", "none", "--no-module-scopes", "-o", os.path.join(tmp, "m.mtrace.json"), "--"] + program,
}
if a.device == "cuda":
    for r in ("all", "python", "none"):
        label = {"all": 'recorder stacks="all"', "python": 'recorder stacks="python"', "none": "recorder context=None"}[r]
        modes[label] = program + ["--recorder", r]
names = list(modes)
times = {m: [] for m in names}
host = {m: [] for m in names}
for k in range(a.rounds):
    order = names[k % len(names):] + names[: k % len(names)]
    for m in order:
        cmd = (["taskset", "-c", a.cpus] if a.cpus else []) + modes[m]
        out = subprocess.run(cmd, capture_output=True, text=True)
        line = next((l for l in out.stdout.splitlines() if l.startswith("STEP_MS ")), None)
        host_line = next((l for l in out.stdout.splitlines() if l.startswith("HOST_MS ")), None)
        if out.returncode != 0 or line is None or host_line is None:
            sys.exit(f"{m}: exit {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
        times[m].append(float(line.split()[1]))
        host[m].append(float(host_line.split()[1]))
    print(f"round {k + 1}: " + ", ".join(f"{m} {times[m][-1]:.2f} ms" for m in names), file=sys.stderr, flush=True)

base = times["untraced"]
print(f"| {a.model}{' b' + str(a.batch) if a.batch else ''} on {a.device}, {a.rounds} rounds | median step | overhead (median) | range | host time | host overhead (median) | range |")
print("|---|---|---|---|---|---|---|")
hbase = host["untraced"]
result = {"model": a.model, "batch": a.batch, "device": a.device, "rounds": a.rounds, "steps": a.steps, "modes": {}}
for m in names:
    rel = [(t / b - 1) * 100 for t, b in zip(times[m], base)]
    hrel = [(t / b - 1) * 100 for t, b in zip(host[m], hbase)]
    med, hmed = statistics.median(times[m]), statistics.median(host[m])
    if m == "untraced":
        print(f"| {m} | {med:.2f} ms | | {min(times[m]):.2f} … {max(times[m]):.2f} ms | {hmed:.2f} ms | | {min(host[m]):.2f} … {max(host[m]):.2f} ms |")
    else:
        print(f"| {m} | {med:.2f} ms | {statistics.median(rel):+.1f} % | {min(rel):+.1f} … {max(rel):+.1f} % "
              f"| {hmed:.2f} ms | {statistics.median(hrel):+.1f} % | {min(hrel):+.1f} … {max(hrel):+.1f} % |")
    result["modes"][m] = {"step_ms": times[m], "overhead_pct": rel, "host_ms": host[m], "host_overhead_pct": hrel}
if a.json:
    with open(a.json, "w") as f:
        json.dump(result, f, indent=1)
