#!/usr/bin/env bash
# Issue 19 on 2 GPUs: per-rank snapshots of DDP and FSDP2 imported against PyTorch's counters,
# and the same jobs traced by `collector trace -- torchrun` (ranks merged).
#   tests/gpu/ddp_run.sh COLLECTOR OUT_DIR
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
"$venv/bin/python" - "$out" "${MODES:-ddp fsdp2}" <<'PY' | tee "$final/ddp_results.txt"
import json, sys, os
out = sys.argv[1]

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
    m = json.load(open(os.path.join(out, f"{mode}.merged.summary.json")))
    print(mode, "merged devices", [(d["device"], d["peak_allocated_bytes"]) for d in m["devices"]])
    for r in (0, 1):
        s = json.load(open(os.path.join(out, f"{mode}_rank{r}.summary.json")))
        print(mode, "snapshot rank", r, "reserved", s["peak_reserved_bytes"], "torch", facts[r]["max_memory_reserved"], "warnings", s["warnings"][:2])
    t = json.load(open(os.path.join(out, f"{mode}.traced.summary.json")))
    for d in t["devices"]:
        r = d["rank"]
        print(mode, "traced", d["device"], "peak", d["peak_allocated_bytes"], "torch", traced_facts[r]["max_memory_allocated"], "diff", d["peak_allocated_bytes"] - traced_facts[r]["max_memory_allocated"])
PY
cat "$out"/*.import.log > "$final/ddp_import.log" 2>/dev/null
