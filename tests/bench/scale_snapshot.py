"""Writes a large memory snapshot by repeating a real one's trace, for scale benchmarks.

    python3 tests/bench/scale_snapshot.py tests/data/resnet18_sgd_2steps.pickle 300 big.pickle

The device trace is repeated COPIES times, each copy shifted in time past the previous one;
entries of a copy share their frame objects with the original and get their own
compile_context string and their own frames list (one per list of the original, so an
allocation and its frees still share one, as PyTorch's recorder writes them), as the entries
of one real recording do, so the pickle's memo references look like a long real run's:
about 200 bytes per entry with stacks="all", as in tests/gpu/big_snapshots.py's recordings.
`--shared-frame-lists` keeps every copy's entries on the original's lists (76 bytes per
entry: the files the viewer benchmark table in README.md was measured on). The final
`segments` state is kept as recorded. Real recordings of at least 1 GB come from
tests/gpu/big_snapshots.py on a GPU machine; this makes the sizes in between, here.
"""

import copy
import pickle
import sys


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--shared-frame-lists"]
    shared_lists = len(args) != len(sys.argv) - 1
    src, copies, out = args[0], int(args[1]), args[2]
    with open(src, "rb") as f:
        snap = pickle.load(f)
    traces = []
    for trace in snap["device_traces"]:
        if not trace:
            traces.append(trace)
            continue
        span = trace[-1]["time_us"] - trace[0]["time_us"] + 1
        longer = []
        for c in range(copies):
            lists = {}  # id of an original frames list -> this copy's list
            for e in trace:
                e = copy.copy(e)  # a new entry dict; its frames stay shared
                e["time_us"] = e["time_us"] + c * span
                # A new string object per entry where the recorder makes one (PyTorch 2.11
                # writes a fresh "N/A" compile_context per entry, memoized each time).
                if isinstance(e.get("compile_context"), str):
                    e["compile_context"] = (e["compile_context"] + ".")[:-1]
                frames = e.get("frames")
                if isinstance(frames, list) and not shared_lists:
                    if id(frames) not in lists:
                        lists[id(frames)] = list(frames)
                    e["frames"] = lists[id(frames)]
                longer.append(e)
        traces.append(longer)
    snap["device_traces"] = traces
    with open(out, "wb") as f:
        pickle.dump(snap, f, protocol=4)
    print(f"{out}: {sum(len(t) for t in traces)} entries")


if __name__ == "__main__":
    main()
