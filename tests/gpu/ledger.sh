#!/usr/bin/env bash
# Issue 67: the device ledger checked against the driver. ledger_probe.py (a model, a 1-rank
# NCCL group and a second group, a raw 256 MiB cudaMalloc through ctypes) traced with --ledger: at
# the mark `held` the raw block is named to the byte, NCCL's bytes per communicator, and what NVML counts beyond the
# named sources is printed; then a GPT-style LM and a compiled one at their peaks.
#   tests/gpu/ledger.sh COLLECTOR OUT_DIR
# Exits non-zero when the raw block or NCCL is not named, or the traced results differ.
set -uo pipefail
collector=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
. "$here/torch_env.sh"
py="$venv/bin/python"
mkdir -p "$out"
fail=0
export NCCL_NVLS_ENABLE=0
"$py" tests/python/programs/ledger_probe.py > "$out/probe.plain.txt" 2>&1
"$collector" trace -q --ledger -o "$out/probe.mtrace.json" -- "$py" tests/python/programs/ledger_probe.py > "$out/probe.traced.txt" 2>&1
grep PROBE "$out/probe.plain.txt" "$out/probe.traced.txt" || { tail -15 "$out/probe.plain.txt" "$out/probe.traced.txt"; fail=1; }
"$collector" ledger "$out/probe.mtrace.json" --at held | tee "$out/probe.ledger.txt"
"$collector" ledger "$out/probe.mtrace.json" --at held --json > "$out/probe.ledger.json"
"$collector" summary "$out/probe.mtrace.json" > "$out/probe.summary.txt"; head -16 "$out/probe.summary.txt"
"$py" - "$out/probe.ledger.json" <<'PY' || fail=1
import json, sys
l = json.load(open(sys.argv[1]))
src = {s["source"]: s for s in l["sources"]}
raw = [s for s in l["sources"] if s["source"].startswith("raw_cuda") and s["bytes"] >= 256 << 20]
ok = True
if not raw:
    print("FAIL: no raw_cuda source holds the 256 MiB block", [(s["source"], s["bytes"]) for s in l["sources"]]); ok = False
elif "ledger_probe.py:" not in raw[0]["detail"]:
    print("FAIL: the raw block's line is not named:", raw[0]["detail"]); ok = False
if src.get("nccl", {}).get("bytes", 0) <= 0:
    print("FAIL: no NCCL bytes named"); ok = False
# Two communicators (the default group and a second one), each named with its bytes.
comms = [p for p in src.get("nccl", {}).get("parts", []) if p["name"] != "not told apart"]
print("NCCL by communicator:", [(p["name"], p["bytes"], p["peak_bytes"]) for p in src.get("nccl", {}).get("parts", [])])
if len(comms) < 2 or any(p["bytes"] <= 0 for p in comms):
    print("FAIL: NCCL's two communicators are not told apart with their bytes"); ok = False
print("unexplained at held:", l.get("unexplained_bytes"), "of NVML", l.get("nvml_used_bytes"), "pytorch segments", l.get("pytorch_segments_bytes"))
if abs(l.get("unexplained_bytes") or 0) > 64 << 20:
    print("FAIL: more than 64 MiB unexplained at held"); ok = False
sys.exit(0 if ok else 1)
PY
# PROBE_ONLY=1: the probe alone.
for flags in ${PROBE_ONLY:+skip} "" "--compile"; do
  [ "$flags" = skip ] && break
  name=lm$(echo "$flags" | tr -d ' -')
  "$collector" trace -q --ledger -o "$out/$name.mtrace.json" -- "$py" tests/python/programs/lm_loss_outside.py --device cuda $flags > "$out/$name.traced.txt" 2>&1
  "$collector" ledger "$out/$name.mtrace.json" | tee "$out/$name.ledger.txt"
  "$collector" ledger "$out/$name.mtrace.json" --json > "$out/$name.ledger.json"
  "$py" - "$out/$name.ledger.json" "$name" <<'PY' || fail=1
import json, sys
l = json.load(open(sys.argv[1]))
u = l.get("unexplained_bytes")
print(sys.argv[2], "unexplained at the peak:", u, "of NVML", l.get("nvml_used_bytes"))
sys.exit(0 if u is not None and abs(u) <= 64 << 20 else 1)
PY
  gzip -f "$out/$name.mtrace.json"
done
# LEDGER_COST_ROUNDS=N: what the ledger adds to a training step, in blocks of steps taking
# turns with the default capture and untraced (tests/bench/inprocess.py).
if [ "${LEDGER_COST_ROUNDS:-0}" -gt 0 ]; then
  pkg=$(mktemp -d)
  "$collector" python-package --out "$pkg" > /dev/null
  for mb in resnet50:32 llama:; do
    model=${mb%%:*}; batch=${mb#*:}
    PYTHONPATH="$pkg" MEMORY_TRACER_COLLECTOR="$collector" "$py" tests/bench/inprocess.py --model "$model" ${batch:+--batch $batch} \
      --rounds "$LEDGER_COST_ROUNDS" --modes "memory_tracer (default),memory_tracer ledger=True" --json "$out/ledger_cost_$model.json" \
      2> /dev/null | tee "$out/ledger_cost_$model.md"
  done
fi
gzip -f "$out/probe.mtrace.json"
exit $fail
