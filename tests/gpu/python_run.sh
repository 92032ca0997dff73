#!/usr/bin/env bash
# GPU checks of `collector trace -- python` (issue 14), on a machine with an NVIDIA GPU and
# PyTorch 2.11 (torchvision, transformers) in TORCH_VENV (default /opt/torch/.venv):
#   tests/gpu/python_run.sh COLLECTOR OUT_DIR [verify|overhead32|overhead128|variants]...
# verify: tests/gpu/python_verify.py (peaks vs torch counters, per-module peaks, overhead b32
# with 200 flat steps); overhead32: only that benchmark; overhead128: the interleaved benchmark at batch 128; variants: b32
# with --ops all and --ops none (the default is --ops backward). Results (JSON, logs) land in OUT_DIR; traces in /tmp.
# verify prints python_verify.py's CHECK lines; the benchmarks are not judged. Exits non-zero
# when a check misses or a step fails.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
collector=$1
out=$2
shift 2
. "$(dirname "$0")/torch_env.sh"
py="$venv/bin/python"
mkdir -p "$out" /tmp/mt-gpu
status=0
for what in "$@"; do
  case $what in
    verify)
      "$py" "$here/python_verify.py" --collector "$collector" --python "$py" --out /tmp/mt-gpu/verify || { echo "python_verify failed: $?"; status=1; }
      cp /tmp/mt-gpu/verify/*.json /tmp/mt-gpu/verify/*.log "$out/" 2>/dev/null || true
      rm -f "$out"/*.mtrace.json ;;
    overhead32)
      "$py" "$here/python_verify.py" --collector "$collector" --python "$py" --out /tmp/mt-gpu/oh32 --only overhead || { echo "overhead32 failed: $?"; status=1; }
      cp /tmp/mt-gpu/oh32/python_verify.json "$out/overhead_b32.json" ;;
    overhead128)
      "$collector" trace -q -o /tmp/mt-gpu/oh128.mtrace.json -- "$py" "$here/python_programs.py" overhead --batch 128 --steps 20 --warmup 3 \
        | grep '^RESULT' > "$out/overhead_b128.json" || { echo "overhead128 failed"; status=1; } ;;
    variants)
      for v in --ops=all --ops=none; do
        "$collector" trace -q $v -o /tmp/mt-gpu/oh$v.mtrace.json -- "$py" "$here/python_programs.py" overhead --batch 32 --steps 20 --warmup 3 \
          | grep '^RESULT' > "$out/overhead_b32$v.json" || { echo "variant $v failed"; status=1; }
      done ;;
    *) echo "unknown step $what"; exit 2 ;;
  esac
done
exit $status
