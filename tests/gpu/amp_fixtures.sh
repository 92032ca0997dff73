#!/usr/bin/env bash
# Issue 32: small `collector advise --verify` runs whose baselines and measured peaks become
# tests/data fixtures (shared/tests/advice_amp.rs checks the AMP and checkpoint + AMP
# predictions against them): a 2-layer Llama-architecture LM with GQA
# and ResNet-18 at batch 8.
#   tests/gpu/amp_fixtures.sh COLLECTOR OUT_DIR
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
collector=$1
final=$2
. "$(dirname "$0")/torch_env.sh"
export MEMORY_TRACER_PYTHON="$venv/bin/python" PYTHONUNBUFFERED=1
mkdir -p "$final"
verify() {
  local name=$1; shift
  "$collector" advise --verify --out-dir "/tmp/fix-$name" "$@" > "$final/fix_$name.txt" 2>&1
  echo "$name exit $?"
  sed -n '/^| /p' "$final/fix_$name.txt"
  cp "/tmp/fix-$name/verify.json" "$final/amp_$name.verify.json"
  gzip -9 -n -c "/tmp/fix-$name/baseline.mtrace.json" > "$final/amp_$name.baseline.mtrace.json.gz"
}
verify llama -- "$venv/bin/python" "$here/llama_verify.py" --layers 2 --batch 2 --seq 128 --iterations 3
verify resnet18 --model resnet18 --batch-size 8 --device cuda --iterations 3
