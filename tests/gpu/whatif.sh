#!/usr/bin/env bash
# Recordings for `collector whatif` (issue 48; tests/data/whatif/): each program of
# whatif_train.py run by `collector whatif --verify` (traced under the default allocator
# settings, predicted from that trace, then traced under each of six other
# PYTORCH_CUDA_ALLOC_CONF settings, PyTorch's counters beside each prediction), and run
# untraced under the same seven settings, for the counters of runs no tracer touched. The
# programs run side by side (one GPU, separate processes: the counters are per process).
#
#   tests/gpu/whatif.sh COLLECTOR OUT_DIR [MODEL...]
#
# OUT_DIR/<model>/baseline.mtrace.json.gz: the default run's trace; OUT_DIR/<model>.json: the
# verification (whatif-verify.json); OUT_DIR/<model>.counters.jsonl: the untraced runs.
# Then tests/gpu/checks.py's `whatif` CHECK lines per program and setting (allocated within
# 0.5 %, reserved within 2 % or inside the predicted range, traced counters those of the
# untraced run); exits non-zero when one misses. PYTHON defaults to the torch venv's.
set -uo pipefail
COLLECTOR=$1 OUT=$2
shift 2
if [ $# -eq 0 ]; then MODELS=(cnn llama moe); else MODELS=("$@"); fi
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/torch_env.sh"
PY=${PYTHON:-$venv/bin/python}
SETTINGS=(
  "expandable_segments:True"
  "max_split_size_mb:128"
  "roundup_power2_divisions:4"
  "roundup_power2_divisions:[256:1,512:2,>:4]"
  "expandable_segments:True,roundup_power2_divisions:4"
  "max_split_size_mb:256,max_non_split_rounding_mb:512"
)
mkdir -p "$OUT"
one() {
  local model=$1 args=()
  for s in "${SETTINGS[@]}"; do args+=(--alloc-conf "$s"); done
  env -u PYTORCH_CUDA_ALLOC_CONF "$COLLECTOR" whatif --verify --json "${args[@]}" --out-dir "$OUT/$model" -- "$PY" "$HERE/whatif_train.py" --model "$model" \
    > "$OUT/$model.json" 2> "$OUT/$model.err" || echo "$model: whatif --verify exit $?" >&2
  rm -f "$OUT/$model"/setting*.mtrace.json
  gzip -f "$OUT/$model/baseline.mtrace.json"
  : > "$OUT/$model.counters.jsonl"
  for s in "" "${SETTINGS[@]}"; do
    PYTORCH_CUDA_ALLOC_CONF="$s" "$PY" "$HERE/whatif_train.py" --model "$model" 2> "$OUT/$model.run.err" \
      | sed -n 's/^COUNTERS //p' >> "$OUT/$model.counters.jsonl"
  done
}
for m in "${MODELS[@]}"; do one "$m" & done
wait
fail=0
for m in "${MODELS[@]}"; do
  "$PY" "$HERE/checks.py" whatif "$OUT/$m.json" "$OUT/$m.counters.jsonl" "$m" || fail=1
done
exit $fail
