#!/usr/bin/env python3
"""Checks `collector trace -- python PROGRAM` against PyTorch's own counters, on a GPU.

    COLLECTOR=./collector python3 tests/gpu/python_verify.py --out DIR

For resnet50 (batch 8, 3 iterations), gpt2 (GPT-2 small, batch 4, seq 512, 3 iterations) and
a Llama-architecture LM with and without gradient checkpointing (batch 4, seq 512, 3 iterations)
of tests/gpu/python_programs.py, traced by `$COLLECTOR trace -q -o DIR/<name>.mtrace.json`:

(a) the trace's peak allocated bytes (`collector summary --json`) equals the program's
    whole-process torch.cuda.max_memory_allocated() (RESULT max_memory_allocated) exactly;
(b) per leaf module, the peak allocated during its forward in iteration 0, computed from the
    trace file (allocated totals rebuilt from the event columns: base totals, per-event
    deltas, sparse overrides; the total just before the scope opens counts too, as the hook's
    reset sets the peak to the current value) is within 5 % of the hooks' measurement, for at
    least 95 % of the leaf modules.

Then it runs the overhead workload (`overhead --batch 32 --steps 24 --warmup 5 --flat 200`)
under the collector and reports its numbers (not judged). Prints one JSON document on stdout
and writes it to DIR/python_verify.json (each program's output goes to DIR/<name>.log).
Prints a CHECK line (tests/gpu/checks.py) for (a) and (b) of each program and for each run.
Exit code 0 only when (a) and (b) hold for both models and every run produced its RESULT.
"""

import argparse
import bisect
import json
import os
import subprocess
import sys
import time

from checks import check

PROGRAM = "tests/gpu/python_programs.py"
WORKLOADS = {
    "resnet50": ["--batch", "8", "--iters", "3"],
    "gpt2": ["--batch", "4", "--seq", "512", "--iters", "3"],
    "llama": ["--batch", "4", "--seq", "512", "--iters", "3"],
    "llama_checkpointing": ["--batch", "4", "--seq", "512", "--iters", "3", "--checkpointing"],
}
OVERHEAD_ARGS = ["--batch", "32", "--steps", "24", "--warmup", "5", "--flat", "200"]
TOLERANCE = 0.05  # (b): relative error per module
MIN_PASSING = 0.95  # (b): share of leaf modules within TOLERANCE
ALLOC, FREE = 0, 1  # EventType in the low 5 bits of events.tag (shared/src/model/events.rs)


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def run(cmd, logfile, env, timeout):
    """Runs cmd, keeps its output in logfile, returns (exit code, stdout)."""
    log("+ " + " ".join(cmd))
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
        code, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        code, out, err = "timeout", e.stdout or "", (e.stderr or "") + f"\ntimed out after {timeout} s"
        out, err = (x.decode(errors="replace") if isinstance(x, bytes) else x for x in (out, err))
    with open(logfile, "w") as f:
        f.write(f"$ {' '.join(cmd)}\n# exit {code} after {time.time() - t0:.1f} s\n--- stdout\n{out}\n--- stderr\n{err}\n")
    if code != 0:
        log(f"  exit {code}; stderr tail:\n{err[-3000:]}")
    return code, out


def parse_result(stdout):
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    return json.loads(lines[-1][len("RESULT "):]) if lines else None


def summary_json(collector, path, logfile, env):
    code, out = run([collector, "summary", path, "--json"], logfile, env, 600)
    if code != 0:
        return None
    return json.loads(out)


def allocated_series(trace):
    """(device index, timestamps, allocated totals after each event of that device, base)."""
    ev = trace["events"]
    devices = trace.get("devices") or []
    dev = next((i for i, d in enumerate(devices) if d.get("kind") == "cuda"), 0)
    running = [b["allocated_bytes"] for b in ev["base_totals"]]
    base = running[dev] if dev < len(running) else 0
    overrides = {o["index"]: o["totals"]["allocated_bytes"] for o in ev["overrides"]}
    ts, totals = [], []
    for i, (tag, size, d) in enumerate(zip(ev["tag"], ev["size_bytes"], ev["device"])):
        kind = tag & 0x1F
        v = running[d] + (size if kind == ALLOC else -size if kind == FREE else 0)
        v = overrides.get(i, max(v, 0))  # where the source reported a total, it wins
        running[d] = v
        if d == dev:
            ts.append(ev["ts_ns"][i])
            totals.append(v)
    return dev, ts, totals, base


