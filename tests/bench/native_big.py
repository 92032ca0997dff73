"""Native throughput and peak memory of `collector summary` on a multi-GB memory snapshot with
a real recording's structure (issue 17's goal: at least 300 MB/s, at most 1 GiB resident).

    python3 tests/bench/native_big.py [--copies 220] [--runs 3] [--collector target/release/collector]

The input is tests/data/big_all_cut.pickle.xz (70 000 entries cut from a real 869 MB
stacks="all" recording of tests/gpu/big_snapshots.py, by tests/gpu/cut_snapshot.py) repeated
by scale_snapshot.py: 220 copies make 3.08 GB and 15.4 M events, written once under
/tmp/memory-tracer-bench and reused. Each run is a fresh `collector summary FILE` process;
the file is read once first so every run finds it in the page cache. Prints wall time, MB/s
and the process's peak RSS per run. Build the collector first (`cargo build --release -p
collector`).
"""
import argparse
import lzma
import os
import shutil
import subprocess
import sys
import time

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
p = argparse.ArgumentParser()
p.add_argument("--copies", type=int, default=220)
p.add_argument("--runs", type=int, default=3)
p.add_argument("--collector", default=os.path.join(root, "target/release/collector"))
a = p.parse_args()
if not os.access(a.collector, os.X_OK):
    sys.exit(f"{a.collector} is not an executable collector: build it with `cargo build --release -p collector`")

work = "/tmp/memory-tracer-bench"
os.makedirs(work, exist_ok=True)
big = os.path.join(work, f"big_all_cut_x{a.copies}.pickle")
if not os.path.exists(big):
    cut = os.path.join(work, "big_all_cut.pickle")
    with lzma.open(os.path.join(root, "tests/data/big_all_cut.pickle.xz")) as src, open(cut, "wb") as dst:
        shutil.copyfileobj(src, dst)
    scale = os.path.join(root, "tests/bench/scale_snapshot.py")
    subprocess.run([sys.executable, scale, cut, str(a.copies), big + ".part"], check=True)
    os.replace(big + ".part", big)
size = os.path.getsize(big)
with open(big, "rb") as f:  # into the page cache, so runs measure the importer, not the disk
    while f.read(1 << 24):
        pass

for run in range(1, a.runs + 1):
    with open(os.path.join(work, "summary.err"), "w+") as err:
        t = time.perf_counter()
        child = subprocess.Popen([a.collector, "summary", big], stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(child.pid, 0)  # this child's own peak RSS
        secs = time.perf_counter() - t
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0:
            err.seek(0)
            sys.exit(f"collector summary failed ({child.returncode}): {err.read().strip()}")
    print(
        f"run {run}: {size / 1e9:.2f} GB in {secs:.2f} s = {size / 1e6 / secs:.0f} MB/s, peak RSS {usage.ru_maxrss / 1024:.0f} MiB",
        flush=True,
    )
