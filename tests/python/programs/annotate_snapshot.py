"""Turns real memory snapshots (tests/data, recorded on an H100) into what the recorder fallback
(memory_tracer/_history.py) writes: the same snapshots with its `memory_tracer:*` annotations
added, as its files `recorder-1-<k>.pickles` (one protocol-2 pickle per device's entries, then
the annotations, segments and settings), one per input, in order (several inputs are the
snapshots of one process, one after another).

    python annotate_snapshot.py OUT_DIR SNAPSHOT.pickle [SNAPSHOT.pickle ...]

Each optimizer step the snapshot already annotates (`Optimizer.step#...`) ends an iteration:
the iteration runs from the previous step's end (the first entry for the first), its first 40 %
up to the step is the forward, the rest the backward, the step the optimizer phase. Module
scopes nest in each forward: `Model` (depth 0) over all of it, `block` (1) over its first half,
`block.conv` (2) over its first quarter, `head` (1) over its last tenth; `optimizer.step`
(depth 0) over the step. The snapshot's own annotations stay (the collector leaves them out).

Prints JSON: the files written (name, bytes and pieces, as the recorder's notes give them),
and what the collector must make of them, worked out here
independently: every iteration's span in ns, and the allocations by layer (the innermost
scope holding the entry's time, else the innermost frame of the program's own code on its
stack, `file.py:line in function`, else `unattributed`) and by phase.
"""

import json
import os
import pickle
import sys


def ann(name, stage, t):
    return {"name": name, "stage": stage, "device": 0, "time_us": int(t)}


def own_line(entry):
    """The innermost frame on an entry's stack of the program's own code (a `.py` file outside
    installed packages and torch) or of an installed library model's `forward` (torchvision's;
    not torch's own package), as the collector names a layer outside every module."""
    for f in entry.get("frames", []):
        name = f.get("filename", "")
        installed = "/site-packages/" in name or "/dist-packages/" in name
        torch_own = "-packages/torch/" in name if installed else "/torch/" in name
        forward = f.get("name") in ("forward", "_forward_impl")
        if name.endswith(".py") and not torch_own and (not installed or forward):
            return f"{name.rsplit('/', 1)[-1]}:{f['line']} in {f['name']}"
    return "unattributed"


def annotate(snap, first_iteration):
    entries = [e for t in snap["device_traces"] for e in t]
    t0 = min(e["time_us"] for e in entries)
    t_last = max(e["time_us"] for e in entries)
    steps, opened = [], {}
    for a in snap.get("external_annotations", []):
        if not a.get("name", "").startswith("Optimizer.step"):
            continue
        if a["stage"] == "START":
            opened[a["name"]] = a["time_us"]
        elif a["name"] in opened:
            steps.append((opened.pop(a["name"]), a["time_us"]))
    steps.sort()
    spans = []  # (name, start, end, depth, phase)
    phases = []  # (phase, start, end)
    iterations = []
    start = t0
    for k, (a, b) in enumerate(steps):
        f_end = start + (a - start) * 4 // 10
        forward = f_end - start
        spans += [
            ("Model", start, f_end, 0, "forward"),
            ("block", start, start + forward // 2, 1, "forward"),
            ("block.conv", start, start + forward // 4, 2, "forward"),
            ("head", f_end - forward // 10, f_end, 1, "forward"),
            ("optimizer.step", a, b, 0, "optimizer"),
        ]
        phases += [("forward", start, f_end), ("backward", f_end + 1, a - 1), ("optimizer", a, b)]
        iterations.append((first_iteration + k, start, b))
        # The collector keeps spans within the entries' time (as every snapshot import does).
        iterations[-1] = (first_iteration + k, max(start, t0), min(b, t_last))
        start = b + 1
    out = list(snap.get("external_annotations", []))
    for name, s, e, depth, phase in spans:
        full = f"memory_tracer:scope:{depth}:{phase}:{name}"
        out += [ann(full, "START", s), ann(full, "END", e)]
    for phase, s, e in phases:
        out += [ann(f"memory_tracer:phase:{phase}", "START", s), ann(f"memory_tracer:phase:{phase}", "END", e)]
    for n, s, e in iterations:
        out += [ann(f"memory_tracer:iteration:{n}", "START", s), ann(f"memory_tracer:iteration:{n}", "END", e)]
    out.sort(key=lambda x: x["time_us"])
    snap["external_annotations"] = out
    by_layer, by_phase = {}, {}
    for e in entries:
        if e["action"] != "alloc":
            continue
        t = e["time_us"]
        inside = [s for s in spans if s[1] <= t <= s[2]]
        layer = max(inside, key=lambda s: (s[3], s[1]))[0] if inside else own_line(e)
        phase = next((p for p, s, end in phases if s <= t <= end), "other")
        by_layer[layer] = by_layer.get(layer, 0) + 1
        by_phase[phase] = by_phase.get(phase, 0) + 1
    return iterations, by_layer, by_phase


def main():
    out_dir, inputs = sys.argv[1], sys.argv[2:]
    facts = {"files": [], "iterations": [], "allocs_by_layer": {}, "allocs_by_phase": {}}
    for k, path in enumerate(inputs):
        with open(path, "rb") as f:
            snap = pickle.load(f)
        iterations, by_layer, by_phase = annotate(snap, len(facts["iterations"]))
        name = f"recorder-1-{k}.pickles"
        pieces = []
        with open(os.path.join(out_dir, name), "wb") as f:
            for what, device, obj in [("entries", d, t) for d, t in enumerate(snap["device_traces"])] + [
                ("annotations", None, snap["external_annotations"]),
                ("segments", None, snap["segments"]),
                ("settings", None, snap.get("allocator_settings", {})),
            ]:
                start = f.tell()
                pickle.dump(obj, f, protocol=2)
                pieces.append({"what": what, "device": device, "offset": start, "bytes": f.tell() - start})
        facts["files"].append({"name": name, "bytes": os.path.getsize(os.path.join(out_dir, name)), "pieces": pieces})
        facts["iterations"] += [[n, s * 1000, e * 1000] for n, s, e in iterations]
        for d, src in ((facts["allocs_by_layer"], by_layer), (facts["allocs_by_phase"], by_phase)):
            for key, v in src.items():
                d[key] = d.get(key, 0) + v
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
