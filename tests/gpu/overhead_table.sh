#!/usr/bin/env bash
# Issue 68 item 3: what tracing costs a training step, as pairs of neighbouring steps (one
# traced, one not: tests/bench/inprocess.py --pairs), each configuration in RUNS separate
# processes pooled by tests/bench/pool_pairs.py, which checks issue 68's bounds.
#   tests/gpu/overhead_table.sh COLLECTOR OUT_DIR PAIRS RUNS CONFIG...
# CONFIG: model|batch|compile|modes|bounds, e.g.
#   "resnet50|32|||memory_tracer (default)=2;memory_tracer (default)=recorder"
# (empty modes: every mode, else separated by ';'; bounds: MODE=PCT separated by ';'). Exits
# non-zero when a run
# fails or a bound is missed.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
collector=$1 out=$2 pairs=$3 runs=$4
shift 4
. "$here/torch_env.sh"
py="$venv/bin/python"
mkdir -p "$out"
pkg=$(mktemp -d)
"$collector" python-package --out "$pkg" > /dev/null
export PYTHONPATH="$pkg" MEMORY_TRACER_COLLECTOR="$collector" PYTHONUNBUFFERED=1
status=0
for config in "$@"; do
  IFS='|' read -r model batch compile modes bounds <<<"$config"
  name=${model}${batch:+_b$batch}${compile:+_compiled}
  files=()
  for run in $(seq "$runs"); do
    f="$out/pairs_${name}_run$run.json"
    "$py" "$here/../bench/inprocess.py" --model "$model" ${batch:+--batch $batch} ${compile:+--compile} --pairs "$pairs" \
      ${modes:+--modes "$modes"} --json "$f" > "$out/pairs_${name}_run$run.md" 2> "$out/pairs_${name}_run$run.err" \
      || { echo "FAIL: $name run $run"; tail -5 "$out/pairs_${name}_run$run.err"; status=1; continue; }
    files+=("$f")
  done
  args=()
  IFS=';' read -ra bs <<<"$bounds"
  for b in "${bs[@]}"; do [ -n "$b" ] && args+=(--bound "$b"); done
  [ ${#files[@]} -gt 0 ] && { "$py" "$here/../bench/pool_pairs.py" "${args[@]}" "${files[@]}" | tee "$out/table_$name.md"; [ "${PIPESTATUS[0]}" -eq 0 ] || status=1; }
done
# Each bound's verdict (pool_pairs.py's PASS and FAIL lines) as a CHECK line
# (tests/gpu/checks.py), for tests/gpu/all.py's table; tables older than this run are left out.
for config in "$@"; do
  IFS='|' read -r model batch compile _ <<<"$config"
  name=${model}${batch:+_b$batch}${compile:+_compiled}
  [ "$out/table_$name.md" -nt "$pkg" ] || continue
  sed -nE 's/^(PASS|FAIL) .+ on [a-z]+: [0-9]+ runs, [0-9]+ pairs: (.+) ([+-][0-9.]+) % \(bound (.+)\)$/\1|\2|\3|\4/p' "$out/table_$name.md" |
    while IFS='|' read -r verdict mode median bound; do
      echo "CHECK $name.${mode// /_} $median% <=${bound// /} $verdict"
    done
done
exit $status
