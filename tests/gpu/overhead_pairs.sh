#!/usr/bin/env bash
# Issue 33's in-process benchmark on one GPU: per allocation (tests/bench/record_cost.py) and
# per training step in pairs of neighbouring steps (tests/bench/inprocess.py --pairs), with
# the memory_tracer package that COLLECTOR writes.
#   tests/gpu/overhead_pairs.sh COLLECTOR OUT_DIR PAIRS [MODEL:BATCH]...
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
collector=$1
out=$2
pairs=$3
shift 3
. "$(dirname "$0")/torch_env.sh"
py="$venv/bin/python"
mkdir -p "$out"
pkg=$(mktemp -d)
"$collector" python-package --out "$pkg" > /dev/null
export PYTHONPATH="$pkg" MEMORY_TRACER_COLLECTOR="$collector" PYTHONUNBUFFERED=1
"$py" "$here/../bench/record_cost.py" --rounds 11 | tee "$out/record_cost.md"
for mb in "$@"; do
  model=${mb%%:*}
  batch=${mb#*:}
  "$py" "$here/../bench/inprocess.py" --model "$model" ${batch:+--batch $batch} --pairs "$pairs" \
    --json "$out/pairs_${model}${batch:+_b$batch}.json" | tee "$out/pairs_${model}${batch:+_b$batch}.md"
done
