#!/usr/bin/env bash
# Issue 46 item 1 on one GPU: torch.compile'd code attributed to the modules it came from.
# The blocks of distinct sizes (default, fullgraph=True, reduce-overhead CUDA graphs), then
# torchvision's ViT-B/16 and a Llama-architecture LM from transformers, each traced on cold
# caches, run untraced and traced again on warm ones (results and peaks compared).
#   tests/gpu/compiled_attribution.sh COLLECTOR OUT_DIR [blocks|models]
set -uo pipefail
collector=$1
final=$2
which=${3:-all}
. "$(dirname "$0")/torch_env.sh"
py="$venv/bin/python"
export MEMORY_TRACER_PYTHON="$py"
mkdir -p "$final"
run() {
  name=$1; shift
  # Traced on cold caches first (a fresh compile: the modules of its code are remembered),
  # then untraced and traced again on the warm caches, whose peaks must be equal.
  rm -rf "/tmp/torchinductor_$(whoami)" "$HOME/.cache/memory-tracer/inductor"
  "$collector" trace -o "$final/${name}_cold.mtrace.json" -- "$py" "$@" > "$final/${name}_cold.txt" 2>&1
  "$py" "$@" > "$final/${name}_plain.txt" 2>&1
  "$collector" trace -o "$final/$name.mtrace.json" -- "$py" "$@" > "$final/${name}_traced.txt" 2>&1
  echo "$name exit $? cold-traced $(grep '^{' "$final/${name}_cold.txt" | tail -1) plain $(tail -1 "$final/${name}_plain.txt") traced $(grep '^{' "$final/${name}_traced.txt" | tail -1)"
  grep -E "peak allocated|compiled code|PyTorch counters" "$final/${name}_cold.txt" "$final/${name}_traced.txt"
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
