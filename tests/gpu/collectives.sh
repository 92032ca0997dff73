#!/usr/bin/env bash
# Collectives in a traced 2-GPU DDP job: `collector trace --ops all -- torchrun` records NCCL
# and c10d operators with their tensors; prints them per rank with counts and bytes.
#   tests/gpu/collectives.sh COLLECTOR OUT_DIR
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
collector=$1
out=$2
. "$(dirname "$0")/torch_env.sh"
export NCCL_NVLS_ENABLE=0
mkdir -p "$out" /tmp/mt-coll
"$collector" trace -q --ops all -o /tmp/mt-coll/ddp.mtrace.json -- "$venv/bin/python" -m torch.distributed.run --nproc-per-node 2 "$here/ddp_snapshots.py" ddp /tmp/mt-coll --no-snapshot > "$out/collectives.log" 2>&1
"$collector" summary /tmp/mt-coll/ddp.mtrace.json > "$out/collectives_summary.txt" 2>&1
"$venv/bin/python" - <<'PY' | tee "$out/collectives.txt"
import json, collections
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
PY
