#!/usr/bin/env bash
# The first `cargo xtask run` of a fresh machine, timed (docs/benchmarks.md, "The first run"):
# a fresh clone of this repository, an empty cache (XDG_CACHE_HOME) and CARGO_HOME in a scratch
# folder, so nothing of yours is used or touched (the toolchain comes from rustup as it is).
# Each line of the run's output is prefixed with the seconds since the start; bytes received
# (IFACE, default eth0) are sampled every 10 s; it stops once the server stores the trace.
#   tests/bench/first_run.sh [SCRATCH]     (default: a new temporary folder; needs ~10 GB)
set -u
repo=$(cd "$(dirname "$0")/../.." && pwd)
scratch=${1:-$(mktemp -d)}
iface=${IFACE:-eth0}
log="$scratch/first_run.log"
mkdir -p "$scratch/cache" "$scratch/cargo"
git clone -q "$repo" "$scratch/clone" || exit 1
cd "$scratch/clone"
export XDG_CACHE_HOME="$scratch/cache" CARGO_HOME="$scratch/cargo" CARGO_INCREMENTAL=0
# Only the toolchain's own programs from your ~/.cargo/bin (not the tools installed there).
mkdir -p "$scratch/toolchain"
for t in cargo rustc rustup rustfmt cargo-fmt cargo-clippy clippy-driver rustdoc; do
  [ -e "${RUSTUP_CARGO_BIN:-$HOME/.cargo/bin}/$t" ] && ln -sf "${RUSTUP_CARGO_BIN:-$HOME/.cargo/bin}/$t" "$scratch/toolchain/$t"
done
export RUSTUP_HOME="${RUSTUP_HOME:-$HOME/.rustup}"
export PATH="$CARGO_HOME/bin:$scratch/toolchain:$(echo "$PATH" | tr ':' '\n' | grep -vx "${RUSTUP_CARGO_BIN:-$HOME/.cargo/bin}" | paste -sd:)"
rx() { awk -v i="$iface:" '$1 == i {print $2}' /proc/net/dev; }
start=$(date +%s)
rx0=$(rx)
echo "start $start" > "$log"
(
  while sleep 10; do
    echo "SAMPLE $(($(date +%s) - start)) rx_mb=$((($(rx) - rx0) / 1000000))" >> "$log"
    if ls "$scratch/serve-data/traces/"*.meta.json > /dev/null 2>&1; then
      echo "SERVED $(($(date +%s) - start)) rx_mb=$((($(rx) - rx0) / 1000000))" >> "$log"
      du -sm "$scratch/cache" "$scratch/cargo" "$scratch/clone/target" >> "$log"
      pkill -INT -f "collector serve --trace" || true
      break
    fi
  done
) &
cargo xtask run resnet18 --data-dir "$scratch/serve-data" --port 0 2>&1 \
  | while IFS= read -r line; do echo "$(($(date +%s) - start)) $line"; done >> "$log"
echo "END $(($(date +%s) - start))" >> "$log"
grep -E "^SERVED|xtask: running|Finished" "$log"
