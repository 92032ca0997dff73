#!/usr/bin/env bash
# Issue 66 item 1: a trace knows the allocator settings it ran under. whatif_train.py's
# ResNet-50 on varying batches traced under each of six settings (the default; expandable
# segments; max_split_size_mb:128; roundup_power2_divisions:4, set by the program through
# _set_allocator_settings; expandable segments with divisions; garbage_collection_threshold
# under a 12 GiB memory fraction the program sets), side by side on one GPU, and run untraced
# under the same six for PyTorch's counters of runs no tracer touched. Then, for each trace,
# `collector whatif --json` (its own replay against the recorded curve and the counters) and
# `collector summary --json` (the settings it names). The traces and counters become
# tests/data/settings/, which shared/tests/whatif_settings.rs holds each trace's predictions
# of the other five against (2 % reserved, 0.5 % allocated).
#
#   tests/gpu/settings_check.sh COLLECTOR OUT_DIR
#
# Exits non-zero when a run fails, a traced run's counters differ from its untraced twin's, a
# trace does not know its settings, or its own replay is not PyTorch's reserved peak; prints a
# CHECK line (tests/gpu/checks.py) for each of those per setting.
set -uo pipefail
COLLECTOR=$1 OUT=$2
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/torch_env.sh"
PY=$venv/bin/python
mkdir -p "$OUT"
# name|PYTORCH_CUDA_ALLOC_CONF|program flags
CASES=(
  "default||"
  "expandable|expandable_segments:True|"
  "split128|max_split_size_mb:128|"
  "divisions4||--set-alloc-conf roundup_power2_divisions:4"
  "expandable_divisions|expandable_segments:True,roundup_power2_divisions:4|"
  "gc_fraction|garbage_collection_threshold:0.5|--memory-limit-gib 12"
)
one() {
  IFS='|' read -r name conf flags <<<"$1"
  # shellcheck disable=SC2086
  env PYTORCH_CUDA_ALLOC_CONF="$conf" "$PY" "$HERE/whatif_train.py" --model cnn $flags > "$OUT/$name.untraced.out" 2> "$OUT/$name.untraced.err"
  # shellcheck disable=SC2086
  env PYTORCH_CUDA_ALLOC_CONF="$conf" "$COLLECTOR" trace -q --ops none -o "$OUT/$name.mtrace.json" -- "$PY" "$HERE/whatif_train.py" --model cnn $flags \
    > "$OUT/$name.traced.out" 2> "$OUT/$name.traced.err"
  "$COLLECTOR" whatif "$OUT/$name.mtrace.json" --json > "$OUT/$name.whatif.json" 2>> "$OUT/$name.traced.err"
  "$COLLECTOR" summary "$OUT/$name.mtrace.json" --json > "$OUT/$name.summary.json" 2>> "$OUT/$name.traced.err"
}
for c in "${CASES[@]}"; do one "$c" & done
wait
PYTHONPATH="$HERE" "$PY" - "$OUT" <<'PYEOF'
import json, os, sys
from checks import check
out = sys.argv[1]
names = ["default", "expandable", "split128", "divisions4", "expandable_divisions", "gc_fraction"]
facts, failed = {}, []
for n in names:
    def counters(kind):
        for line in open(os.path.join(out, f"{n}.{kind}.out")):
            if line.startswith("COUNTERS "):
                return json.loads(line[len("COUNTERS "):])
        failed.append(f"{n}: the {kind} run printed no counters")
    u, t = counters("untraced"), counters("traced")
    if not (u and t):
        check(f"{n}.runs", "no_counters", "counters", False, "a run printed no COUNTERS line")
        continue
    keys = ("max_memory_allocated", "max_memory_reserved", "loss")
    if not check(f"{n}.untraced", "/".join(str(t[k]) for k in keys), "=" + "/".join(str(u[k]) for k in keys), all(u[k] == t[k] for k in keys),
                 "traced counters and loss against the untraced run's"):
        failed.append(f"{n}: traced {[t[k] for k in keys]} != untraced {[u[k] for k in keys]}")
    w = json.load(open(os.path.join(out, f"{n}.whatif.json")))
    s = json.load(open(os.path.join(out, f"{n}.summary.json")))["allocator_settings"]
    own = w["settings"][0]
    row = {"counters": u, "settings": s, "own_replay_reserved": own["reserved_peak_bytes"], "own_replay_allocated": own["allocated_peak_bytes"],
           "replay_exact": w["recorded"]["replay_exact"], "own_description": w["own_description"], "notes": w["notes"]}
    facts[n] = row
    ok = check(f"{n}.settings_known", s["known"], "=True", s["known"], s["description"])
    ok &= check(f"{n}.own_replay_reserved", own["reserved_peak_bytes"], f"={u['max_memory_reserved']}", own["reserved_peak_bytes"] == u["max_memory_reserved"])
    ok &= check(f"{n}.own_replay_allocated", own["allocated_peak_bytes"], f"={u['max_memory_allocated']}", own["allocated_peak_bytes"] == u["max_memory_allocated"])
    print(f"{n:22s} {s['description']:55s} reserved {u['max_memory_reserved']:>12d} replay {own['reserved_peak_bytes']:>12d} "
          f"allocated {u['max_memory_allocated']:>12d} replay {own['allocated_peak_bytes']:>12d} exact={w['recorded']['replay_exact']} {'PASS' if ok else 'FAIL'}")
    if not ok:
        failed.append(f"{n}: own replay or settings wrong")
json.dump(facts, open(os.path.join(out, "facts.json"), "w"), indent=1)
for f in failed:
    print("FAIL", f)
sys.exit(1 if failed else 0)
PYEOF
status=$?
for c in "${CASES[@]}"; do gzip -kf "$OUT/${c%%|*}.mtrace.json"; done
exit $status
