#!/usr/bin/env bash
# Runs the GPU verification (tests/gpu/verify.py) on a machine with an NVIDIA GPU and
# PyTorch 2.11 in a venv. Usage: tests/gpu/run.sh [COLLECTOR] [OUT_DIR]
# TORCH_VENV defaults to /opt/torch/.venv (the GPU machines' venv).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
collector=${1:-$here/../../target/release/collector}
out=${2:-${OUT:-/tmp/memory-tracer-gpu}}
venv=${TORCH_VENV:-/opt/torch/.venv}
sp=$(echo "$venv"/lib/python3*/site-packages)
export LD_LIBRARY_PATH="$sp/torch/lib:$sp/nvidia/cu13/lib:$sp/nvidia/cudnn/lib:$sp/nvidia/nccl/lib:$sp/nvidia/cusparselt/lib:$sp/nvidia/nvshmem/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$venv/bin/python" "$here/verify.py" --collector "$collector" --out "$out" "${@:3}"
