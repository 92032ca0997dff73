#!/usr/bin/env bash
# Issue 18 on one GPU: `collector advise --verify` on ResNet-152 (batch 64) and the GPT
# (batch 8 x 1024): baseline, the top checkpointing suggestion, AMP and both, each traced,
# with the advice's predicted peak against the measured one. Prints tests/gpu/checks.py's CHECK
# lines for each run (`advise`: measured peaks to the byte, predictions within 5 %) and exits
# non-zero when one misses. (tests/gpu/amp_run.sh runs the same two jobs and a third.)
#   tests/gpu/advise_verify.sh COLLECTOR OUT_DIR
set -uo pipefail
collector=$1
final=$2
here=$(cd "$(dirname "$0")" && pwd)
. "$here/torch_env.sh"
export MEMORY_TRACER_PYTHON="$venv/bin/python"
mkdir -p "$final"
fail=0
for job in "resnet152 64" "gpt 8"; do
  set -- $job
  rm -rf "/tmp/verify-$1"
  "$collector" advise --verify --model "$1" --batch-size "$2" --device cuda --iterations 4 --out-dir "/tmp/verify-$1" > "$final/verify_$1.txt" 2> "$final/verify_$1.log"
  echo "$1 exit $?" >> "$final/verify_exit.txt"
  cp "/tmp/verify-$1/verify.json" "$final/verify_$1.json" 2>/dev/null
  sed -n '/^Verified advice/,$p' "$final/verify_$1.txt"
  "$venv/bin/python" "$here/checks.py" advise "$final/verify_$1.json" "$1" || fail=1
done
exit $fail
