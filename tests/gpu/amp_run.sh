#!/usr/bin/env bash
# Issue 32 on one GPU: `collector advise --verify` on ResNet-152 (batch 64), the GPT-2-small
# shaped decoder (batch 8 x 1024) and a transformers Llama-architecture LM with GQA
# (tests/gpu/llama_verify.py): baseline, the top checkpointing suggestion, AMP and both, each
# traced, with the predicted peaks against the measured ones; and a real out-of-memory inside
# a module's forward (tests/gpu/oom_in_module.py), as a snapshot and traced.
#   tests/gpu/amp_run.sh COLLECTOR OUT_DIR [JOBS...]
# Each advise job prints tests/gpu/checks.py's CHECK lines (`advise`: measured peaks equal
# max_memory_allocated(), predictions within 5 %); the script exits non-zero when one misses.
# The oom job records fixtures (tests/data/oom_in_module*) and is not judged here.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
collector=$1
final=$2
shift 2
. "$(dirname "$0")/torch_env.sh"
export MEMORY_TRACER_PYTHON="$venv/bin/python" PYTHONUNBUFFERED=1
mkdir -p "$final"
jobs=("$@"); [ ${#jobs[@]} -gt 0 ] || jobs=(resnet152 gpt llama oom)
fail=0
for job in "${jobs[@]}"; do
  case $job in
    resnet152) cmd=(--model resnet152 --batch-size 64 --device cuda --iterations 4) ;;
    gpt) cmd=(--model gpt --batch-size 8 --device cuda --iterations 4) ;;
    llama) cmd=(-- "$venv/bin/python" "$here/llama_verify.py" --iterations 4) ;;
    oom)
      "$venv/bin/python" "$here/oom_in_module.py" snapshot "$final" > "$final/oom_snapshot.log" 2>&1
      "$collector" trace -q -o "$final/oom_in_module.mtrace.json" -- "$venv/bin/python" "$here/oom_in_module.py" program > "$final/oom_traced.log" 2>&1
      "$collector" trace -q --ops all -o "$final/oom_in_module.ops.mtrace.json" -- "$venv/bin/python" "$here/oom_in_module.py" program > "$final/oom_traced_ops.log" 2>&1
      "$collector" summary "$final/oom_in_module.mtrace.json" | head -3
      "$collector" summary "$final/oom_in_module.ops.mtrace.json" | head -3
      "$collector" summary "$final/oom_in_module.pickle" | head -3
      continue ;;
  esac
  start=$(date +%s)
  rm -rf "/tmp/verify-$job"
  "$collector" advise --verify --out-dir "/tmp/verify-$job" "${cmd[@]}" > "$final/verify_$job.txt" 2> "$final/verify_$job.log"
  echo "$job exit $? in $(( $(date +%s) - start )) s"
  cp "/tmp/verify-$job/verify.json" "$final/verify_$job.json" 2>/dev/null
  xz -T0 -c "/tmp/verify-$job/baseline.mtrace.json" > "$final/baseline_$job.mtrace.json.xz" 2>/dev/null
  sed -n '/^Verified advice/,$p' "$final/verify_$job.txt"
  "$venv/bin/python" "$here/checks.py" advise "$final/verify_$job.json" "$job" || fail=1
done
exit $fail
