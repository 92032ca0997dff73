#!/usr/bin/env bash
# Runs the GPU verification (tests/gpu/verify.py) on a machine with an NVIDIA GPU and
# PyTorch 2.11 in a venv. Usage: tests/gpu/run.sh [COLLECTOR] [OUT_DIR]
# TORCH_VENV defaults to /opt/torch/.venv (the GPU machines' venv).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
collector=${1:-$here/../../target/release/collector}
out=${2:-${OUT:-/tmp/memory-tracer-gpu}}
. "$(dirname "$0")/torch_env.sh"
exec "$venv/bin/python" "$here/verify.py" --collector "$collector" --out "$out" "${@:3}"
