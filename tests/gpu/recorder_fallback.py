#!/usr/bin/env python3
"""Checks the recorder fallback (`collector trace --capture recorder`) against PyTorch's own
counters, on a GPU.

    python3 tests/gpu/recorder_fallback.py --collector ./collector [--python PY] [--out DIR]

Each run is `COLLECTOR trace -q --capture recorder -o DIR/<run>.mtrace.json -- PY THIS_FILE
workload ...`; the workload (this file, `workload resnet50|gpt2`) trains on CUDA and prints
`RESULT {json}` with torch.cuda.max_memory_allocated() and max_memory_reserved() at its end
(never reset). Runs:

- resnet50: torchvision ResNet-50, batch 32 at 224x224, SGD momentum, 3 steps;
- resnet50_chunked: the same for 5 steps with MEMORY_TRACER_RECORDER_CHUNK_ENTRIES=2000, so
  the process writes a snapshot at (nearly) every iteration end and the collector stitches them;
- resnet50_inference: ResNet-50 under torch.no_grad(), 6 batches of 32, no optimizer (one
  iteration, forward allocations only), with the same small chunks: snapshots at the ends of
  top-level module calls;
- gpt2: transformers' GPT2LMHeadModel from GPT2Config() (GPT-2 small, random weights), batch 4
  x 512 tokens, AdamW, bf16 autocast, 3 steps;
- ddp (with two or more GPUs): `torchrun --nproc-per-node 2` of torchvision ResNet-18 under
  DistributedDataParallel (NCCL), batch 32, SGD, 3 steps; every rank prints its RESULT, and each
  rank's peaks in the merged trace (`devices`) are checked against its own counters (torchrun's
  launcher imports torch but uses no CUDA: it gets no trace).

For each: the trace's peak allocated and reserved bytes (`collector summary --json`'s
`peak_allocated_bytes`, `peak_reserved_bytes`) equal the program's max_memory_allocated() and
max_memory_reserved() exactly; the trace has one iteration per step, the layers named (module
paths, `optimizer.step`) and forward, backward and optimizer allocations; its first note names
the recorder; the chunked run stitched two or more snapshots. Prints a table on stderr, one JSON document on
stdout (also DIR/recorder_fallback.json) and CHECK lines (tests/gpu/checks.py): per run its
peaks and the count of its other failures; exits 0 only when every check holds.
"""

import argparse
import json
import os
import subprocess
import sys
import time

from checks import check as check_line

