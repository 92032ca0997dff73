"""One markdown row of tests/gpu/holders.sh: a case's FACTS (what PyTorch's objects held at its
marks) against `collector why --json --no-fold` at those marks, and whether the traced run's
results and hook calls equal the untraced one's. Exits 1 when a recorded kind differs from
PyTorch's objects, the results differ, or recorded holders name under 99 % of the live bytes at
the allocated peak (issue 66), with a CHECK line (tests/gpu/checks.py) for each of the four.
    holders_compare.py CASE PREFIX   (reads PREFIX.{plain,traced}.txt, PREFIX.{after_forward,after_backward,peak}.json)
"""
import json
import os
import sys

from checks import check

case, prefix = sys.argv[1], sys.argv[2]
label = os.path.basename(prefix)


def facts(path):
    for line in open(path):
        if line.startswith("FACTS "):
            return json.loads(line[6:])
    return None


def why(at):
    try:
        return json.load(open(f"{prefix}.{at}.json"))
    except (OSError, ValueError):
        return None


def recorded(w, kind):
    """What the recorded holders' tensors asked for (the blocks are rounded up)."""
    return sum(h["requested_bytes"] for h in w["holders"] if h["kind"] == kind and not h.get("inferred"))


def largest_unknown(w, kinds=("unknown",)):
    u = [h for h in w["holders"] if h["kind"] in kinds]
    if not u:
        return "—"
    h = max(u, key=lambda h: h["bytes"])
    return f"{h['bytes']:,} in {h['blocks']} blocks ({h['kind']}: {' in '.join(x for x in (h['name'], h['module']) if x)})"


def named(w):
    """The share of allocated bytes with a holder other than unknown (`named_bytes`), and the
    cuBLAS workspaces among them."""
    if not w or not w["live_bytes"]:
        return "—"
    ws = sum(h["bytes"] for h in w["holders"] if h["kind"] == "cache" and "workspace" in h["name"])
    return f"{100 * w['named_bytes'] / w['live_bytes']:.2f} %, recorded {share(w):.2f} % ({ws / 2**20:.0f} MiB workspaces)"


def share(w):
    return 100 * w["recorded_bytes"] / max(1, w["live_bytes"])


plain, traced = facts(f"{prefix}.plain.txt"), facts(f"{prefix}.traced.txt")
fwd, bwd, peak = why("after_forward"), why("after_backward"), why("peak")
if not traced or not fwd or not bwd:
    print(f"| {case} | failed: see {prefix}.traced.err | | | | | | | | |")
    check(f"{label}.run", "failed", "ran", False, f"see {prefix}.traced.err")
    sys.exit(1)
f = traced["after_forward"]


def pair(a, b):
    return f"{a:,} / {b:,}" + ("" if a == b else " ✗")


saved = sum(f["saved_for_backward"].values())
same = plain is not None and (plain["loss"], plain["hooks"]) == (traced["loss"], traced["hooks"])
print(
    f"| {case} | {pair(f['parameter'], recorded(fwd, 'parameter'))} | {pair(f['optimizer_state'], recorded(fwd, 'optimizer_state'))} "
    f"| {pair(saved, recorded(fwd, 'saved_for_backward'))} | {pair(traced['after_backward']['gradient'], recorded(bwd, 'gradient'))} "
    f"| {named(fwd)} | {largest_unknown(fwd)} | {named(peak)} | {largest_unknown(peak, ('unknown', 'temporary'))} | {'yes' if same else 'NO'} |"
)
ok = check(f"{label}.parameters", recorded(fwd, "parameter"), f"={f['parameter']}", f["parameter"] == recorded(fwd, "parameter"),
           "recorded at after_forward against PyTorch's parameters")
gradient = traced["after_backward"]["gradient"]
ok &= check(f"{label}.gradients", recorded(bwd, "gradient"), f"={gradient}", gradient == recorded(bwd, "gradient"),
            "recorded at after_backward against the .grad tensors")
ok &= check(f"{label}.results", "same" if same else "differ", "=same", same, "loss and hook calls against the untraced run")
ok &= check(f"{label}.recorded_at_peak", f"{share(peak):.2f}%" if peak else "-", ">=99%", bool(peak) and share(peak) >= 99.0)
if not ok:
    sys.exit(1)
