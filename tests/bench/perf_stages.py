#!/usr/bin/env python3
"""Where a load's CPU time goes: the self time of `perf record` profiles of `collector summary`
(a release build, with its debug info), grouped by function into the import's stages, averaged
over the profiles given (docs/benchmarks.md, "Where a load's time goes").

    for i in 1 2 3; do perf record -F 4000 -o perf$i.data target/release/collector summary big.pickle >/dev/null; done
    python3 tests/bench/perf_stages.py perf1.data perf2.data perf3.data
"""
import re, subprocess, sys, collections
stages = [
    ("read (kernel copies, page faults)", r"^\[k\]"),
    ("unpickle (pickle VM, flat reads, arena)", r"shared::import::pickle::"),
    ("entries and interning (frames, stacks, extras)", r"shared::import::snapshot::(interning|entries|extras|view|segments|compactor|stacks)|Compactor"),
    ("start state and replay (allocator model, event columns)", r"shared::import::snapshot::(replay|start)|shared::allocator::|shared::model::events::|EventStore|TotalsCursor|btree::"),
    ("analyses (summary, layers, leaks, categories, …)", r"shared::analysis::"),
    ("memory copies and allocation (libc)", r"memmove|memcpy|memcmp|malloc|free|realloc|_int_|cfree"),
]
tot = collections.Counter()
for data in sys.argv[1:]:
    out = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "symbol", "--stdio", "-g", "none"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        m = re.match(r"^\s+([0-9.]+)%\s+(.*)$", line)
        if not m:
            continue
        pct, sym = float(m.group(1)), m.group(2).strip()
        sym = re.sub(r"\s+-\s+-\s*$", "", sym)
        for name, rx in stages:
            if re.search(rx, sym):
                tot[name] += pct
                break
        else:
            tot["other"] += pct
n = len(sys.argv) - 1
for name, _ in stages + [("other", "")]:
    print(f"| {name} | {tot[name] / n:.1f} % |")
