#!/usr/bin/env bash
# Issue 46 on one GPU: torch.compile traced and untraced on CUDA (dynamo's counters and results
# must match, Inductor's Triton code included), the leak verdict on data-dependent loops (a
# mixture of experts with dropped batches, a transformer on sequences of varying length;
# leaking and clean) against memory_allocated() after each step, and `advise --verify`'s
# iteration times on the Llama-architecture LM over 24 iterations.
#   tests/gpu/compile_leaks_times.sh COLLECTOR OUT_DIR
# Prints a CHECK line (tests/gpu/checks.py) per comparison and exits non-zero when one misses:
# PARITY lines equal traced and untraced; the leaking loops called a leak, the clean ones "no
# steady growth"; advise --verify as tests/gpu/checks.py's `advise --times` judges it.
set -uo pipefail
collector=$1
final=$2
here=$(cd "$(dirname "$0")" && pwd)
. "$here/torch_env.sh"
py="$venv/bin/python"
export MEMORY_TRACER_PYTHON="$py"
mkdir -p "$final"
fail=0
for case in all module_fullgraph; do
  "$py" tests/python/programs/compile_parity.py "$case" --device cuda > "$final/parity_${case}_plain.txt" 2>&1
  "$collector" trace -q -o "$final/parity_$case.mtrace.json" -- "$py" tests/python/programs/compile_parity.py "$case" --device cuda > "$final/parity_${case}_traced.txt" 2>&1
  rc=$?
  echo "parity $case exit $rc"
  grep -h PARITY "$final/parity_${case}_plain.txt" "$final/parity_${case}_traced.txt"
  plain=$(grep -m1 '^PARITY ' "$final/parity_${case}_plain.txt")
  traced=$(grep -m1 '^PARITY ' "$final/parity_${case}_traced.txt")
  same=differ
  [ $rc -eq 0 ] && [ -n "$plain" ] && [ "$plain" = "$traced" ] && same=same
  check "parity.$case" "$same" "=same" [ $same = same ] || fail=1
done
for model in moe lm; do
  for v in leak clean; do
    flag=""
    [ "$v" = leak ] && flag=--leak
    "$collector" trace -q -o "$final/${model}_$v.mtrace.json" -- "$py" tests/python/programs/moe_loop.py $flag --model "$model" --device cuda --iters 16 > "$final/${model}_$v.txt" 2>&1
    "$collector" leaks "$final/${model}_$v.mtrace.json" > "$final/${model}_${v}_leaks.txt" 2>&1
    verdict=$(grep -m1 -E 'leak: |no steady|uncertain|not enough' "$final/${model}_${v}_leaks.txt")
    echo "$model $v: $verdict"
    want=leak
    [ "$v" = clean ] && want="no steady growth"
    got=$(echo "$verdict" | sed 's/^ *//; s/:.*//')
    check "leaks.${model}_$v" "${got:-none}" "=$want" [ "$got" = "$want" ] || fail=1
  done
done
rm -rf /tmp/verify-llama
"$collector" advise --verify --out-dir /tmp/verify-llama -- "$py" tests/gpu/llama_verify.py --iterations 24 > "$final/verify_llama.txt" 2> "$final/verify_llama.log"
echo "verify exit $?"
cp /tmp/verify-llama/verify.json "$final/verify_llama.json" 2>/dev/null
sed -n '/^Verified advice/,$p' "$final/verify_llama.txt"
"$py" "$here/checks.py" advise "$final/verify_llama.json" llama --times || fail=1
exit $fail