def trace_forward_peaks(trace, names):
    """Peak allocated during each forward scope of `names` in iteration 0 (max over calls)."""
    _, ts, totals, base = allocated_series(trace)
    iters = [it for it in trace.get("iterations", []) if it["index"] == 0]
    if not iters:
        raise ValueError("the trace has no iteration 0")
    lo_it, hi_it = iters[0]["start_ns"], iters[0]["end_ns"]
    strings = trace["strings"]
    peaks = {}
    for s in trace["scopes"]:
        if s["phase"] != "forward" or s["start_ns"] < lo_it or s["end_ns"] > hi_it:
            continue
        name = strings[s["name"]] if 0 <= s["name"] < len(strings) else None
        if name not in names:
            continue
        lo = bisect.bisect_left(ts, s["start_ns"])
        hi = bisect.bisect_right(ts, s["end_ns"])
        before = totals[lo - 1] if lo > 0 else base
        peak = max([before] + totals[lo:hi])
        peaks[name] = max(peaks.get(name, 0), peak)
    trace_peak = max([base] + totals)
    return peaks, trace_peak


def compare_modules(hook, traced):
    rows, failures = [], []
    for name, want in hook.items():
        got = traced.get(name)
        if got is None:
            err = None
        else:
            err = abs(got - want) / want if want else (0.0 if got == want else float("inf"))
        row = {"module": name, "hook": want, "trace": got, "rel_error": err}
        rows.append(row)
        if err is None or err > TOLERANCE:
            failures.append(row)
    errs = [r["rel_error"] for r in rows if r["rel_error"] is not None]
    n = len(rows)
    passing = n - len(failures)
    return {
        "modules": n,
        "within_tolerance": passing,
        "exact": sum(1 for r in rows if r["trace"] == r["hook"]),
        "missing_in_trace": [r["module"] for r in rows if r["trace"] is None],
        "max_rel_error": max(errs) if errs else None,
        "share_within": passing / n if n else 0.0,
        "outside_tolerance": failures,
        "ok": n > 0 and passing / n >= MIN_PASSING,
    }


def check_workload(name, args, a, env):
    out_trace = os.path.join(a.out, f"{name}.mtrace.json")
    capture = ["--capture", a.capture] if a.capture else []
    cmd = [a.collector, "trace", "-q", *capture, "-o", out_trace, "--", a.python, PROGRAM, name.split("_")[0]] + args
    code, stdout = run(cmd, os.path.join(a.out, f"{name}.log"), env, a.timeout)
    r = {"command": " ".join(cmd), "exit_code": code, "ok": False}
    result = parse_result(stdout)
    if code != 0 or result is None or not os.path.exists(out_trace):
        r["error"] = f"the traced run failed (exit {code}, RESULT {'found' if result else 'missing'}); see {name}.log"
        return r
    s = summary_json(a.collector, out_trace, os.path.join(a.out, f"{name}.summary.log"), env)
    if s is None:
        r["error"] = f"`collector summary` failed; see {name}.summary.log"
        return r
    top, s = s, s.get("summary", s)  # Summary's fields are flattened in (commands.rs SummaryJson)
    want = result["max_memory_allocated"]
    got = s["peak_allocated_bytes"]
    r["program"] = {k: v for k, v in result.items() if k not in ("module_forward_peaks", "module_forward_calls")}
    r["peak"] = {
        "trace_peak_allocated_bytes": got,
        "program_max_memory_allocated": want,
        "difference_bytes": got - want,
        # PyTorch's counter at exit: the peak since the hooks' last reset, for information only.
        "reported_cuda_max_memory_allocated": (top.get("reported") or {}).get("cuda.max_memory_allocated"),
        "ok": got == want,
    }
    r["trace"] = {k: s.get(k) for k in ("total_events", "total_ops", "dropped_events", "peak_layer", "duration_s")}
    r["trace"]["warnings"] = top.get("warnings")
    with open(out_trace) as f:
        trace = json.load(f)["trace"]
    hook = result["module_forward_peaks"]
    try:
        traced, rebuilt_peak = trace_forward_peaks(trace, set(hook))
    except (ValueError, KeyError, IndexError) as e:
        r["modules"] = {"ok": False, "error": f"cannot read the trace's iteration 0: {e!r}"}
        return r
    r["modules"] = compare_modules(hook, traced)
    r["modules"]["calls_per_module_max"] = max(result.get("module_forward_calls", {}).values(), default=None)
    # Sanity check of the reconstruction itself: its overall peak must be the summary's.
    r["modules"]["rebuilt_trace_peak_matches_summary"] = rebuilt_peak == got
    r["ok"] = r["peak"]["ok"] and r["modules"]["ok"]
    return r


def run_overhead(a, env):
    out_trace = os.path.join(a.out, "overhead.mtrace.json")
    cmd = [a.collector, "trace", "-q", "-o", out_trace, "--", a.python, PROGRAM, "overhead"] + OVERHEAD_ARGS
    code, stdout = run(cmd, os.path.join(a.out, "overhead.log"), env, a.timeout)
    result = parse_result(stdout)
    r = {"command": " ".join(cmd), "exit_code": code, "ok": code == 0 and result is not None}
    if result is None:
        r["error"] = f"no RESULT (exit {code}); see overhead.log"
        return r
    flat = result.get("flat") or {}
    r["result"] = result
    r["headline"] = {
        "median_ms": result["median_ms"],
        "overhead_pct": result["overhead_pct"],
        "memory_tracer": result["memory_tracer"],
        "flat_median_first_ms": flat.get("median_first_ms"),
        "flat_median_last_ms": flat.get("median_last_ms"),
        "flat_last_vs_first_pct": flat.get("last_vs_first_pct"),
    }
    return r


