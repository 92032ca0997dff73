#!/usr/bin/env bash
# Issue 66's GPU checks in one run (one GPU, torch 2.11):
#   1. tests/gpu/settings_check.sh: a ResNet-50 on varying batches traced under six allocator
#      settings; each trace knows its settings and its own replay is max_memory_reserved();
#   5. leaks whose size follows the data: moe_loop.py and its language model with
#      --leak-varying (each iteration keeps its input batch) and clean, traced, with PyTorch's
#      memory_allocated() after each step; the verdicts;
#   7. the recorder fallback (`--capture recorder`) on the Llama-architecture LM: every leaf
#      module's forward peak against hooks (tests/gpu/python_verify.py --capture recorder);
#   4. `collector trace --holders=python` on the holder programs: the share of live bytes at the
#      peak named by recorded holders and by inferred ones (tests/gpu/holders.sh's programs),
#      at least 99 % named (tests/gpu/holders_share.py).
#   tests/gpu/issue66.sh COLLECTOR OUT_DIR
# Prints the parts' CHECK lines (tests/gpu/checks.py), their names prefixed with the part
# (settings., recorder.; the leaks' and holders' own); exits non-zero when a check misses.
set -uo pipefail
collector=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
. "$here/torch_env.sh"
py="$venv/bin/python"
mkdir -p "$out"
fail=0
# The four parts side by side (one GPU holds them all; the counters are per process).
"$here/settings_check.sh" "$collector" "$out/settings" > "$out/settings.txt" 2>&1 &
settings=$!
"$py" "$here/python_verify.py" --collector "$collector" --python "$py" --out /tmp/mt-gpu/recorder --only llama --capture recorder > "$out/recorder.txt" 2>&1 &
recorder=$!
holders() {
for case in "resnet --large" "lm --large" "moe --large" "lm --large --checkpoint"; do
  name=$(echo "$case" | tr -d ' -')
  "$collector" trace -q --holders=python -o "/tmp/mt-gpu/$name.mtrace.json" -- "$py" tests/python/programs/holders_check.py $case --device cuda --deterministic > "$out/holders_$name.txt" 2>&1
  "$collector" why --json --at peak "/tmp/mt-gpu/$name.mtrace.json" > "$out/holders_$name.peak.json" 2>> "$out/holders_$name.txt"
  "$py" "$here/holders_share.py" "$out/holders_$name.peak.json" "$case" || echo "FAIL holders $case"
done
}
mkdir -p /tmp/mt-gpu
holders > "$out/holders.txt" 2>&1 &
holders_pid=$!
for model in moe lm; do
  for v in leak_varying clean; do
    flag=""
    [ "$v" = leak_varying ] && flag=--leak-varying
    "$collector" trace -q -o "$out/${model}_$v.mtrace.json" -- "$py" tests/python/programs/moe_loop.py $flag --model "$model" --device cuda --iters 16 > "$out/${model}_$v.txt" 2>&1
    "$collector" leaks "$out/${model}_$v.mtrace.json" > "$out/${model}_${v}_leaks.txt" 2>&1
    verdict=$(grep -m1 -E 'leak: |no steady|uncertain|not enough' "$out/${model}_${v}_leaks.txt")
    echo "leaks $model $v: $verdict"
    want=leak
    [ "$v" = clean ] && want="no steady growth"
    got=$(echo "$verdict" | sed 's/^ *//; s/:.*//')
    check "leaks.${model}_$v" "${got:-none}" "=$want" [ "$got" = "$want" ] || fail=1
    gzip -f "$out/${model}_$v.mtrace.json"
  done
done
wait $settings || fail=1
sed 's/^CHECK /CHECK settings./' "$out/settings.txt"
wait $recorder || { echo "FAIL recorder fallback"; fail=1; }
grep -v '^CHECK' "$out/recorder.txt" | grep -E "leaf modules|peak|FAIL|fail" | head -20
sed -n 's/^CHECK /CHECK recorder./p' "$out/recorder.txt"
cp /tmp/mt-gpu/recorder/python_verify.json "$out/recorder_verify.json" 2>/dev/null
wait $holders_pid
cat "$out/holders.txt"
grep -q FAIL "$out/holders.txt" && fail=1
exit $fail
