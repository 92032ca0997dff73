#!/usr/bin/env bash
# Issue 66 item 2: torch.compile'd code attributed when an untraced run compiled it first
# (Inductor's and AOTAutograd's caches warm, nothing remembered by the tracer). Each case:
# compiled_blocks.py run untraced into a fresh cache folder, untraced again and traced from it
# (results and peak compared between the two warm runs); prints the
# summary's "compiled code" line (sites attributed, unresolved) and the block shares.
#   tests/gpu/compiled_warm.sh COLLECTOR OUT_DIR [ENV=VALUE ...]
# The extra ENV=VALUE pairs are set for the traced run (to compare ways of reading the caches).
# Prints a CHECK line (tests/gpu/checks.py) for each and exits non-zero when a site stays
# without its module (or the summary names no compiled code) or the traced results differ.
set -uo pipefail
collector=$1
out=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
. "$here/torch_env.sh"
py="$venv/bin/python"
mkdir -p "$out"
fail=0
for flags in "" "--fullgraph"; do
  name=warm$(echo "$flags" | tr -d ' -')
  cache=$(mktemp -d)
  remembered=$(mktemp -d)
  # The run that compiles (its peak holds the compile's own allocations), then an untraced run
  # on the warm caches: the traced run is compared with the latter.
  TORCHINDUCTOR_CACHE_DIR=$cache "$py" tests/python/programs/compiled_blocks.py --device cuda $flags > "$out/$name.cold.txt" 2>&1
  TORCHINDUCTOR_CACHE_DIR=$cache "$py" tests/python/programs/compiled_blocks.py --device cuda $flags > "$out/$name.plain.txt" 2>&1
  env TORCHINDUCTOR_CACHE_DIR="$cache" XDG_CACHE_HOME="$remembered" "$@" "$collector" trace -q -o "$out/$name.mtrace.json" -- "$py" tests/python/programs/compiled_blocks.py --device cuda $flags > "$out/$name.traced.txt" 2>&1
  "$collector" summary "$out/$name.mtrace.json" > "$out/$name.summary.txt" 2>&1
  echo "$name $*: $(grep -m1 'compiled code' "$out/$name.summary.txt")"
  echo "  plain  $(grep '^{' "$out/$name.plain.txt" | tail -1)"
  echo "  traced $(grep '^{' "$out/$name.traced.txt" | tail -1)"
  sites=$(grep -m1 'compiled code' "$out/$name.summary.txt" | sed -n 's/.*: \([0-9]*\) of \([0-9]*\) allocation sites.*/\1 \2/p')
  read -r attributed all <<<"${sites:-0 0}"
  check "$name.sites" "$attributed/$all" "=all" [ "$all" -gt 0 -a "$attributed" = "$all" ] || fail=1
  plain=$(grep '^{' "$out/$name.plain.txt" | tail -1)
  same=differ
  [ -n "$plain" ] && [ "$plain" = "$(grep '^{' "$out/$name.traced.txt" | tail -1)" ] && same=same
  check "$name.results" "$same" "=same" [ $same = same ] || fail=1
  gzip -f "$out/$name.mtrace.json"
done
exit $fail
