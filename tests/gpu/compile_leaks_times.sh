#!/usr/bin/env bash
# Issue 46 on one GPU: torch.compile traced and untraced on CUDA (dynamo's counters and results
# must match, Inductor's Triton code included), the leak verdict on data-dependent loops (a
# mixture of experts with dropped batches, a transformer on sequences of varying length;
# leaking and clean) against memory_allocated() after each step, and `advise --verify`'s
# iteration times on the Llama-architecture LM over 24 iterations.
#   tests/gpu/compile_leaks_times.sh COLLECTOR OUT_DIR
set -uo pipefail
collector=$1
final=$2
. "$(dirname "$0")/torch_env.sh"
py="$venv/bin/python"
export MEMORY_TRACER_PYTHON="$py"
mkdir -p "$final"
for case in all module_fullgraph; do
  "$py" tests/python/programs/compile_parity.py "$case" --device cuda > "$final/parity_${case}_plain.txt" 2>&1
  "$collector" trace -q -o "$final/parity_$case.mtrace.json" -- "$py" tests/python/programs/compile_parity.py "$case" --device cuda > "$final/parity_${case}_traced.txt" 2>&1
  echo "parity $case exit $?"
  grep -h PARITY "$final/parity_${case}_plain.txt" "$final/parity_${case}_traced.txt"
done
for model in moe lm; do
  for v in leak clean; do
    flag=""
    [ "$v" = leak ] && flag=--leak
    "$collector" trace -q -o "$final/${model}_$v.mtrace.json" -- "$py" tests/python/programs/moe_loop.py $flag --model "$model" --device cuda --iters 16 > "$final/${model}_$v.txt" 2>&1
    "$collector" leaks "$final/${model}_$v.mtrace.json" > "$final/${model}_${v}_leaks.txt" 2>&1
    echo "$model $v: $(grep -m1 -E 'leak|no steady|uncertain|not enough' "$final/${model}_${v}_leaks.txt")"
  done
done
"$collector" advise --verify --out-dir /tmp/verify-llama -- "$py" tests/gpu/llama_verify.py --iterations 24 > "$final/verify_llama.txt" 2> "$final/verify_llama.log"
echo "verify exit $?"
cp /tmp/verify-llama/verify.json "$final/verify_llama.json" 2>/dev/null
sed -n '/^Verified advice/,$p' "$final/verify_llama.txt"
