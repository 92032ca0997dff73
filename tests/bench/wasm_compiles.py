#!/usr/bin/env python3
"""Which of the viewer worker's wasm functions V8 compiled, with which compiler, and when: before
a chosen file was opened (during the worker's warm-up) or during its open. V8 does not replace
a wasm function while it runs, so a function an open calls once and that loops inside runs that
whole open in the baseline compiler (Liftoff) if its optimised code (TurboFan) comes during it,
and the compile takes a core meanwhile (docs/benchmarks.md, "The warm-up that lets V8 optimise
an open, and the file read on the page's thread").

    # a Chromium that prints each wasm compile, each line stamped with the time it came
    cat > /tmp/chromium-trace <<'EOF'
    #!/bin/sh
    exec stdbuf -oL -eL /usr/bin/chromium --js-flags=--trace-wasm-compilation-times "$@" 2>&1 | python3 -u -c 'import sys,time
    for l in sys.stdin: sys.stdout.write("%.3f %s" % (time.time(), l)); sys.stdout.flush()' >> /tmp/v8trace.log
    EOF
    chmod +x /tmp/chromium-trace; rm -f /tmp/v8trace.log
    CHROMIUM=/tmp/chromium-trace MEMORY_TRACER_BENCH_RUNS=1 MEMORY_TRACER_VIEWER_BENCH_FILES=big.pickle \\
        cargo bench -p collector --bench viewer
    # the worker's function names, as dist/ has it (-g keeps them; the code is the same)
    wasm-bindgen --target no-modules --out-dir wb --out-name worker target/wasm32-unknown-unknown/release/worker.wasm
    wasm-opt -O3 -g wb/worker_bg.wasm -o wb/named.wasm
    wasm-opt wb/named.wasm --print-function-map > wb/map.txt
    python3 tests/bench/wasm_compiles.py /tmp/v8trace.log wb/map.txt

The open begins at the last compile of the worker's message reader (`ToWorker::from_js`), whose
first call for a file comes after the warm-up. Prints the worker's TurboFan compiles of 5 ms or
more, each marked before or during the open.
"""
import re
import sys

from wasm_tiers import function_names

LINE = re.compile(r"([0-9.]+) Compiled function 0x([0-9a-f]+)#(\d+) using (\w+), took (\d+) μs")


def main(log, function_map, least_ms=5.0):
    names = function_names(function_map)
    rows = []
    for line in open(log, encoding="utf-8", errors="replace"):
        m = LINE.match(line)
        if m:
            rows.append((float(m.group(1)), m.group(2), int(m.group(3)), m.group(4), int(m.group(5)) / 1000))
    if not rows:
        sys.exit(f"{log}: no compiles (run Chromium with --js-flags=--trace-wasm-compilation-times)")
    start = min(r[0] for r in rows)
    # The worker's module is the one whose function at an index is the worker's message reader.
    readers = [r for r in rows if "ToWorker::from_js" in names.get(r[2], "")]
    if not readers:
        sys.exit(f"{function_map}: no ToWorker::from_js among the compiled functions (is it the worker's map?)")
    module = readers[0][1]
    opened = max(r[0] for r in readers if r[1] == module)
    print(f"the open began {opened - start:.3f} s after the first compile")
    total = {"before": 0.0, "during": 0.0}
    for t, mod, index, compiler, ms in rows:
        if mod != module or compiler != "TurboFan":
            continue
        when = "during" if t >= opened else "before"
        total[when] += ms
        if ms >= least_ms:
            print(f"{t - start:7.3f} {when:6} {ms:7.1f} ms  #{index} {names.get(index, '?')[:100]}")
    print(f"TurboFan compiles of the worker: {total['before']:.0f} ms before the open, {total['during']:.0f} ms during or after it")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