HERE = os.path.abspath(__file__)
RUNS = {
    "resnet50": (["resnet50", "--batch", "32", "--iters", "3"], {}, ["ResNet", "conv1", "layer1.0.conv1", "layer4.2.bn3", "fc", "CrossEntropyLoss", "optimizer.step"]),
    "resnet50_chunked": (["resnet50", "--batch", "32", "--iters", "5"], {"MEMORY_TRACER_RECORDER_CHUNK_ENTRIES": "2000"}, ["layer1.0.conv1", "fc", "optimizer.step"]),
    "resnet50_inference": (["resnet50", "--batch", "32", "--iters", "6", "--infer"], {"MEMORY_TRACER_RECORDER_CHUNK_ENTRIES": "500"}, ["ResNet", "layer1.0.conv1", "fc"]),
    "gpt2": (["gpt2", "--batch", "4", "--seq", "512", "--iters", "3"], {}, ["GPT2LMHeadModel", "transformer.wte", "transformer.h.0.attn", "transformer.h.11.mlp", "lm_head", "optimizer.step"]),
    "ddp": (["ddp", "--batch", "32", "--iters", "3"], {}, ["DistributedDataParallel", "module.layer1.0.conv1", "module.fc", "optimizer.step"]),
}
PHASE_SHIFT, ALLOC = 5, 0  # events.tag: EventType in the low 5 bits, Phase above (shared/src/model/events.rs)
PHASES = ["forward", "backward", "optimizer", "other"]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# -- the workloads (run under the collector) ------------------------------------------------------
def workload(argv):
    p = argparse.ArgumentParser(prog="recorder_fallback.py workload")
    p.add_argument("model", choices=["resnet50", "gpt2", "ddp"])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--infer", action="store_true", help="resnet50 only: forward passes under no_grad, no optimizer")
    a = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        sys.exit("recorder_fallback.py: error: CUDA is not available")
    torch.manual_seed(0)
    dev = torch.device("cuda")
    rank = None
    if a.model == "ddp":
        import torch.distributed as dist
        import torchvision

        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        dist.init_process_group("nccl")
        rank, dev = dist.get_rank(), torch.device("cuda", local)
        model = torch.nn.parallel.DistributedDataParallel(torchvision.models.resnet18(weights=None).to(dev).train(), device_ids=[local])
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loss_fn = torch.nn.CrossEntropyLoss()
        x = torch.randn(a.batch, 3, 224, 224, device=dev)
        y = torch.randint(0, 1000, (a.batch,), device=dev)

        def step():
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()

    elif a.model == "resnet50":
        import torchvision

        model = torchvision.models.resnet50(weights=None).to(dev).train(not a.infer)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loss_fn = torch.nn.CrossEntropyLoss()
        x = torch.randn(a.batch, 3, 224, 224, device=dev)
        y = torch.randint(0, 1000, (a.batch,), device=dev)

        def step():
            if a.infer:
                with torch.no_grad():
                    model(x)
                return
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x), y).backward()
            opt.step()

    else:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config()
        model = GPT2LMHeadModel(cfg).to(dev).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seq), device=dev)

        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            loss.backward()
            opt.step()

    iteration_ms = []
    for _ in range(a.iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        iteration_ms.append(round((time.perf_counter() - t0) * 1e3, 2))
    result = {
        "rank": rank,
        "max_memory_allocated": torch.cuda.max_memory_allocated(dev),
        "max_memory_reserved": torch.cuda.max_memory_reserved(dev),
        "iters": a.iters,
        "iteration_ms": iteration_ms,
        "torch_version": torch.__version__,
        "device_name": torch.cuda.get_device_name(),
    }
    print("RESULT " + json.dumps(result, sort_keys=True), flush=True)
    if rank is not None:
        torch.distributed.destroy_process_group()


# -- the checks ---------------------------------------------------------------------------------
def run(cmd, logfile, env, timeout):
    """Runs cmd, keeps its output in logfile; returns (exit code, stdout, stderr)."""
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
    return code, out, err


def parse_results(stdout):
    return [json.loads(ln[len("RESULT "):]) for ln in stdout.splitlines() if ln.startswith("RESULT ")]


def trace_facts(path):
    """Iterations, layer names and allocations by phase of a written trace (native JSON)."""
    with open(path) as f:
        trace = json.load(f)["trace"]
    strings = trace["strings"]
    strings = strings.get("strings", strings) if isinstance(strings, dict) else strings
    name = lambda i: strings[i] if isinstance(i, int) and 0 <= i < len(strings) else None  # noqa: E731
    phases = {}
    for tag in trace["events"]["tag"]:
        if tag & 0x1F == ALLOC:
            p = PHASES[tag >> PHASE_SHIFT] if (tag >> PHASE_SHIFT) < len(PHASES) else "other"
            phases[p] = phases.get(p, 0) + 1
    return {
        "iterations": len(trace.get("iterations", [])),
        "scope_names": sorted({name(s["name"]) for s in trace.get("scopes", [])} - {None}),
        "allocations_by_phase": phases,
    }


def check(run_name, a, base_env):
    args, extra_env, layers = RUNS[run_name]
    env = dict(base_env, **extra_env)
    out_trace = os.path.join(a.out, f"{run_name}.mtrace.json")
    ranks = 2 if run_name == "ddp" else 0
    launcher = [a.python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)] if ranks else [a.python]
    cmd = [a.collector, "trace", "-q", "--capture", "recorder", "-o", out_trace, "--"] + launcher + [HERE, "workload"] + args
    code, stdout, stderr = run(cmd, os.path.join(a.out, f"{run_name}.log"), env, a.timeout)
    r = {"run": run_name, "command": " ".join(cmd), "exit_code": code, "ok": False, "failures": []}
    results = sorted(parse_results(stdout), key=lambda x: x.get("rank") or 0)
    if code != 0 or len(results) != max(1, ranks) or not os.path.exists(out_trace):
        r["failures"].append(f"the traced run failed (exit {code}, {len(results)} RESULT lines); see {run_name}.log")
        return r
    result = results[0]
    r["program"] = result
    scode, sout, _ = run([a.collector, "summary", out_trace, "--json"], os.path.join(a.out, f"{run_name}.summary.log"), env, a.timeout)
    if scode != 0:
        r["failures"].append(f"`collector summary` failed; see {run_name}.summary.log")
        return r
    s = json.loads(sout)  # Summary's fields are flattened in (traceio/src/text.rs SummaryJson)
    r["trace"] = {k: s.get(k) for k in ("peak_allocated_bytes", "peak_reserved_bytes", "total_events", "dropped_events", "peak_layer", "duration_s")}
    r["trace"]["warnings"] = s.get("warnings") or []
    r["trace"]["snapshots"] = (s.get("reported") or {}).get("recorder.snapshots")
    facts = trace_facts(out_trace)
    r["trace"].update(facts)
    f = r["failures"]
    if ranks:
        result = dict(result, max_memory_allocated=max(x["max_memory_allocated"] for x in results), max_memory_reserved=max(x["max_memory_reserved"] for x in results))
        r["program"] = result
    if s["peak_allocated_bytes"] != result["max_memory_allocated"]:
        f.append(f"peak allocated {s['peak_allocated_bytes']} != max_memory_allocated() {result['max_memory_allocated']}")
    if s["peak_reserved_bytes"] != result["max_memory_reserved"]:
        f.append(f"peak reserved {s['peak_reserved_bytes']} != max_memory_reserved() {result['max_memory_reserved']}")
    infer = "--infer" in args
    if facts["iterations"] != (1 if infer else result["iters"]):
        f.append(f"{facts['iterations']} iterations in the trace for {result['iters']} {'batches (expected one iteration)' if infer else 'steps'}")
    missing = [l for l in layers if l not in facts["scope_names"]]
    if missing:
        f.append(f"layers missing from the trace's scopes: {missing}")
    for phase in ("forward",) if infer else ("forward", "backward", "optimizer"):
        if not facts["allocations_by_phase"].get(phase):
            f.append(f"no {phase} allocations")
    notes = r["trace"]["warnings"]
    # (A merged trace's notes start with their rank: `rank 0: capture: ...`.)
    if not notes or "capture: PyTorch's recorder (fallback: forced by --capture recorder)" not in notes[0]:
        f.append(f"the first note does not name the recorder: {notes[:1]}")
    if "capture: PyTorch's recorder" not in stderr:
        f.append("the collector's stderr does not say which capture ran")
    if "MEMORY_TRACER_RECORDER_CHUNK_ENTRIES" in extra_env and (r["trace"]["snapshots"] or 0) < 2:
        f.append(f"expected snapshots at iteration ends, the trace stitched {r['trace']['snapshots']}")
    if ranks:
        devices = s.get("devices") or []
        r["ranks"] = [{"rank": x["rank"], "max_memory_allocated": x["max_memory_allocated"], "max_memory_reserved": x["max_memory_reserved"]} for x in results]
        for want in results:
            got = next((d for d in devices if d.get("rank") == want["rank"]), None)
            if got is None:
                f.append(f"rank {want['rank']} is missing from the merged trace's devices {[d.get('device') for d in devices]}")
                continue
            r["ranks"][want["rank"]].update(trace_peak_allocated=got["peak_allocated_bytes"], trace_peak_reserved=got["peak_reserved_bytes"])
            if (got["peak_allocated_bytes"], got["peak_reserved_bytes"]) != (want["max_memory_allocated"], want["max_memory_reserved"]):
                f.append(f"rank {want['rank']}: trace peaks {got['peak_allocated_bytes']}/{got['peak_reserved_bytes']} != its counters {want['max_memory_allocated']}/{want['max_memory_reserved']}")
        if len(devices) != ranks:
            f.append(f"the merged trace has {len(devices)} devices for {ranks} ranks (the launcher must not be one)")
    r["ok"] = not f
    return r


