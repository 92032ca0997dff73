#!/usr/bin/env bash
# Issue 46 item 1 on one GPU: torch.compile'd code attributed to the modules it came from.
# The blocks of distinct sizes (default, fullgraph=True, reduce-overhead CUDA graphs), then
# torchvision's ViT-B/16 and a Llama-architecture LM from transformers, each traced on cold
# caches, run untraced and traced again on warm ones (results and peaks compared).
#   tests/gpu/compiled_attribution.sh COLLECTOR OUT_DIR [blocks|models]
# Prints a CHECK line (tests/gpu/checks.py) per comparison and exits non-zero when one misses:
# the warm traced run's result line (loss, max_memory_allocated()) equals the untraced one's,
# its trace's peak equals max_memory_allocated(), and at least 90 % of the compiled code's
# allocation sites are attributed to a module, cold and warm (docs/benchmarks.md: 98 %).
set -uo pipefail
collector=$1
final=$2
which=${3:-all}
. "$(dirname "$0")/torch_env.sh"
py="$venv/bin/python"
export MEMORY_TRACER_PYTHON="$py"
mkdir -p "$final"
fail=0
# at_least_90 A S: A of S is at least 90 % (called through `check`).
at_least_90() { [ "$2" -gt 0 ] && [ $(($1 * 100)) -ge $(($2 * 90)) ]; }
run() {
  name=$1; shift
  # Traced on cold caches first (a fresh compile: the modules of its code are remembered),
  # then untraced and traced again on the warm caches, whose peaks must be equal.
  rm -rf "/tmp/torchinductor_$(whoami)" "$HOME/.cache/memory-tracer/inductor"
  "$collector" trace -o "$final/${name}_cold.mtrace.json" -- "$py" "$@" > "$final/${name}_cold.txt" 2>&1
  "$py" "$@" > "$final/${name}_plain.txt" 2>&1
  "$collector" trace -o "$final/$name.mtrace.json" -- "$py" "$@" > "$final/${name}_traced.txt" 2>&1
  rc=$?
  plain=$(grep '^{' "$final/${name}_plain.txt" | tail -1)
  traced=$(grep '^{' "$final/${name}_traced.txt" | tail -1)
  echo "$name exit $rc cold-traced $(grep '^{' "$final/${name}_cold.txt" | tail -1) plain $plain traced $traced"
  grep -E "peak allocated|compiled code|PyTorch counters" "$final/${name}_cold.txt" "$final/${name}_traced.txt"
  same=differ
  [ $rc -eq 0 ] && [ -n "$plain" ] && [ "$plain" = "$traced" ] && same=same
  check "$name.results" "$same" "=same" [ $same = same ] || fail=1
  peak=$("$collector" summary "$final/$name.mtrace.json" 2>/dev/null | sed -n 's/.*peak allocated.*(\([0-9]*\) bytes).*/\1/p' | head -1)
  torch_peak=$(echo "$traced" | sed -n 's/.*"max_memory_allocated": \([0-9]*\).*/\1/p')
  check "$name.peak" "${peak:-none}" "=${torch_peak:-none}" [ "${peak:-x}" = "${torch_peak:-y}" ] || fail=1
  for caches in cold warm; do
    out=$final/${name}_traced.txt
    [ $caches = cold ] && out=$final/${name}_cold.txt
    sites=$(grep -m1 'compiled code' "$out" | sed -n 's/.*: \([0-9]*\) of \([0-9]*\) allocation sites.*/\1 \2/p')
    read -r attributed all <<<"${sites:-0 0}"
    check "$name.$caches.sites" "$attributed/$all" ">=90%" at_least_90 "$attributed" "$all" || fail=1
  done
}
if [ "$which" != models ]; then
run blocks tests/python/programs/compiled_blocks.py --device cuda
run blocks_fullgraph tests/python/programs/compiled_blocks.py --device cuda --fullgraph
run blocks_cudagraphs tests/python/programs/compiled_blocks.py --device cuda --mode reduce-overhead --steps 5
fi
if [ "$which" != blocks ]; then
run vit tests/python/programs/compiled_models.py vit
run lm tests/python/programs/compiled_models.py lm
fi
exit $fail
