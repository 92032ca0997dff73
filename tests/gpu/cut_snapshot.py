"""Cuts a window of entries out of a big real memory snapshot, for a small fixture that keeps
the recording's structure (frame dicts shared, one frames list per allocation and its frees).

    python3 cut_snapshot.py /tmp/big_all_1000.pickle cut.pickle 70000

Keeps N entries from the middle of device 0's trace (the steady state of the run) and the
final `segments` as recorded. The window's state at its start is not kept, so the cut's peak
is not PyTorch's: it is an input for throughput (tests/bench/native_big.sh scales it to
gigabytes with scale_snapshot.py), not for exact peaks.
"""
import pickle
import sys
import time

src, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
t = time.time()
with open(src, "rb") as f:
    snap = pickle.load(f)
print(f"loaded in {time.time() - t:.1f} s", flush=True)
trace = snap["device_traces"][0]
mid = len(trace) // 2
snap["device_traces"] = [trace[mid : mid + n]]
with open(out, "wb") as f:
    pickle.dump(snap, f, protocol=4)
print(f"{out}: {len(trace)} entries -> {len(snap['device_traces'][0])}")
