#!/usr/bin/env bash
# Issue 18 on one GPU: `collector advise --verify` on ResNet-152 (batch 64) and the GPT
# (batch 8 x 1024): baseline, the top checkpointing suggestion, AMP and both, each traced,
# with the advice's predicted peak against the measured one.
#   tests/gpu/advise_verify.sh COLLECTOR OUT_DIR
set -uo pipefail
collector=$1
final=$2
. "$(dirname "$0")/torch_env.sh"
export MEMORY_TRACER_PYTHON="$venv/bin/python"
mkdir -p "$final"
for job in "resnet152 64" "gpt 8"; do
  set -- $job
  "$collector" advise --verify --model "$1" --batch-size "$2" --device cuda --iterations 4 --out-dir "/tmp/verify-$1" > "$final/verify_$1.txt" 2> "$final/verify_$1.log"
  echo "$1 exit $?" >> "$final/verify_exit.txt"
  cp "/tmp/verify-$1/verify.json" "$final/verify_$1.json" 2>/dev/null
  sed -n '/^Verified advice/,$p' "$final/verify_$1.txt"
done
