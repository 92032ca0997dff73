"""Writes wrapped_annotations.pickle: mlp_adam_3steps.pickle with the external annotations a
snapshot has when the recorder's trace buffer wrapped. The recorder keeps as many annotations
as trace entries (CUDACachingAllocator's annotation_buffer takes the same max_entries), so with
a few annotations per iteration against hundreds of entries, its annotations reach far before
the first trace entry. Added: 100 optimizer steps that end before the first entry, a span that
crosses it, 10 optimizer steps after the last entry and a span that crosses that. The importer
keeps only what falls within the entries' time, cut there.
Run: python3 wrapped_annotations.gen.py"""
import pickle

with open("mlp_adam_3steps.pickle", "rb") as f:
    snapshot = pickle.load(f)
times = [e["time_us"] for trace in snapshot["device_traces"] for e in trace]
first, last = min(times), max(times)
before, after = [], []
for k in range(100):
    start = first - 60_000_000 + k * 500_000
    before += [{"stage": "START", "name": "Optimizer.step#Adam.step", "device": 0, "time_us": start},
               {"stage": "END", "name": "Optimizer.step#Adam.step", "device": 0, "time_us": start + 2_000}]
before += [{"stage": "START", "name": "data loading", "device": 0, "time_us": first - 5_000_000}]
crossing_end = {"stage": "END", "name": "data loading", "device": 0, "time_us": first + 1_000}
after += [{"stage": "START", "name": "evaluation", "device": 0, "time_us": last - 1_000}]
for k in range(10):
    start = last + 1_000_000 + k * 500_000
    after += [{"stage": "START", "name": "Optimizer.step#Adam.step", "device": 0, "time_us": start},
              {"stage": "END", "name": "Optimizer.step#Adam.step", "device": 0, "time_us": start + 2_000}]
after += [{"stage": "END", "name": "evaluation", "device": 0, "time_us": last + 9_000_000}]
annotations = snapshot.get("external_annotations", [])
snapshot["external_annotations"] = before + [crossing_end] + annotations + after
with open("wrapped_annotations.pickle", "wb") as f:
    pickle.dump(snapshot, f)