def check_lines(r):
    """CHECK lines of one run: its peaks against its counters, and its other failures."""
    p, t = r.get("program") or {}, r.get("trace") or {}
    peaks = [("peak", "peak_allocated_bytes", "max_memory_allocated"), ("reserved", "peak_reserved_bytes", "max_memory_reserved")]
    for what, ours, theirs in peaks:
        if ours in t and theirs in p:
            check_line(f"{r['run']}.{what}", t[ours], f"={p[theirs]}", t[ours] == p[theirs], f"the trace's against {theirs}()")
    others = [f for f in r["failures"] if not f.startswith(("peak allocated", "peak reserved"))]
    check_line(f"{r['run']}.facts", len(others), "=0", not others, others[0] if others else "iterations, layers, phases, notes, snapshots, ranks")


def gpus(python, env):
    p = subprocess.run([python, "-c", "import torch; print(torch.cuda.device_count())"], capture_output=True, text=True, env=env)
    return int(p.stdout.strip() or 0) if p.returncode == 0 else 0


def table(rows):
    head = ("run", "max_memory_allocated", "trace peak alloc", "max_memory_reserved", "trace peak resv", "iters", "snapshots", "ok")
    lines = [head]
    for r in rows:
        p, t = r.get("program") or {}, r.get("trace") or {}
        lines.append((
            r["run"],
            str(p.get("max_memory_allocated", "-")),
            str(t.get("peak_allocated_bytes", "-")),
            str(p.get("max_memory_reserved", "-")),
            str(t.get("peak_reserved_bytes", "-")),
            f"{t.get('iterations', '-')}/{p.get('iters', '-')}",
            str(t.get("snapshots", "-")),
            "yes" if r["ok"] else "NO",
        ))
    widths = [max(len(l[i]) for l in lines) for i in range(len(head))]
    out = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(l, widths))) for l in lines]
    for r in rows:
        out += [f"{r['run']}: {x}" for x in r["failures"]]
    return "\n".join(out)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "workload":
        return workload(sys.argv[2:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--collector", default=os.environ.get("COLLECTOR", "collector"))
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--out", default="/tmp/mt-gpu/recorder")
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--only", choices=sorted(RUNS), action="append", help="run only these (repeatable)")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    names = a.only or [n for n in RUNS if n != "ddp" or gpus(a.python, env) >= 2]
    rows = [check(name, a, env) for name in names]
    for r in rows:
        check_lines(r)
    doc = {"ok": all(r["ok"] for r in rows), "runs": rows}
    with open(os.path.join(a.out, "recorder_fallback.json"), "w") as f:
        json.dump(doc, f, indent=1)
    print(json.dumps(doc, indent=1))
    log(table(rows))
    sys.exit(0 if doc["ok"] else 1)


if __name__ == "__main__":
    main()
