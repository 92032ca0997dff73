#!/usr/bin/env bash
# Issue 35 on one GPU: `collector trace` of the private-pool programs of
# tests/gpu/graph_snapshots.py (a CUDA graph, a MemPool), each printing PyTorch's counters and
# its pools at the end (RESULT), then the trace's summary (peak and pools).
#   tests/gpu/pool_trace.sh COLLECTOR OUT_DIR
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
collector=$1
out=$2
. "$here/torch_env.sh"
export MEMORY_TRACER_PYTHON="$venv/bin/python"
mkdir -p "$out/snap"
for m in graph mempool; do
  "$collector" trace -q -o "$out/$m.mtrace.json" -- "$venv/bin/python" "$here/graph_snapshots.py" $m "$out/snap" > "$out/$m.out" 2>&1
  grep RESULT "$out/$m.out"
  "$collector" summary "$out/$m.mtrace.json" | grep -E "peak allocated|pool|at end"
done
