"""Two copies of a snapshot for timing the import of torch 2.12's layout: as it is, and with
`pool_id` (a fresh tuple per entry, as torch 2.12+ writes it), `user_metadata` and
`compile_context` added to every trace entry.

    python3 tests/bench/pool_id_layout.py [tests/data/big_all_cut.pickle.xz] [OUT_DIR]

Writes OUT_DIR/big_211.pickle and OUT_DIR/big_212.pickle (default /tmp)."""
import lzma
import os
import pickle
import sys

src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../data/big_all_cut.pickle.xz")
out = sys.argv[2] if len(sys.argv) > 2 else "/tmp"
opener = lzma.open if src.endswith(".xz") else open
with opener(src, "rb") as f:
    d = pickle.load(f)
with open(os.path.join(out, "big_211.pickle"), "wb") as f:
    pickle.dump(d, f, protocol=4)
for trace in d["device_traces"]:
    for e in trace:
        e["compile_context"] = "N/A"
        e["user_metadata"] = ""
        e["pool_id"] = tuple([0, int("0")])  # a new tuple object per entry, as PyTorch's C++ makes them
with open(os.path.join(out, "big_212.pickle"), "wb") as f:
    pickle.dump(d, f, protocol=4)
