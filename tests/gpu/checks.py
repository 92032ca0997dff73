"""The CHECK line that every GPU check prints (tests/gpu/README.md), one per thing it compares:

    CHECK <name> <figure> <bound> PASS|FAIL [note]

name, figure and bound are single words (whitespace in them becomes `_`); the note is the rest
of the line. tests/gpu/all.py collects these lines into its table. From Python,
`from checks import check` (a script in tests/gpu has the folder on sys.path; a heredoc needs
PYTHONPATH=tests/gpu); from bash, `check` in torch_env.sh.

As a program it judges the JSON that several checks share, printing CHECK lines and exiting 1
when one fails:

    python3 tests/gpu/checks.py advise VERIFY.json LABEL [--times]
    python3 tests/gpu/checks.py whatif WHATIF_VERIFY.json COUNTERS.jsonl LABEL

advise: `collector advise --verify`'s verify.json: every run ran, its measured peak equals
PyTorch's max_memory_allocated() to the byte, each predicted peak within 5 % of the measured
one (shared/tests/advice_amp.rs's bound; docs/benchmarks.md: within 4.3 % on an H100), a
suggested allocator setting's reserved peak within 2 % (issue 48), and the advice suggested
checkpointing and AMP. --times: the checkpointing run's extra time per iteration within 25 %
of the predicted one, or within the measurement's uncertainty (docs/usage.md).

whatif: `collector whatif --verify --json`'s output beside the COUNTERS lines of untraced runs
(tests/gpu/whatif.sh): per setting, the predicted allocated peak within 0.5 % and the reserved
peak within 2 % of PyTorch's (issue 48), or inside the predicted range across the expandable
divide; and the traced run's counters equal to the untraced run's.
"""
import json
import sys


def word(value):
    """One whitespace-free word of a CHECK line (`-` for nothing)."""
    return "_".join(str(value).split()) or "-"


def check(name, figure, bound, ok, note=""):
    """Prints one CHECK line and returns whether it passed."""
    tail = " " + " ".join(str(note).split()) if note else ""
    print(f"CHECK {word(name)} {word(figure)} {word(bound)} {'PASS' if ok else 'FAIL'}{tail}", flush=True)
    return bool(ok)


def pct(value):
    return f"{value:+.2f}%"


def role(configuration):
    """A verify.json row's part: baseline, checkpoint, amp, both or setting."""
    if configuration.startswith("PYTORCH_CUDA_ALLOC_CONF="):
        return "setting"
    if configuration.startswith("checkpoint"):
        return "both" if configuration.endswith("+ amp") else "checkpoint"
    return configuration


def advise(path, label, times=False):
    """CHECK lines for one `collector advise --verify` run; whether all passed."""
    with open(path) as f:
        rows = json.load(f)["rows"]
    ok = True
    roles = [role(r["configuration"]) for r in rows]
    ok &= check(f"{label}.suggestions", "+".join(roles), "has_checkpoint+amp", "checkpoint" in roles and "amp" in roles)
    for part, r in zip(roles, rows):
        name = f"{label}.{part}"
        if r.get("error"):
            ok &= check(f"{name}.run", "failed", "ran", False, r["error"])
            continue
        peak, torch_peak = r["peak_allocated_bytes"], r.get("pytorch_max_allocated_bytes")
        ok &= check(f"{name}.peak", peak, f"={torch_peak}", peak == torch_peak, "measured peak against max_memory_allocated()")
        if r.get("error_pct") is not None:
            ok &= check(f"{name}.predicted", pct(r["error_pct"]), "abs<=5%", abs(r["error_pct"]) <= 5.0, "(measured - predicted) / measured")
        if r.get("reserved_error_pct") is not None:
            e = r["reserved_error_pct"]
            ok &= check(f"{name}.reserved", pct(e), "abs<=2%", abs(e) <= 2.0, r.get("alloc_conf", ""))
        if times and part == "checkpoint":
            note = r.get("timing_note") or "no timing"
            fits = "within" in note and "beyond" not in note
            e = r.get("extra_error_pct")
            ok &= check(f"{name}.extra_time", "-" if e is None else pct(e), "abs<=25%_or_uncertain", fits, note)
    return ok


def whatif(path, counters_path, label):
    """CHECK lines for one `collector whatif --verify` run and its untraced twins; whether all
    passed."""
    with open(path) as f:
        rows = json.load(f)["rows"]
    untraced = {}
    with open(counters_path) as f:
        for line in f:
            if line.strip():
                c = json.loads(line)
                untraced[c["alloc_conf"]] = c
    ok = True
    for k, r in enumerate(rows):
        name, setting = f"{label}.setting{k}", r["alloc_conf"] or "(the run's own)"
        if r.get("error"):
            ok &= check(f"{name}.run", "failed", "ran", False, f"{setting}: {r['error']}")
            continue
        a, e = r["allocated_error_pct"], r["reserved_error_pct"]
        ok &= check(f"{name}.allocated", pct(a), "abs<=0.5%", a is not None and abs(a) <= 0.5, setting)
        in_range = r.get("reserved_in_range")
        fits = e is not None and abs(e) <= 2.0 or in_range is True
        ok &= check(f"{name}.reserved", pct(e) if e is not None else "-", "abs<=2%_or_in_range", fits, f"{setting}; in range: {in_range}")
        u = untraced.get(r["env"])
        traced = f"{r['measured_allocated_peak_bytes']}/{r['measured_reserved_peak_bytes']}"
        want = f"{u['max_memory_allocated']}/{u['max_memory_reserved']}" if u else "no_untraced_run"
        ok &= check(f"{name}.untraced", traced, f"={want}", traced == want, f"{setting}: traced counters against the untraced run's")
    return ok


def main(argv):
    if len(argv) >= 3 and argv[0] == "advise":
        judge, label = (lambda: advise(argv[1], argv[2], times="--times" in argv[3:])), argv[2]
    elif len(argv) == 4 and argv[0] == "whatif":
        judge, label = (lambda: whatif(argv[1], argv[2], argv[3])), argv[3]
    else:
        sys.exit(__doc__)
    try:
        return judge()
    except (OSError, ValueError, KeyError, TypeError) as e:  # the run wrote nothing, or not this
        return check(f"{label}.output", "unreadable", "readable", False, repr(e))


if __name__ == "__main__":
    sys.exit(0 if main(sys.argv[1:]) else 1)
