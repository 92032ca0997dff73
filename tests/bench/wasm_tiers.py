#!/usr/bin/env python3
"""Where the viewer's worker spends its CPU in Chromium, by Rust function and V8 tier (Liftoff,
the baseline compiler, or TurboFan), from a system-wide `perf record` of the viewer benchmark
(docs/benchmarks.md, "Answers below the first screen after it").

    # a Chromium that writes V8's code map (/tmp/perf-PID.map), and one run of the benchmark
    printf '#!/bin/sh\\nexec /usr/bin/chromium --js-flags=--perf-basic-prof "$@"\\n' > /tmp/chromium-prof
    chmod +x /tmp/chromium-prof
    perf record -a -F 4000 -o br.data -- env CHROMIUM=/tmp/chromium-prof MEMORY_TRACER_BENCH_RUNS=1 \\
        MEMORY_TRACER_VIEWER_BENCH_FILES=tests/data/resnet18_sgd_2steps.pickle cargo bench -p collector --bench viewer
    # the worker's wasm as dist/ has it, with names (-g keeps them; the code is the same)
    wasm-bindgen --target no-modules --out-dir wb --out-name worker target/wasm32-unknown-unknown/release/worker.wasm
    wasm-opt -O3 -g wb/worker_bg.wasm -o wb/named.wasm
    wasm-opt wb/named.wasm --print-function-map > wb/map.txt
    python3 tests/bench/wasm_tiers.py br.data wb/map.txt

Samples of the worker's thread (`DedicatedWorker`) are cut into bursts (gaps over 20 ms): the
warm-up, then each open. Each burst's top functions are printed with their tier.
"""
import collections, re, subprocess, sys


def function_names(function_map):
    """{index: name} of `wasm-opt --print-function-map`'s output."""
    names = {}
    for line in open(function_map):
        index, _, name = line.partition(":")
        if index.strip().isdigit():
            names[int(index)] = name.strip()
    return names


def main(data, function_map, top=25):
    names = function_names(function_map)
    out = subprocess.run(["perf", "script", "-i", data, "--comm", "DedicatedWorker", "-F", "tid,time,ip,sym,dso", "-G"],
                         capture_output=True, text=True).stdout
    samples = []
    for line in out.splitlines():
        m = re.match(r"\s*\S+\s+([0-9.]+):\s+\S+\s*(.*)", line)
        if m:
            samples.append((float(m.group(1)), m.group(2).strip()))
    samples.sort()
    if not samples:
        sys.exit(f"{data}: no samples of a DedicatedWorker thread")

    def label(sym):
        m = re.match(r"JS:wasm-function\[(\d+)\]-\d+-(\w+)", sym)
        return f"{names.get(int(m.group(1)), '?')[:100]} [{m.group(2)}]" if m else sym[:100]

    bursts = [[samples[0]]]
    for a, b in zip(samples, samples[1:]):
        if b[0] - a[0] > 0.02:
            bursts.append([])
        bursts[-1].append(b)
    for burst in bursts:
        if len(burst) < 40:
            continue
        tiers = collections.Counter(m.group(1) if (m := re.search(r"-(turbofan|liftoff) ", s)) else "other" for _, s in burst)
        print(f"{burst[0][0]:.3f}-{burst[-1][0]:.3f} s: {len(burst)} samples, {dict(tiers)}")
        for sym, n in collections.Counter(label(s) for _, s in burst).most_common(top):
            print(f"  {n:5d}  {sym}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