def main():
    p = argparse.ArgumentParser(description="Checks the Python capture on a GPU (see the module docstring).")
    p.add_argument("--out", required=True, help="folder for the traces, logs and python_verify.json")
    p.add_argument("--collector", default=os.environ.get("COLLECTOR", "./collector"), help="collector binary [$COLLECTOR or ./collector]")
    p.add_argument("--python", default=os.environ.get("PYTHON", "python3"), help="Python that runs the programs [$PYTHON or python3]")
    p.add_argument("--only", default="resnet50,gpt2,llama,llama_checkpointing,overhead", help="comma-separated subset of resnet50,gpt2,llama,llama_checkpointing,overhead")
    p.add_argument("--timeout", type=int, default=900, help="seconds per traced run")
    p.add_argument("--capture", choices=["native", "recorder"], help="collector trace --capture (default: its own choice)")
    a = p.parse_args()
    only = [x for x in a.only.split(",") if x]
    unknown = sorted(set(only) - set(WORKLOADS) - {"overhead"})
    if unknown:
        p.error(f"--only: unknown {', '.join(unknown)}")
    if not (os.path.isfile(a.collector) and os.access(a.collector, os.X_OK)):
        p.error(f"the collector {a.collector!r} is not an executable file (set COLLECTOR or --collector)")
    if not os.path.isfile(PROGRAM):
        p.error(f"{PROGRAM} not found: run from the repository root")
    os.makedirs(a.out, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")

    doc = {"collector": a.collector, "python": a.python, "tolerance": TOLERANCE, "min_passing": MIN_PASSING, "workloads": {}}
    failures = []
    for name, args in WORKLOADS.items():
        if name not in only:
            continue
        try:
            r = check_workload(name, args, a, env)
        except Exception as e:  # a broken trace or summary: report it, go on with the rest
            r = {"ok": False, "error": f"checking failed: {e!r}"}
        doc["workloads"][name] = r
        if "error" in r:
            check(f"{name}.run", "failed", "ran", False, r["error"])
            failures.append(f"{name}: {r['error']}")
            continue
        pk = r["peak"]
        check(f"{name}.peak", pk["trace_peak_allocated_bytes"], f"={pk['program_max_memory_allocated']}", pk["ok"], "(a) against max_memory_allocated()")
        log(f"{name}: trace peak {pk['trace_peak_allocated_bytes']} vs max_memory_allocated {pk['program_max_memory_allocated']} (difference {pk['difference_bytes']})")
        if not pk["ok"]:
            failures.append(f"{name}: (a) trace peak {pk['trace_peak_allocated_bytes']} != max_memory_allocated {pk['program_max_memory_allocated']} (difference {pk['difference_bytes']})")
        m = r["modules"]
        if "error" in m:
            check(f"{name}.modules", "unreadable", "readable", False, m["error"])
            failures.append(f"{name}: (b) {m['error']}")
            continue
        check(f"{name}.modules", f"{m['within_tolerance']}/{m['modules']}", f">={MIN_PASSING:.0%}_within_{TOLERANCE:.0%}", m["ok"],
              f"(b) leaf modules' forward peaks against hooks; {m['exact']} exact")
        log(f"{name}: {m['within_tolerance']}/{m['modules']} leaf modules within {TOLERANCE:.0%} ({m['exact']} exact), max relative error {m['max_rel_error']}")
        for row in m["outside_tolerance"]:
            log(f"  outside: {row['module']} hook {row['hook']} trace {row['trace']} rel_error {row['rel_error']}")
        if not m["ok"]:
            failures.append(f"{name}: (b) only {m['within_tolerance']}/{m['modules']} leaf modules within {TOLERANCE:.0%} (need {MIN_PASSING:.0%})")
        if not m["rebuilt_trace_peak_matches_summary"]:
            log(f"{name}: note: the peak rebuilt from the event columns differs from the summary's")
    if "overhead" in only:
        r = run_overhead(a, env)
        doc["overhead"] = r
        check("overhead.run", "ran" if r["ok"] else "failed", "ran", r["ok"], "timed, not judged")
        if not r["ok"]:
            failures.append(f"overhead: {r.get('error', 'the run failed; see overhead.log')}")
        else:
            log(f"overhead: {json.dumps(r['headline'])}")
    doc["failures"] = failures
    doc["pass"] = not failures
    text = json.dumps(doc, indent=2, sort_keys=True)
    with open(os.path.join(a.out, "python_verify.json"), "w") as f:
        f.write(text + "\n")
    print(text)
    for msg in failures:
        log("FAIL " + msg)
    log("PASS" if not failures else f"{len(failures)} failure(s)")
    sys.exit(0 if not failures else 1)


if __name__ == "__main__":
    main()
