#!/usr/bin/env bash
# Issue 33's whole-process benchmark on one GPU: tests/bench/overhead.py for a model, every
# mode once per round in a rotated order.
#   tests/gpu/overhead.sh COLLECTOR OUT_DIR MODEL [BATCH] [ROUNDS] [CPUS]
# CPUS (e.g. 2-9): every process runs on those cores (taskset), the same for every mode.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
collector=$1
final=$2
model=$3
batch=${4:-}
rounds=${5:-5}
cpus=${6:-}
. "$(dirname "$0")/torch_env.sh"
export MEMORY_TRACER_PYTHON="$venv/bin/python" PYTHONUNBUFFERED=1
mkdir -p "$final"
name=$model${batch:+_b$batch}
"$venv/bin/python" "$here/../bench/overhead.py" --collector "$collector" --python "$venv/bin/python" --model "$model" \
  ${batch:+--batch $batch} ${cpus:+--cpus $cpus} --rounds "$rounds" --json "$final/overhead_$name.json" | tee "$final/overhead_$name.md"
