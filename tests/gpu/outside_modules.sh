#!/usr/bin/env bash
# Issue 66 item 3: allocations outside every module named by the line of the program's own
# code that made them. Each case runs untraced and traced (results compared) and checks the
# traced summary: outside_modules.py's lines in its layer table, and lm_loss_outside.py's peak
# (the loss over fp32 logits in train_step) at its loss line, plain and compiled.
#   tests/gpu/outside_modules.sh COLLECTOR OUT_DIR
# Prints a CHECK line (tests/gpu/checks.py) for each and exits non-zero when a line is missing,
# the peak is elsewhere or the traced results differ.
set -uo pipefail
collector=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
. "$here/torch_env.sh"
py="$venv/bin/python"
mkdir -p "$out"
fail=0
"$py" tests/python/programs/outside_modules.py cuda > "$out/outside.plain.txt" 2>&1
"$collector" trace -q -o "$out/outside.mtrace.json" -- "$py" tests/python/programs/outside_modules.py cuda > "$out/outside.traced.txt" 2>&1
"$collector" summary "$out/outside.mtrace.json" > "$out/outside.summary.txt" 2>&1
cat "$out/outside.summary.txt"
same=differ
[ -n "$(grep '^RESULT' "$out/outside.plain.txt")" ] && [ "$(grep '^RESULT' "$out/outside.plain.txt")" = "$(grep '^RESULT' "$out/outside.traced.txt")" ] && same=same
check outside.results "$same" "=same" [ $same = same ] || fail=1
found=0 lines=0
for l in $(grep '^OUTSIDE' "$out/outside.traced.txt" | sed 's/^OUTSIDE //' | "$py" -c 'import json,sys; [print(v.split(" in ")[0]) for v in json.load(sys.stdin).values()]'); do
  lines=$((lines + 1))
  if grep -q "$l in " "$out/outside.summary.txt"; then found=$((found + 1)); else echo "FAIL outside: $l not in the layer table"; fi
done
check outside.lines "$found/$lines" "=all" [ "$lines" -gt 0 -a "$found" = "$lines" ] || fail=1
for flags in "" "--compile"; do
  name=lm$(echo "$flags" | tr -d ' -')
  # Compiled: a run that compiles first (its peak holds the compile's own allocations), then
  # the untraced and the traced runs on the same warm caches.
  cache=$(mktemp -d)
  [ -n "$flags" ] && TORCHINDUCTOR_CACHE_DIR=$cache "$py" tests/python/programs/lm_loss_outside.py --device cuda $flags > "$out/$name.cold.txt" 2>&1
  TORCHINDUCTOR_CACHE_DIR=$cache "$py" tests/python/programs/lm_loss_outside.py --device cuda $flags > "$out/$name.plain.txt" 2>&1
  TORCHINDUCTOR_CACHE_DIR=$cache "$collector" trace -q -o "$out/$name.mtrace.json" -- "$py" tests/python/programs/lm_loss_outside.py --device cuda $flags > "$out/$name.traced.txt" 2>&1
  "$collector" summary "$out/$name.mtrace.json" > "$out/$name.summary.txt" 2>&1
  plain=$(grep '^{' "$out/$name.plain.txt" | tail -1)
  traced=$(grep '^{' "$out/$name.traced.txt" | tail -1)
  echo "$name plain  $plain"
  echo "$name traced $traced"
  head -16 "$out/$name.summary.txt"
  same=differ
  [ -n "$plain" ] && [ "$plain" = "$traced" ] && same=same
  check "$name.results" "$same" "=same" [ $same = same ] || fail=1
  want=$(echo "$traced" | "$py" -c 'import json,sys; print(json.load(sys.stdin)["loss_line"])')
  peak=$(grep -m1 "peak allocated" "$out/$name.summary.txt")
  place=$(echo "$peak" | sed -n 's/.*, at \([^ ]*\) in .*/\1/p')
  check "$name.peak_line" "${place:-elsewhere}" "=${want:-the_loss_line}" grep -q "${want:-no loss line}" <<<"$peak" || fail=1
  gzip -f "$out/$name.mtrace.json"
done
exit $fail
