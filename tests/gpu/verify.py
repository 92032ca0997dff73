#!/usr/bin/env python3
"""GPU verification of native capture (issue 3), run on a machine with an NVIDIA GPU.

    python3 tests/gpu/verify.py --collector target/release/collector --out /tmp/gpu-verify

Needs PyTorch 2.11 (the collector's libtorch; LD_LIBRARY_PATH must reach torch/lib and the
nvidia libraries, see README). It checks, on cuda:0:

1. ResNet-50, batch 8, 224x224, SGD momentum training traced by the collector: the peak the
   trace reports equals torch.cuda.max_memory_allocated() read in the same process.
2. The same training loop in Python (torchvision's resnet50 when installed, else the same
   architecture defined here) gives a peak within 5 % of the collector's.
3. Overhead: ResNet-50 batch 32 training steps traced vs untraced, interleaved, medians of 20.
4. Graph profile (issue 4): `collector sweep` of ResNet-152 training over batch sizes
   4..64 plus one that cannot fit; every peak equals torch.cuda.max_memory_allocated() of its
   run, the impossible batch is reported as out of memory, and `collector analyze` of a
   sweep trace gives a breakdown that adds up to the allocated total at every rank. A
   torch.profiler Chrome trace of torchvision's resnet50 is analysed as well.

5. `collector serve` (issue 6) on the GPU: a ResNet-50 trace through the API whose peaks equal
   torch.cuda.max_memory_allocated()/max_memory_reserved() of its run; a live event stream
   whose peak equals the stored trace's; a CUDA out-of-memory job that answers 422 and leaves
   the server healthy, holding no GPU memory, and able to run the next job; concurrent jobs
   serialised on the device; 503 for a device the machine lacks.

`--checks capture,profile,serve` picks the groups (default: capture,profile).

Writes results.json (and the traces) into --out, prints a CHECK line per comparison
(tests/gpu/checks.py) and exits non-zero when a check fails.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

from checks import check, pct


def judge(failures, name, figure, bound, ok, what):
    """One CHECK line; `what` joins the failures when it missed."""
    if not check(name, figure, bound, ok):
        failures.append(what)


def run(cmd):
    print("+", " ".join(cmd), flush=True)
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    sys.stdout.write(p.stdout[-4000:])
    sys.stderr.write(p.stderr[-4000:])
    if p.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed with {p.returncode}")
    run.last_stderr = p.stderr
    return p.stdout, time.time() - t0


def python_resnet50_peak(batch, iterations):
    import torch
    import torch.nn.functional as F

    try:
        import torchvision

        model_fn, source = torchvision.models.resnet50, "torchvision"
    except ImportError:
        model_fn, source = local_resnet50, "local definition (torchvision not installed)"
    torch.manual_seed(0)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    model = model_fn().cuda().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(batch, 3, 224, 224, device="cuda")
    y = torch.randint(1000, (batch,), device="cuda")
    for _ in range(iterations):
        out = model(x)
        loss = F.cross_entropy(out, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del out, loss
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del model, opt, x, y
    torch.cuda.empty_cache()
    return peak, source


def local_resnet50():
    import torch.nn as nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, planes, stride):
            super().__init__()
            cout = planes * 4
            self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.conv3 = nn.Conv2d(planes, cout, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            idt = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            return self.relu(out + idt)

    layers, cin = [], 64
    for i, (n, planes) in enumerate(zip([3, 4, 6, 3], [64, 128, 256, 512])):
        blocks = []
        for b in range(n):
            blocks.append(Bottleneck(cin, planes, 2 if b == 0 and i > 0 else 1))
            cin = planes * 4
        layers.append(nn.Sequential(*blocks))
    return nn.Sequential(
        nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1), *layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000),
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--collector", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--overhead-steps", type=int, default=20)
    ap.add_argument("--checks", default="capture,profile")
    ap.add_argument("--sweep-batches", default="4,8,16,32,64,1024")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    results = {}
    failures = []
    checks = a.checks.split(",")
    if "capture" in checks:
        capture_checks(a, results, failures)
    if "profile" in checks:
        profile_checks(a, results, failures)
    if "serve" in checks:
        serve_checks(a, results, failures)
    results["failures"] = failures
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    print(json.dumps({k: v for k, v in results.items()}, indent=2)[:6000])
    if failures:
        raise SystemExit("FAILED: " + "; ".join(failures))


def profile_checks(a, results, failures):
    import csv

    sweep_dir = os.path.join(a.out, "sweep")
    _, secs = run([a.collector, "sweep", "--model", "resnet152", "--mode", "train", "--device", "cuda:0",
                   "--batch-sizes", a.sweep_batches, "-o", sweep_dir])
    with open(os.path.join(sweep_dir, "sweep.json")) as f:
        sweep = json.load(f)
    rows = []
    for r in sweep["runs"]:
        rows.append({k: r.get(k) for k in ("batch_size", "status", "peak_allocated_bytes", "peak_reserved_bytes",
                                            "pytorch_max_allocated_bytes", "median_iteration_s")})
        if r["status"] == "ok":
            peak, torch_peak = r["peak_allocated_bytes"], r["pytorch_max_allocated_bytes"]
            judge(failures, f"sweep.b{r['batch_size']}.peak", peak, f"={torch_peak}", peak == torch_peak,
                  f"sweep batch {r['batch_size']}: peak {peak} != torch {torch_peak}")
    results["sweep_resnet152"] = {"seconds": secs, "runs": rows}
    biggest = max(int(b) for b in a.sweep_batches.split(","))
    status = next((r["status"] for r in sweep["runs"] if r["batch_size"] == biggest), "not_run")
    judge(failures, f"sweep.b{biggest}.status", status, "=out_of_memory", status == "out_of_memory",
          f"sweep: batch {biggest} was expected to run out of memory")

    ok = [r for r in sweep["runs"] if r["status"] == "ok"]
    for r in (ok[0], ok[-1]):
        out_dir = os.path.join(a.out, f"analyze_bs{r['batch_size']}")
        _, asecs = run([a.collector, "analyze", os.path.join(sweep_dir, r["trace_file"]), "-o", out_dir])
        check_profile_dir(out_dir, f"resnet152 bs{r['batch_size']}", failures, results, asecs)

    # A torch.profiler Chrome trace with memory events, analysed the same way.
    chrome = os.path.join(a.out, "resnet50_profiler.json")
    python_profiler_trace(chrome)
    out_dir = os.path.join(a.out, "analyze_chrome")
    _, asecs = run([a.collector, "analyze", chrome, "-o", out_dir])
    check_profile_dir(out_dir, "chrome resnet50", failures, results, asecs, classified=False)


def check_profile_dir(out_dir, name, failures, results, seconds, classified=True):
    import csv

    with open(os.path.join(out_dir, "profiler_stats_profile.json")) as f:
        prof = json.load(f)
    info = {"seconds": seconds, "nodes": len(prof["nodes"]), "activations": len(prof["activations"]),
            "peak_rank": prof["peak_rank"], "peak_bytes": prof["peak_bytes"], "sections": prof["sections"],
            "iterations": prof["iterations"], "warnings": prof["warnings"], "not_derivable": prof["not_derivable"]}
    if classified:
        with open(os.path.join(out_dir, "profiler_stats_memory_breakdown.csv")) as f:
            rows = list(csv.DictReader(f))
        bad = [r["rank"] for r in rows if sum(int(r[k]) for k in ("weights", "gradients", "activations", "optimizer_state", "other")) != int(r["total_allocated"])]
        judge(failures, f"analyze.{name}.breakdown", f"{len(rows) - len(bad)}/{len(rows)}", f"={len(rows)}/{len(rows)}", not bad,
              f"{name}: breakdown does not add up at {len(bad)} ranks (first {bad[:5]})")
        peak_row = rows[prof["peak_rank"]]
        info["breakdown_at_peak"] = peak_row
        info["max_total_allocated"] = max(int(r["total_allocated"]) for r in rows)
    results[f"profile {name}"] = info


def python_profiler_trace(path):
    import torch
    import torch.nn.functional as F
    import torchvision

    model = torchvision.models.resnet50().cuda().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(8, 3, 224, 224, device="cuda")
    y = torch.randint(1000, (8,), device="cuda")
    # One warm-up step, then three recorded ones (ProfilerStep#1..3), written when the cycle ends.
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
                                profile_memory=True, record_shapes=True, with_modules=True,
                                schedule=torch.profiler.schedule(wait=0, warmup=1, active=3, repeat=1),
                                on_trace_ready=lambda p: p.export_chrome_trace(path)) as prof:
        for _ in range(4):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            prof.step()


def capture_checks(a, results, failures):

    trace_path = os.path.join(a.out, "resnet50_b8.mtrace.json")
    _, secs = run([a.collector, "trace", "--model", "resnet50", "--batch-size", "8", "--device", "cuda:0",
                   "--optimizer", "sgd", "--iterations", str(a.iterations), "-o", trace_path, "-q"])
    m = re.search(r"in memory: ([0-9.]+) B per memory event", run.last_stderr)
    bytes_per_event = float(m.group(1)) if m else None
    summary_out, _ = run([a.collector, "summary", "--json", trace_path])
    summary = {"summary": json.loads(summary_out)}
    with open(trace_path) as f:
        meta = json.load(f)["trace"]["meta"]
    reported = meta["reported"]
    peak = summary["summary"]["peak_allocated_bytes"]
    results["resnet50_b8"] = {
        "collector_peak_allocated": peak,
        "collector_peak_reserved": summary["summary"]["peak_reserved_bytes"],
        "torch_max_memory_allocated_same_process": reported.get("cuda.max_memory_allocated"),
        "torch_max_memory_reserved_same_process": reported.get("cuda.max_memory_reserved"),
        "collector_final_allocated": summary["summary"]["final_allocated_bytes"],
        "torch_memory_allocated_at_end": reported.get("cuda.memory_allocated"),
        "bytes_per_memory_event_in_memory": bytes_per_event,
        "driver_used_peak_bytes": summary["summary"].get("driver_used_peak_bytes"),
        "events": summary["summary"]["total_events"],
        "ops": summary["summary"]["total_ops"],
        "trace_seconds": secs,
        "trace_file_bytes": os.path.getsize(trace_path),
        "device": meta.get("device_name"),
    }
    final, torch_final = summary["summary"]["final_allocated_bytes"], reported.get("cuda.memory_allocated")
    judge(failures, "resnet50_b8.final_allocated", final, f"={torch_final}", final == torch_final,
          "final allocated differs from torch.cuda.memory_allocated at the end")
    torch_peak = reported.get("cuda.max_memory_allocated")
    judge(failures, "resnet50_b8.peak", peak, f"={torch_peak}", peak == torch_peak, f"peak {peak} != torch.cuda.max_memory_allocated {torch_peak}")

    py_peak, source = python_resnet50_peak(8, a.iterations)
    diff = (peak - py_peak) / py_peak * 100
    results["resnet50_b8"].update({"python_peak_allocated": py_peak, "python_model": source, "diff_percent": diff})
    judge(failures, "resnet50_b8.python_peak", pct(diff), "abs<=5%", abs(diff) <= 5,
          f"collector peak {peak} differs from Python's {py_peak} by {diff:.2f} %")

    # Full capture (ops, tensors, memory), ops without tensors, memory only; and a larger batch.
    for name, batch, extra in (("overhead_full_b32", 32, []), ("overhead_no_tensors_b32", 32, ["--no-tensors"]),
                               ("overhead_memory_only_b32", 32, ["--memory-only"]), ("overhead_full_b128", 128, [])):
        cmd = [a.collector, "overhead", "--model", "resnet50", "--batch-size", str(batch), "--device", "cuda:0",
               "--steps", str(a.overhead_steps)] + extra
        out, _ = run(cmd)
        results[name] = json.loads(out)

    # Mixed precision and a transformer on the GPU.
    amp_path = os.path.join(a.out, "gpt_amp.mtrace.json")
    _, secs = run([a.collector, "trace", "--model", "gpt", "--layers", "4", "--input-shape", "8,256", "--device", "cuda:0",
                   "--optimizer", "adamw", "--amp", "--iterations", "3", "-o", amp_path, "-q"])
    amp_summary = json.loads(run([a.collector, "summary", "--json", amp_path])[0])
    with open(amp_path) as f:
        amp_meta = json.load(f)["trace"]["meta"]
    results["gpt_amp"] = {"peak": amp_summary["peak_allocated_bytes"], "torch_peak": amp_meta["reported"].get("cuda.max_memory_allocated"), "seconds": secs}
    judge(failures, "gpt_amp.peak", results["gpt_amp"]["peak"], f"={results['gpt_amp']['torch_peak']}",
          results["gpt_amp"]["peak"] == results["gpt_amp"]["torch_peak"], "gpt --amp peak differs from torch.cuda.max_memory_allocated")

    # Out of memory is an error with the allocator's message, not a crash.
    p = subprocess.run([a.collector, "trace", "--model", "resnet152", "--input-shape", "2048,3,224,224", "--device", "cuda:0",
                        "--iterations", "1", "-o", os.path.join(a.out, "oom.mtrace.json"), "-q"], capture_output=True, text=True)
    results["oom"] = {"exit_code": p.returncode, "stderr_tail": p.stderr[-600:]}
    clean = p.returncode != 0 and "out of memory" in p.stderr.lower() and "panicked" not in p.stderr
    judge(failures, "oom.error", f"rc={p.returncode}", "allocator_message_no_panic", clean,
          "an out-of-memory run did not fail cleanly with the allocator's message")


def serve_checks(a, results, failures):
    import shutil
    import socket
    import threading
    import urllib.error
    import urllib.request

    data = os.path.join(a.out, "serve-data")
    shutil.rmtree(data, ignore_errors=True)
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    token = "gpu-token"
    # Input cap raised so a batch that cannot fit on a 141 GB H200 gets through to the device.
    proc = subprocess.Popen([a.collector, "serve", "--port", str(port), "--data-dir", data, "--token", token, "--max-input-elements", "1000000000"],
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        print("[serve]", line.rstrip(), flush=True)
        if line.startswith("Memory Tracer is serving"):
            break
    threading.Thread(target=lambda: [print("[serve]", l.rstrip(), flush=True) for l in proc.stderr], daemon=True).start()
    base = f"http://127.0.0.1:{port}"
    r = results.setdefault("serve", {})

    def call(method, path, body=None, timeout=900):
        req = urllib.request.Request(base + path, method=method, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def jcall(method, path, body=None):
        code, raw = call(method, path, body)
        return code, json.loads(raw)

    def expect(name, figure, bound, cond, what):
        judge(failures, "serve." + name, figure, bound, cond, "serve: " + what)

    try:
        code, h = jcall("GET", "/api/health")
        r["health"] = h
        expect("health", f"{code}:{h.get('device')}", "=200:cuda:0", code == 200 and h["device"] == "cuda:0" and h["cuda_available"], f"health says {h}")

        t0 = time.time()
        code, t = jcall("POST", "/api/trace/memory", {"model_name": "resnet50", "batch_size": 32, "max_events": 5000000, "iterations": 3})
        r["resnet50_seconds"] = time.time() - t0
        expect("resnet50.status", code, "=200", code == 200, f"resnet50 trace answered {code}: {str(t)[:300]}")
        if code == 200:
            code, raw = call("GET", f"/api/trace/{t['trace_id']}")
            rep = json.loads(raw)["trace"]["meta"]["reported"]
            r["resnet50"] = {"api_peak_allocated_bytes": t["peak_allocated_bytes"], "torch_max_memory_allocated": rep["cuda.max_memory_allocated"],
                             "api_peak_reserved_bytes": t["peak_reserved_bytes"], "torch_max_memory_reserved": rep["cuda.max_memory_reserved"],
                             "total_events": t["total_events"], "total_layers": t["total_layers"], "tracing_time_ms": t["tracing_time_ms"],
                             "peak_allocated_mb": t["peak_allocated_mb"], "layers": len(t["layer_stats"])}
            expect("resnet50.peak", t["peak_allocated_bytes"], f"={rep['cuda.max_memory_allocated']}",
                   t["peak_allocated_bytes"] == rep["cuda.max_memory_allocated"], "API peak allocated != torch.cuda.max_memory_allocated")
            expect("resnet50.reserved", t["peak_reserved_bytes"], f"={rep['cuda.max_memory_reserved']}",
                   t["peak_reserved_bytes"] == rep["cuda.max_memory_reserved"], "API peak reserved != torch.cuda.max_memory_reserved")

        # Live events of a running GPU trace.
        code, acc = jcall("POST", "/api/trace/memory?wait=false", {"model_name": "resnet18", "batch_size": 16, "iterations": 4, "max_events": 5000000})
        expect("live.status", code, "=202", code == 202, f"wait=false answered {code}")
        req = urllib.request.Request(base + acc["events_url"], headers={"Authorization": f"Bearer {token}"})
        events, name = [], None
        with urllib.request.urlopen(req, timeout=900) as resp:
            for raw in resp:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    events.append((name, json.loads(line[6:])))
                    if name in ("done", "failed"):
                        break
        names = [n for n, _ in events]
        points = [p for n, v in events if n == "memory" for p in v["points"]]
        done = events[-1][1].get("trace", {})
        r["live"] = {"events": len(events), "memory_batches": names.count("memory"), "points": len(points),
                     "live_peak": max((p[1] for p in points), default=0), "live_reserved_peak": max((p[2] for p in points), default=0),
                     "trace_peak": done.get("peak_allocated_bytes"), "trace_reserved_peak": done.get("peak_reserved_bytes")}
        expect("live.end", names[-1], "=done", names[-1] == "done", f"live stream ended with {names[-1]}")
        expect("live.memory_batches", names.count("memory"), ">=4_before_the_end",
               names.count("memory") >= 4 and names.index("memory") < len(names) - 2, "memory arrived only at the end")
        expect("live.peak", r["live"]["live_peak"], f"={r['live']['trace_peak']}", r["live"]["live_peak"] == r["live"]["trace_peak"],
               "live peak != stored trace peak")
        expect("live.reserved", r["live"]["live_reserved_peak"], f"={r['live']['trace_reserved_peak']}",
               r["live"]["live_reserved_peak"] == r["live"]["trace_reserved_peak"], "live reserved peak != stored trace's")

        # CUDA out of memory: 422, then the server is healthy, holds no GPU memory, runs the next job.
        t0 = time.time()
        code, e = jcall("POST", "/api/trace/memory", {"model_name": "resnet50", "batch_size": 3072, "iterations": 1, "max_events": 100000})
        r["oom"] = {"status": code, "detail": e.get("detail", "")[:400], "seconds": time.time() - t0}
        expect("oom.status", code, "=422", code == 422 and "out of memory" in e.get("detail", "").lower(), f"out of memory answered {code}: {str(e)[:300]}")
        code, h = jcall("GET", "/api/health")
        expect("oom.health", f"{code}:{h.get('status')}", "=200:healthy", code == 200 and h["status"] == "healthy" and h["jobs_running"] == 0,
               f"health after OOM: {h}")
        smi = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"], capture_output=True, text=True).stdout
        r["gpu_processes_after_oom"] = smi.strip()
        expect("oom.server_gpu_memory", "held" if str(proc.pid) in smi.split() else "none", "=none", str(proc.pid) not in smi.split(),
               f"the server holds GPU memory: {smi}")
        code, t = jcall("POST", "/api/trace/memory", {"model_name": "resnet18", "batch_size": 8})
        expect("oom.next_job", code, "=200", code == 200, f"the job after OOM answered {code}")

        # Concurrent requests on one device: all answered, unique ids, one at a time.
        out = []
        def one():
            out.append(jcall("POST", "/api/trace/memory", {"model_name": "resnet18", "batch_size": 8, "iterations": 2}))
        t0 = time.time()
        ths = [threading.Thread(target=one) for _ in range(4)]
        [th.start() for th in ths]
        [th.join() for th in ths]
        ids = {v["trace_id"] for c, v in out if c == 200}
        r["concurrent"] = {"requests": 4, "ok": sum(c == 200 for c, _ in out), "unique_ids": len(ids), "seconds": time.time() - t0}
        expect("concurrent.ids", len(ids), "=4", len(ids) == 4, f"concurrent: {r['concurrent']}")

        code, e = jcall("POST", "/api/trace/memory", {"model_name": "resnet18", "device": "cuda:7"})
        expect("missing_device.status", code, "=503", code == 503, f"cuda:7 answered {code}")
        code, lst = jcall("GET", "/api/trace/list")
        r["stored"] = lst["count"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    # Restart: the traces are still there.
    proc = subprocess.Popen([a.collector, "serve", "--port", str(port), "--data-dir", data, "--token", token], stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if line.startswith("Memory Tracer is serving"):
            break
    try:
        code, lst2 = jcall("GET", "/api/trace/list")
        expect("restart.traces", lst2["count"], f"={r.get('stored')}", lst2["count"] == r.get("stored"),
               f"after a restart {lst2['count']} traces, before {r.get('stored')}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)

if __name__ == "__main__":
    main()
