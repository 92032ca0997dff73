#!/usr/bin/env bash
# Issue 32: the AMP and checkpoint + AMP runs of tests/gpu/amp_run.sh traced with every
# operator, for studying where autocast's memory goes (the layers are those the advice chose).
#   tests/gpu/amp_traces.sh COLLECTOR OUT_DIR
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
collector=$1
final=$2
. "$(dirname "$0")/torch_env.sh"
export MEMORY_TRACER_PYTHON="$venv/bin/python" PYTHONUNBUFFERED=1
mkdir -p "$final"
llama=($venv/bin/python $here/llama_verify.py --iterations 4)
gpt=($venv/bin/python -m memory_tracer.zoo --model gpt --iterations 4 --batch-size 8 --device cuda)
resnet=($venv/bin/python -m memory_tracer.zoo --model resnet152 --iterations 4 --batch-size 64 --device cuda)
ckpt_llama=model.layers.0,model.layers.1,model.layers.2,model.layers.3,model.layers.4,model.layers.5,model.norm
ckpt_gpt=h.0,h.1,h.2,h.3,h.4,h.5,h.6,h.7,h.8,h.9,h.10,h.11
ckpt_resnet=maxpool,layer1.0,layer1.1,layer1.2,layer2.0,layer2.1,layer2.2,layer2.3,layer2.4,layer2.5,layer2.6,layer2.7,layer3.0,layer3.1,layer3.2,layer3.3,layer3.4,layer3.5,layer3.6,layer3.7,layer3.8,layer3.9,layer3.10,layer3.11,layer3.12,layer3.13,layer3.14,layer3.15,layer3.16,layer3.17,layer3.18,layer3.19,layer3.20,layer3.21,layer3.22,layer3.23,layer3.24,layer3.25,layer3.26,layer3.27,layer3.28,layer3.29,layer3.30,layer3.31,layer3.32,layer3.33,layer3.34,layer3.35,layer4.0
run() {
  local name=$1; shift
  "$collector" trace -q --ops all -o "/tmp/$name.mtrace.json" -- "$@" > "$final/$name.log" 2>&1
  "$collector" summary "/tmp/$name.mtrace.json" | sed -n 3p
  xz -T0 -c "/tmp/$name.mtrace.json" > "$final/$name.mtrace.json.xz"
}
run amp_llama "${llama[@]}" --amp
run both_llama "${llama[@]}" --amp --checkpoint $ckpt_llama
run amp_gpt "${gpt[@]}" --amp
run both_gpt "${gpt[@]}" --amp --checkpoint $ckpt_gpt
run amp_resnet152 "${resnet[@]}" --amp
run both_resnet152 "${resnet[@]}" --amp --checkpoint $ckpt_resnet
