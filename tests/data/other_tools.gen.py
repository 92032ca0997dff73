"""Writes snapshots as other recorders and tools write them (issue 32, part 5), from the real
samples beside this script:

- free_completed_only.pickle.gz: resnet18_sgd_2steps.pickle with every `free_requested` entry
  removed, so that each free is a `free_completed` alone (memory_viz reads either as the free).
- dropped_frees.pickle.gz: mlp_adam_3steps.pickle without its frees, which a replay cannot
  square with its segments.
- unknown_line.pickle.gz: mlp_adam_3steps.pickle with the `line` of the first entry's first
  frame and of its first Python frame set to 2**64-1, C++'s "unknown line", which Python pickles as a 9-byte LONG1 and reads back.

- pending_free.pickle.gz, pending_before.pickle.gz: frees waiting for other streams (below).
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

# Frees that wait for other streams (record_stream), made by hand as PyTorch writes them:
# - pending_free.pickle.gz: a 2 MiB block freed (free_requested) and still pending when the
#   snapshot is taken (`active_pending_free`) beside a live 4 MiB block: PyTorch counts 6 MiB
#   at the peak and 4 MiB at the end (a request stops counting at once), 20 MiB reserved.
# - pending_before.pickle.gz: a 2 MiB block whose free was requested before recording and
#   completes during it (its first entry is free_completed), beside a 4 MiB block freed during
#   recording: 4 MiB allocated at the start, 0 at the end.
MIB = 1 << 20
BASE = 0x7F0000000000


def entry(action, addr, size, t):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": []}


def segment(blocks):
    return {"device": 0, "address": BASE, "total_size": 20 * MIB, "allocated_size": 0, "active_size": 0,
            "requested_size": 0, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
            "is_expandable": False, "frames": [],
            "blocks": [{"address": a, "size": s, "requested_size": s, "state": st, "frames": []} for a, s, st in blocks]}


pending = {
    "segments": [segment([(BASE, 2 * MIB, "active_pending_free"), (BASE + 2 * MIB, 4 * MIB, "active_allocated"),
                          (BASE + 6 * MIB, 14 * MIB, "inactive")])],
    "device_traces": [[entry("segment_alloc", BASE, 20 * MIB, 1), entry("alloc", BASE, 2 * MIB, 2),
                       entry("alloc", BASE + 2 * MIB, 4 * MIB, 3), entry("free_requested", BASE, 2 * MIB, 4)]],
    "allocator_settings": {},
}
with gzip.GzipFile("pending_free.pickle.gz", "wb", mtime=0) as f:
    pickle.dump(pending, f)
before = {
    "segments": [segment([(BASE, 20 * MIB, "inactive")])],
    "device_traces": [[entry("free_completed", BASE, 2 * MIB, 1), entry("free_requested", BASE + 2 * MIB, 4 * MIB, 2),
                       entry("free_completed", BASE + 2 * MIB, 4 * MIB, 3)]],
    "allocator_settings": {},
}
with gzip.GzipFile("pending_before.pickle.gz", "wb", mtime=0) as f:
    pickle.dump(before, f)
