#!/usr/bin/env bash
# Issue 19 on 2 GPUs: the built-in models under torchrun (python -m memory_tracer.zoo), DDP
# and FSDP2 with AdamW over NCCL, traced by `collector trace -- torchrun`. Prints, per job and
# rank, the merged trace's peak against the rank's own torch.cuda.max_memory_allocated(), the
# reserved peaks, and the driver's used memory (the gap: CUDA context, NCCL, cuBLAS).
#   tests/gpu/zoo_distributed.sh COLLECTOR OUT_DIR
# Prints a CHECK line (tests/gpu/checks.py) per job and rank: the merged trace's allocated and
# reserved peaks against the rank's max_memory_allocated() and max_memory_reserved(), to the
# byte (docs/benchmarks.md); exits non-zero when one misses or a job printed no figures.
set -uo pipefail
collector=$1
final=$2
here=$(cd "$(dirname "$0")" && pwd)
out=/tmp/mt-zoo
. "$(dirname "$0")/torch_env.sh"
export NCCL_NVLS_ENABLE=0
mkdir -p "$out" "$final"
run() { # name, zoo args...
  local name=$1; shift
  "$collector" trace -q -o "$out/$name.mtrace.json" -- "$venv/bin/python" -m torch.distributed.run --standalone --nproc-per-node 2 \
    -m memory_tracer.zoo --device cuda --iterations 3 --optimizer adamw "$@" > "$out/$name.log" 2>&1
  echo "$name exit $?" >> "$final/zoo_exit.txt"
  "$collector" summary "$out/$name.mtrace.json" --json > "$out/$name.summary.json" 2>>"$out/$name.log"
  for r in 0 1; do "$collector" summary "$out/$name.rank$r.mtrace.json" --json > "$out/$name.rank$r.summary.json" 2>>"$out/$name.log"; done
  cp "$out/$name.log" "$final/"
}
for strategy in ddp fsdp; do
  run "resnet50_$strategy" --model resnet50 --strategy $strategy --batch-size 32
  run "gpt_$strategy" --model gpt --strategy $strategy --batch-size 4
done
PYTHONPATH="$here" "$venv/bin/python" - "$out" <<'PY' | tee "$final/zoo_results.txt"
import json, os, re, sys
from checks import check
out = sys.argv[1]
ok = True
print("| job | rank | parameters | trace peak | torch max_memory_allocated | diff | trace reserved | torch max_memory_reserved | driver used peak |")
print("|---|---|---|---|---|---|---|---|---|")
checks = []  # printed after the table: (name, ours, PyTorch's)
for name in ("resnet50_ddp", "resnet50_fsdp", "gpt_ddp", "gpt_fsdp"):
    try:
        log = open(os.path.join(out, name + ".log")).read()
        merged = json.load(open(os.path.join(out, name + ".summary.json")))
    except Exception as e:
        print(f"| {name} | failed: {e} |")
        ok &= check(f"{name}.run", "failed", "ran", False, repr(e))
        continue
    facts = {int(m[0]): (int(m[1]), int(m[2]), int(m[3])) for m in re.findall(r"rank (\d+): \S+ \S+ parameters (\d+) B, peak allocated (\d+) B, peak reserved (\d+) B", log)}
    for d in merged["devices"]:
        r = d["rank"]
        own = json.load(open(os.path.join(out, f"{name}.rank{r}.summary.json")))
        p, a, res = facts.get(r, (0, 0, 0))
        print(f"| {name} | {r} | {p:,} | {d['peak_allocated_bytes']:,} | {a:,} | {d['peak_allocated_bytes'] - a:+,} | {d['peak_reserved_bytes']:,} | {res:,} | {own.get('driver_used_peak_bytes') or 0:,} |")
        checks.append((f"{name}.rank{r}.peak", d["peak_allocated_bytes"], a))
        checks.append((f"{name}.rank{r}.reserved", d["peak_reserved_bytes"], res))
    print(f"| {name} | warnings | {merged.get('warnings', [])[:3]} |")
    checks.append((f"{name}.ranks", len(merged["devices"]), 2))
for what, ours, theirs in checks:
    ok &= check(what, ours, f"={theirs}", ours == theirs)
sys.exit(0 if ok else 1)
PY
status=${PIPESTATUS[0]}
exit "$status"
