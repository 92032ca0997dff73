#!/usr/bin/env bash
# Issue 35 on one GPU: `collector trace` of the private-pool programs of
# tests/gpu/graph_snapshots.py (a CUDA graph, a MemPool), each printing PyTorch's counters and
# its pools at the end (RESULT), then the trace's summary (peak and pools).
#   tests/gpu/pool_trace.sh COLLECTOR OUT_DIR
# Prints a CHECK line (tests/gpu/checks.py) per program for the trace's peak against
# max_memory_allocated() and for its private pools against those the allocator's own snapshot
# lists (their count); exits non-zero when one misses.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
collector=$1
out=$2
. "$here/torch_env.sh"
export MEMORY_TRACER_PYTHON="$venv/bin/python"
mkdir -p "$out/snap"
fail=0
for m in graph mempool; do
  "$collector" trace -q -o "$out/$m.mtrace.json" -- "$venv/bin/python" "$here/graph_snapshots.py" $m "$out/snap" > "$out/$m.out" 2>&1
  grep RESULT "$out/$m.out"
  "$collector" summary "$out/$m.mtrace.json" | grep -E "peak allocated|pool|at end"
  "$collector" summary --json "$out/$m.mtrace.json" > "$out/$m.summary.json"
  PYTHONPATH="$here" "$venv/bin/python" - "$out/$m.out" "$out/$m.summary.json" "$m" <<'PY' || fail=1
import json, sys
from checks import check
out, summary, mode = sys.argv[1:]
lines = [l for l in open(out) if l.startswith("RESULT ")]
try:
    s = json.load(open(summary))
except ValueError as e:
    s = None
if not lines or s is None:
    sys.exit(0 if check(f"{mode}.run", "failed", "ran", False, "no RESULT line or no summary") else 1)
r = json.loads(lines[-1][len("RESULT "):])
s = s.get("summary", s)  # the summary's fields, flattened in or not
ok = check(f"{mode}.peak", s["peak_allocated_bytes"], f"={r['max_memory_allocated']}", s["peak_allocated_bytes"] == r["max_memory_allocated"])
theirs = sorted(k for k in r["pools_at_end"] if k != "0,0")
ours = [p["pool"] for p in s.get("pools", []) if p.get("index") is not None]
ok &= check(f"{mode}.private_pools", len(ours), f"={len(theirs)}", len(ours) == len(theirs), f"trace {ours}, allocator {theirs}")
sys.exit(0 if ok else 1)
PY
done
exit $fail
