"""Writes read_ahead_cases.pickle: mlp_adam_3steps.pickle with trace entries in every shape the
snapshot importer's read-ahead path meets or refuses (empty, one-frame, shared and tuple frame
lists, extra keys of every kind, an entry listed twice, an unknown action, a dict too large to
read ahead), pickled at protocol 4 so that FRAME opcodes fall inside entries. The importer's
test checks that reading entries ahead gives the trace that building them gives.
Run: python3 read_ahead_cases.gen.py"""
import pickle

with open("mlp_adam_3steps.pickle", "rb") as f:
    snapshot = pickle.load(f)
trace = snapshot["device_traces"][0]
with_frames = [e for e in trace if e.get("frames")]
frame = with_frames[0]["frames"][0]
with_frames[0]["frames"] = []
with_frames[1]["frames"] = [frame]
with_frames[2]["frames"] = with_frames[3]["frames"]
with_frames[4]["frames"] = tuple(with_frames[4]["frames"])
with_frames[5]["frames"] = [frame, frame, dict(frame)]
with_frames[6]["extra"] = 1.5
with_frames[7].update(extra_none=None, extra_true=True, extra_false=False, extra_big=2**70 // 2**10)
with_frames[8]["extra_list"] = []
with_frames[9]["extra_text"] = "".join(["fresh", "-text"])
with_frames[10].update({f"k{i}": i for i in range(80)})
next(e for e in with_frames[11:] if e["action"] == "alloc")["action"] = "".join(["al", "loc"])
trace.insert(len(trace) // 2, dict(with_frames[12], action="not_an_action"))
last_free = max(i for i, e in enumerate(trace) if e["action"] == "free_completed")
trace.insert(last_free, trace[last_free])
with open("read_ahead_cases.pickle", "wb") as f:
    pickle.dump(snapshot, f, protocol=4)
