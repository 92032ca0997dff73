"""Writes snapshots as other recorders and tools write them (issue 32, part 5), from the real
samples beside this script:

- free_completed_only.pickle.gz: resnet18_sgd_2steps.pickle with every `free_requested` entry
  removed, so that each free is a `free_completed` alone (memory_viz reads either as the free).
- dropped_frees.pickle.gz: mlp_adam_3steps.pickle without its frees, which a replay cannot
  square with its segments.
- unknown_line.pickle.gz: mlp_adam_3steps.pickle with the `line` of the first entry's first
  frame and of its first Python frame set to 2**64-1, C++'s "unknown line", which Python pickles as a 9-byte LONG1 and reads back.

- fsdp2_rank1_late.pickle.gz: fsdp2_rank1.pickle.gz without its first 40 % of trace entries:
  recording that starts mid-iteration, with memory from before it freed during it.

Run: python3 other_tools.gen.py"""
import gzip
import pickle

with open("resnet18_sgd_2steps.pickle", "rb") as f:
    snapshot = pickle.load(f)
snapshot["device_traces"] = [[e for e in t if e["action"] != "free_requested"] for t in snapshot["device_traces"]]
with gzip.GzipFile("free_completed_only.pickle.gz", "wb", mtime=0) as f:
    pickle.dump(snapshot, f)

with open("mlp_adam_3steps.pickle", "rb") as f:
    snapshot = pickle.load(f)
# On the first frame (C++, where such lines come from) and on the first Python frame.
frames = next(e["frames"] for t in snapshot["device_traces"] for e in t if e.get("frames"))
frames[0] = dict(frames[0], line=2**64 - 1)
k = next(k for k, f in enumerate(frames) if f["filename"].endswith(".py"))
frames[k] = dict(frames[k], line=2**64 - 1)
with gzip.GzipFile("unknown_line.pickle.gz", "wb", mtime=0) as f:
    pickle.dump(snapshot, f)
# The integer is pickled as LONG1 with 9 bytes, as C++'s size_t(-1) is.
assert b"\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00" in gzip.open("unknown_line.pickle.gz").read()

# A trace that lost its frees (neither entry kept): replayed, allocated would pass reserved.
with open("mlp_adam_3steps.pickle", "rb") as f:
    snapshot = pickle.load(f)
snapshot["device_traces"] = [[e for e in t if not e["action"].startswith("free")] for t in snapshot["device_traces"]]
with gzip.GzipFile("dropped_frees.pickle.gz", "wb", mtime=0) as f:
    pickle.dump(snapshot, f)

# Recording that starts mid-iteration, with memory from before it freed during it: the FSDP2
# rank 1 snapshot without its first 40 % of entries (as a recorder turned on late sees it).
with gzip.open("fsdp2_rank1.pickle.gz", "rb") as f:
    snapshot = pickle.load(f)
snapshot["device_traces"] = [t[len(t) * 2 // 5:] for t in snapshot["device_traces"]]
with gzip.GzipFile("fsdp2_rank1_late.pickle.gz", "wb", mtime=0) as f:
    pickle.dump(snapshot, f)
