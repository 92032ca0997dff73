"""Writes no_history.pickle: the MLP sample's allocator state without its trace entries, which
is what torch.cuda.memory._snapshot() gives when _record_memory_history() was never on (its
segments, no entries, no annotations).
Run: python3 no_history.gen.py"""
import pickle

with open("mlp_adam_3steps.pickle", "rb") as f:
    snapshot = pickle.load(f)
snapshot["device_traces"] = [[] for _ in snapshot["device_traces"]]
snapshot.pop("external_annotations", None)
with open("no_history.pickle", "wb") as f:
    pickle.dump(snapshot, f)
