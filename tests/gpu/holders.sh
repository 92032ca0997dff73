#!/usr/bin/env bash
# Issue 49 on one GPU: `collector trace --holders=python` on the CPU test's programs moved to CUDA
# (tests/python/programs/holders_check.py --device cuda), each checked against what PyTorch's
# own objects held at its marks (tests/gpu/holders_compare.py prints one table row per case and
# its CHECK lines: parameters, gradients, results, the share recorded at the peak),
# and the program's results and hook calls against an untraced run; fails when one of them
# differs or recorded holders name under 99 % of the live bytes at the peak.
#   tests/gpu/holders.sh COLLECTOR OUT_DIR
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
collector=$1
out=$2
. "$here/torch_env.sh"
py="$venv/bin/python"
prog="$here/../python/programs/holders_check.py"
mkdir -p "$out"
status=0
echo "| case | parameters (PyTorch / why) | optimizer state | saved for backward | gradients | named at after_forward | largest unknown there | named at the peak | largest temporary or unknown there | results and hooks as untraced |"
echo "|---|---|---|---|---|---|---|---|---|---|"
# CASES (one per line) picks some; by default every one.
cases=${CASES:-"resnet --large
lm --large
moe --large
lm --large --checkpoint
moe --large --checkpoint
resnet --large --compile
moe --large --user-hooks
lm"}
while IFS= read -r case; do
  name=$(echo "$case" | tr -d ' -')
  # Deterministic kernels: untraced and traced results compare exactly.
  "$py" "$prog" $case --device cuda --deterministic > "$out/$name.plain.txt" 2> "$out/$name.plain.err"
  "$collector" trace -q --holders=python -o "$out/$name.mtrace.json" -- "$py" "$prog" $case --device cuda --deterministic > "$out/$name.traced.txt" 2> "$out/$name.traced.err"
  for at in after_forward after_backward peak; do
    "$collector" why --json --no-fold --at "$at" "$out/$name.mtrace.json" > "$out/$name.$at.json" 2>> "$out/$name.traced.err"
  done
  "$py" "$here/holders_compare.py" "$case" "$out/$name" || status=1
done <<< "$cases"
exit $status
