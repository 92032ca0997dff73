#!/usr/bin/env bash
# Issue 19 on 2 GPUs: per-rank snapshots of DDP and FSDP2 imported against PyTorch's counters,
# and the same jobs traced by `collector trace -- torchrun` (ranks merged).
#   tests/gpu/ddp_run.sh COLLECTOR OUT_DIR
# Prints a CHECK line (tests/gpu/checks.py) per rank: the snapshot's peak and the merged trace's
# peak against the rank's own max_memory_allocated(), to the byte (docs/benchmarks.md, issue
# 32); reserved peaks are printed, not judged (recording starts after the model is built).
# Exits non-zero when one misses.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
collector=$1
final=$2
out=/tmp/mt-ddp
. "$(dirname "$0")/torch_env.sh"
export NCCL_NVLS_ENABLE=0
mkdir -p "$out" "$final"
for mode in ${MODES:-ddp fsdp2}; do
  "$venv/bin/python" -m torch.distributed.run --nproc-per-node 2 "$here/ddp_snapshots.py" $mode "$out" > "$out/$mode.snapshots.log" 2>&1
  grep '^RESULT' "$out/$mode.snapshots.log" > "$out/$mode.facts.jsonl"
  for r in 0 1; do "$collector" summary "$out/${mode}_rank$r.pickle" --json > "$out/${mode}_rank$r.summary.json" 2>>"$out/$mode.import.log"; done
  "$collector" merge "$out/${mode}_rank0.pickle" "$out/${mode}_rank1.pickle" -o "/tmp/$mode.merged.mtrace.json" 2>>"$out/$mode.import.log"
  "$collector" summary "/tmp/$mode.merged.mtrace.json" --json > "$out/$mode.merged.summary.json"
  "$collector" trace -q -o "/tmp/$mode.traced.mtrace.json" -- "$venv/bin/python" -m torch.distributed.run --nproc-per-node 2 "$here/ddp_snapshots.py" $mode "$out" --no-snapshot > "$out/$mode.traced.log" 2>&1
  grep '^RESULT' "$out/$mode.traced.log" > "$out/$mode.traced.facts.jsonl"
  "$collector" summary "/tmp/$mode.traced.mtrace.json" --json > "$out/$mode.traced.summary.json"
  rm -f "$out"/${mode}_rank*.pickle
done
PYTHONPATH="$here" "$venv/bin/python" - "$out" "${MODES:-ddp fsdp2}" <<'PY' | tee "$final/ddp_results.txt"
import json, sys, os
from checks import check
out = sys.argv[1]
ok = True

def results(path):
    # Ranks print concurrently: one line may hold two RESULT objects.
    text = open(path).read()
    found = [json.loads(part.strip().splitlines()[0]) for part in text.split("RESULT ")[1:]]
    return {r["rank"]: r for r in found}

for mode in sys.argv[2].split():
    facts = results(os.path.join(out, f"{mode}.facts.jsonl"))
    traced_facts = results(os.path.join(out, f"{mode}.traced.facts.jsonl"))
    for r in (0, 1):
        s = json.load(open(os.path.join(out, f"{mode}_rank{r}.summary.json")))
        print(mode, "snapshot rank", r, "trace peak", s["peak_allocated_bytes"], "torch", facts[r]["max_memory_allocated"], "diff", s["peak_allocated_bytes"] - facts[r]["max_memory_allocated"])
        ok &= check(f"{mode}.snapshot.rank{r}.peak", s["peak_allocated_bytes"], f"={facts[r]['max_memory_allocated']}",
                    s["peak_allocated_bytes"] == facts[r]["max_memory_allocated"])
    m = json.load(open(os.path.join(out, f"{mode}.merged.summary.json")))
    print(mode, "merged devices", [(d["device"], d["peak_allocated_bytes"]) for d in m["devices"]])
    for r in (0, 1):
        s = json.load(open(os.path.join(out, f"{mode}_rank{r}.summary.json")))
        print(mode, "snapshot rank", r, "reserved", s["peak_reserved_bytes"], "torch", facts[r]["max_memory_reserved"], "warnings", s["warnings"][:2])
    t = json.load(open(os.path.join(out, f"{mode}.traced.summary.json")))
    for d in t["devices"]:
        r = d["rank"]
        print(mode, "traced", d["device"], "peak", d["peak_allocated_bytes"], "torch", traced_facts[r]["max_memory_allocated"], "diff", d["peak_allocated_bytes"] - traced_facts[r]["max_memory_allocated"])
        ok &= check(f"{mode}.traced.rank{r}.peak", d["peak_allocated_bytes"], f"={traced_facts[r]['max_memory_allocated']}",
                    d["peak_allocated_bytes"] == traced_facts[r]["max_memory_allocated"])
    ok &= check(f"{mode}.traced.ranks", len(t["devices"]), "=2", len(t["devices"]) == 2)
sys.exit(0 if ok else 1)
PY
status=${PIPESTATUS[0]}
cat "$out"/*.import.log > "$final/ddp_import.log" 2>/dev/null
exit "$status"
