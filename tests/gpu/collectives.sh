#!/usr/bin/env bash
# Collectives in a traced 2-GPU DDP job: `collector trace --ops all -- torchrun` records NCCL
# and c10d operators with their tensors; prints them per rank with counts and bytes.
#   tests/gpu/collectives.sh COLLECTOR OUT_DIR
# Prints a CHECK line (tests/gpu/checks.py) per rank: at least one all-reduce call per training
# step (ddp_snapshots.py runs 3) with input bytes (DDP's gradient buckets), and the traced job's
# exit status; exits non-zero when one misses.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
collector=$1
out=$2
. "$(dirname "$0")/torch_env.sh"
export NCCL_NVLS_ENABLE=0
mkdir -p "$out" /tmp/mt-coll
rm -f /tmp/mt-coll/ddp.mtrace.json
"$collector" trace -q --ops all -o /tmp/mt-coll/ddp.mtrace.json -- "$venv/bin/python" -m torch.distributed.run --nproc-per-node 2 "$here/ddp_snapshots.py" ddp /tmp/mt-coll --no-snapshot > "$out/collectives.log" 2>&1
rc=$?
check collectives.job "rc=$rc" "rc=0" [ $rc = 0 ]
fail=$?
"$collector" summary /tmp/mt-coll/ddp.mtrace.json > "$out/collectives_summary.txt" 2>&1
PYTHONPATH="$here" "$venv/bin/python" - <<'PY' | tee "$out/collectives.txt"
import json, collections, sys
from checks import check
t = json.load(open("/tmp/mt-coll/ddp.mtrace.json"))["trace"]
S = t["strings"]
per = collections.defaultdict(lambda: [0, 0])
for o in t["ops"]:
    name = S[o["name"]]
    if any(k in name.lower() for k in ("nccl", "c10d", "allreduce", "all_reduce", "broadcast", "allgather", "reduce_scatter")):
        rank = (o["thread"] >> 48) - 1
        a, b = o["inputs"]
        per[(rank, name)][0] += 1
        per[(rank, name)][1] += sum(t["tensors"][i]["size_bytes"] for i in range(a, b))
for (rank, name), (n, bytes_) in sorted(per.items()):
    print(f"rank {rank}  {name}: {n} calls, {bytes_} input bytes")
ok = True
for rank in (0, 1):
    calls = [(n, b) for (r, name), (n, b) in per.items() if r == rank and ("allreduce" in name.lower() or "all_reduce" in name.lower())]
    n, b = sum(c[0] for c in calls), sum(c[1] for c in calls)
    ok &= check(f"rank{rank}.all_reduce", f"{n}_calls/{b}_B", ">=3_calls,>0_B", n >= 3 and b > 0)
sys.exit(0 if ok else 1)
PY
[ "${PIPESTATUS[0]}" = 0 ] || fail=1
exit $fail
