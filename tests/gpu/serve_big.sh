#!/usr/bin/env bash
# A real multi-GB memory snapshot opened through `collector serve`, the way a page opens a file
# larger than it can hold (issue 17): records the snapshot with big_snapshots.py (PyTorch's
# recorder on a GPU), uploads it, asks for the viewer's overview (the server imports it
# natively and keeps the session) and for the windows a page asks when drawn, zoomed and
# hovered; then `collector summary` of the same file. Prints the times, the server's peak
# memory, and whether the overview's peak equals torch.cuda.max_memory_allocated(): its CHECK
# line (tests/gpu/checks.py), and a non-zero exit when it does not. The times are not judged.
#
#     tests/gpu/serve_big.sh ./collector OUT_DIR [python|all] [TARGET_MB]
# PYTHON (default: the torch venv's) records the snapshot.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/torch_env.sh"
collector=$(realpath "$1")
out=$2
stacks=${3:-all}
mb=${4:-3600}
mkdir -p "$out"
"${PYTHON:-$venv/bin/python}" "$here/big_snapshots.py" --stacks "$stacks" --target-mb "$mb" --out "$out" > "$out/record.log"
file=/tmp/big_${stacks}_${mb}.pickle
data=$(mktemp -d)
port=18123
base=http://127.0.0.1:$port
"$collector" serve --port $port --data-dir "$data" --device cpu --max-upload-mb 16384 --max-store-mb 65536 \
    --import-timeout-s 600 --import-memory-mb 8192 > "$out/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; rm -rf "$data" "$file"' EXIT
for _ in $(seq 100); do curl -sf "$base/api/health" > /dev/null && break; sleep 0.2; done
now() { date +%s.%N; }
t0=$(now)
curl -sS --fail-with-body -X POST -T "$file" -H "content-type: application/octet-stream" "$base/api/trace/upload?filename=$(basename "$file")" > "$out/upload.json"
t1=$(now)
id=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["trace_id"])' "$out/upload.json")
curl -sS --fail-with-body "$base/api/trace/$id/overview" > "$out/overview.json"
t2=$(now)
explore() { curl -sS --fail-with-body -H 'content-type: application/json' -d "$1" "$base/api/trace/$id/explore" > /dev/null; }
duration=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["duration_s"])' "$out/overview.json")
peak_t=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["summary"]["peak_time_s"])' "$out/overview.json")
explore "{\"kind\":\"timeline\",\"start_s\":0,\"end_s\":$duration,\"buckets\":1200}"
explore "{\"kind\":\"active\",\"start_s\":0,\"end_s\":$duration,\"columns\":1100,\"detail\":2000}"
explore "{\"kind\":\"segments\",\"t_s\":$peak_t}"
t3=$(now)
# Twenty zoom steps toward the peak, each window a timeline and an active view.
python3 - "$duration" "$peak_t" > "$out/windows.txt" <<'EOF'
import sys
d, p = float(sys.argv[1]), float(sys.argv[2])
a, b = 0.0, d
for _ in range(20):
    span = (b - a) * 0.6
    a = max(0.0, p - span / 2)
    b = min(d, a + span)
    print(a, b)
EOF
zooms=()
while read -r a b; do
    s=$(now)
    explore "{\"kind\":\"timeline\",\"start_s\":$a,\"end_s\":$b,\"buckets\":1200}"
    explore "{\"kind\":\"active\",\"start_s\":$a,\"end_s\":$b,\"columns\":1100,\"detail\":2000}"
    zooms+=("$(python3 -c "print(round(($(now) - $s) * 1000, 1))")")
done < "$out/windows.txt"
hwm=$(grep VmHWM /proc/$server/status | awk '{print $2}')
python3 - "$collector" "$file" > "$out/summary_time.txt" <<'EOF'
import resource, subprocess, sys, time
t = time.time()
r = subprocess.run([sys.argv[1], "summary", sys.argv[2]], capture_output=True, text=True)
wall = time.time() - t
print(f"collector summary: exit {r.returncode}, {wall:.2f} s wall, peak RSS {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024:.0f} MiB")
print(r.stdout[:600], r.stderr[-600:])
EOF
PYTHONPATH="$here" python3 - "$out" "$t0" "$t1" "$t2" "$t3" "$hwm" "${zooms[*]}" <<'EOF'
import glob, json, os, sys
from checks import check
out, t0, t1, t2, t3, hwm, zooms = sys.argv[1], *map(float, sys.argv[2:7]), sys.argv[7]
facts = json.load(open(glob.glob(os.path.join(out, "big_*.json"))[0]))
o = json.load(open(os.path.join(out, "overview.json")))
zooms = sorted(float(z) for z in zooms.split())
wall = open(os.path.join(out, "summary_time.txt")).read().splitlines()[:1]
result = {
    "file_bytes": facts["bytes"], "stacks": facts["stacks"], "max_allocated": facts["max_allocated"],
    "overview_peak_allocated": o["summary"]["peak_allocated_bytes"],
    "peak_matches": o["summary"]["peak_allocated_bytes"] == facts["max_allocated"],
    "events": o["summary"]["total_events"],
    "upload_s (stored after the isolated import checks it)": round(t1 - t0, 2),
    "overview_s (the server imports it and keeps the session)": round(t2 - t1, 2),
    "first_views_s (timeline, active, segments)": round(t3 - t2, 2),
    "zoom_ms (timeline + active per step, sorted)": zooms,
    "server_peak_rss_mib": round(int(hwm) / 1024, 1),
    "collector_summary": [w.strip() for w in wall],
}
json.dump(result, open(os.path.join(out, "serve_big.json"), "w"), indent=1)
print(json.dumps(result, indent=1))
peak, want = result["overview_peak_allocated"], result["max_allocated"]
sys.exit(0 if check("overview.peak", peak, f"={want}", peak == want, "the served overview's peak against max_memory_allocated()") else 1)
EOF
