#!/usr/bin/env python3
"""Training workloads that check the Python capture (`collector trace -- python ...`) on a GPU.

    python tests/gpu/python_programs.py resnet50 --batch 8 --iters 3
    python tests/gpu/python_programs.py gpt2 --batch 4 --seq 512 --iters 3
    python tests/gpu/python_programs.py overhead --batch 32 --steps 24 --warmup 5 [--flat 200]

Each prints ONE line `RESULT {json}` on stdout (tests/gpu/python_verify.py reads it).

resnet50 / gpt2: torchvision's resnet50 (SGD momentum) or transformers' GPT2LMHeadModel from
`GPT2Config()` (GPT-2 small, random weights, AdamW, torch.autocast bfloat16) trained on CUDA
with synthetic data. RESULT has
  - max_memory_allocated: the whole-process peak. The hooks below reset PyTorch's peak
    counter, so a running max of torch.cuda.max_memory_allocated() is read before every reset
    and once at the end;
  - module_forward_peaks: for iteration 0, per leaf module (no children, keyed by its
    model.named_modules() path), the peak allocated during its forward: a forward pre-hook
    reads memory_allocated() and resets the peak, a forward hook reads max_memory_allocated()
    (the max over calls when a module runs several times, e.g. resnet's shared relu);
  - iteration_ms: cuda-synchronised wall time of each iteration.

overhead: torchvision resnet50 training steps of three kinds, interleaved in rotated orders
(every permutation of the kinds in turn, so each kind takes each slot equally often):
untraced (memory_tracer.pause()), traced (memory_tracer.resume()) and pytorch_recorder
(torch.cuda.memory._record_memory_history on around the step while our capture is paused).
Each step is timed with torch.cuda.synchronize() + time.perf_counter(); RESULT has the medians,
the overheads vs untraced in % and every step time. Without the collector (memory_tracer not
importable, or no capture running) only untraced and pytorch_recorder run, and RESULT says so.
--flat N then runs N consecutive traced steps and reports their times and the medians of the
first and last 20, to show the traced step time stays flat as the trace grows.
"""

import argparse
import itertools
import json
import os
import random
import statistics
import sys
import time

GPT2_MAX_POSITIONS = 1024  # GPT2Config().n_positions


def int_at_least(minimum, words):
    """An argparse type: a whole number of at least `minimum`."""

    def parse(text):
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"must be {words}, got {v}")
        return v

    return parse


positive_int = int_at_least(1, "at least 1")
non_negative_int = int_at_least(0, "0 or more")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="GPU workloads for the Python capture checks (see the module docstring).")
    sub = p.add_subparsers(dest="workload", metavar="WORKLOAD", required=True)
    r = sub.add_parser("resnet50", help="torchvision resnet50, SGD momentum")
    r.add_argument("--batch", type=positive_int, default=8)
    r.add_argument("--iters", type=positive_int, default=3)
    g = sub.add_parser("gpt2", help="GPT-2 small (random weights), AdamW, autocast bfloat16")
    g.add_argument("--batch", type=positive_int, default=4)
    g.add_argument("--seq", type=positive_int, default=512, help=f"sequence length, at most {GPT2_MAX_POSITIONS}")
    g.add_argument("--iters", type=positive_int, default=3)
    l = sub.add_parser("llama", help="a Llama-architecture LM (transformers, random weights), AdamW, autocast bfloat16")
    l.add_argument("--batch", type=positive_int, default=4)
    l.add_argument("--seq", type=positive_int, default=512)
    l.add_argument("--iters", type=positive_int, default=3)
    l.add_argument("--checkpointing", action="store_true", help="gradient checkpointing (the layers' forward runs again in backward)")
    o = sub.add_parser("overhead", help="traced vs untraced vs PyTorch's recorder, resnet50 steps")
    o.add_argument("--batch", type=positive_int, default=32)
    o.add_argument("--steps", type=positive_int, default=24, help="measured steps per kind")
    o.add_argument("--warmup", type=non_negative_int, default=5, help="warm-up rounds (one step of each kind each), not measured")
    o.add_argument("--flat", type=non_negative_int, default=0, help="then N consecutive traced steps (0: none)")
    o.add_argument("--pt-max-entries", type=positive_int, default=1_000_000, help="max_entries of PyTorch's recorder")
    for sp in (r, g, l, o):
        sp.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.workload == "gpt2" and a.seq > GPT2_MAX_POSITIONS:
        g.error(f"--seq {a.seq} exceeds GPT-2's {GPT2_MAX_POSITIONS} positions")
    return a


def setup(seed):
    import torch

    if not torch.cuda.is_available():
        sys.exit("python_programs.py: error: CUDA is not available (these workloads train on the GPU)")
    torch.backends.cudnn.benchmark = False
    random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    return torch


def emit(result):
    print("RESULT " + json.dumps(result, sort_keys=True), flush=True)


class RunningPeak:
    """The whole-process peak across reset_peak_memory_stats() calls."""

    def __init__(self, torch):
        self.torch = torch
        self.value = 0

    def fold(self):
        self.value = max(self.value, self.torch.cuda.max_memory_allocated())
        return self.value

    def reset(self):
        self.fold()
        self.torch.cuda.reset_peak_memory_stats()


class LeafForwardPeaks:
    """Per leaf module: the peak allocated during its forward (max over its calls)."""

    def __init__(self, torch, model, peak):
        self.peaks, self.starts, self.calls, self.handles = {}, {}, {}, []
        for name, m in model.named_modules():
            if name and next(m.children(), None) is None:
                self.handles.append(m.register_forward_pre_hook(self._pre(torch, name, peak)))
                self.handles.append(m.register_forward_hook(self._post(torch, name)))

    # A forward run again in backward (gradient checkpointing) is not the forward measured.
    def _pre(self, torch, name, peak):
        def hook(module, args):
            if torch._C._current_graph_task_id() != -1:
                return
            self.starts[name] = torch.cuda.memory_allocated()
            peak.reset()  # folds the current max into the running peak first

        return hook

    def _post(self, torch, name):
        def hook(module, args, output):
            if torch._C._current_graph_task_id() != -1:
                return
            v = torch.cuda.max_memory_allocated()
            self.peaks[name] = max(self.peaks.get(name, 0), v)
            self.calls[name] = self.calls.get(name, 0) + 1

        return hook

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles.clear()


def train(torch, model, step, iters, extra):
    """Runs `iters` steps, hooks on the leaf modules during iteration 0; prints RESULT."""
    peak = RunningPeak(torch)
    leaves = LeafForwardPeaks(torch, model, peak)
    iteration_ms = []
    for it in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        iteration_ms.append((time.perf_counter() - t0) * 1e3)
        if it == 0:
            leaves.remove()
    torch.cuda.synchronize()
    result = {
        "max_memory_allocated": peak.fold(),
        "module_forward_peaks": leaves.peaks,
        "module_forward_calls": leaves.calls,
        "leaf_modules_with_hooks": sum(1 for n, m in model.named_modules() if n and next(m.children(), None) is None),
        "iteration_ms": iteration_ms,
        "iters": iters,
        "torch_version": torch.__version__,
        "device_name": torch.cuda.get_device_name(),
    }
    result.update(extra)
    emit(result)


def resnet50_workload(a):
    torch = setup(a.seed)
    import torch.nn.functional as F
    import torchvision

    dev = torch.device("cuda")
    model = torchvision.models.resnet50(weights=None).to(dev).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(a.batch, 3, 224, 224, device=dev)
    y = torch.randint(0, 1000, (a.batch,), device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    train(torch, model, step, a.iters, {"workload": "resnet50", "batch": a.batch})


def train_causal_lm(torch, model, vocab_size, a, extra):
    """Trains a Hugging Face causal LM on random tokens (AdamW, bf16 autocast, which needs no
    GradScaler) through `train`."""
    dev = torch.device("cuda")
    model = model.to(dev).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, vocab_size, (a.batch, a.seq), device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        opt.step()

    train(torch, model, step, a.iters, {"batch": a.batch, "seq": a.seq, **extra})


def gpt2_workload(a):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    torch = setup(a.seed)
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config()  # GPT-2 small: 12 layers, 768 wide, 50257 tokens
    model = GPT2LMHeadModel(cfg)
    extra = {"workload": "gpt2", "attn_implementation": getattr(model.config, "_attn_implementation", None)}
    train_causal_lm(torch, model, cfg.vocab_size, a, extra)


def llama_workload(a):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    torch = setup(a.seed)
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=512, intermediate_size=1376, num_hidden_layers=6, num_attention_heads=8,
                      num_key_value_heads=4, vocab_size=32000, max_position_embeddings=1024, attn_implementation="sdpa")
    model = LlamaForCausalLM(cfg)
    if a.checkpointing:
        model.gradient_checkpointing_enable()
    train_causal_lm(torch, model, cfg.vocab_size, a, {"workload": "llama" + ("_checkpointing" if a.checkpointing else "")})


def median(xs):
    return statistics.median(xs) if xs else None


def overhead_workload(a):
    torch = setup(a.seed)
    import torch.nn.functional as F
    import torchvision

    try:
        import memory_tracer as mt
    except ImportError as e:
        mt, note = None, f"memory_tracer cannot be imported ({e}); run under `collector trace -- python` for the traced kind"
    else:
        note = None
        if not mt.is_tracing():
            mt, note = None, "memory_tracer imported but no capture is running (not under `collector trace`); traced kind skipped"
    if mt is not None:
        mt.pause()  # untraced unless a traced step resumes it

    dev = torch.device("cuda")
    model = torchvision.models.resnet50(weights=None).to(dev).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(a.batch, 3, 224, 224, device=dev)
    y = torch.randint(0, 1000, (a.batch,), device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    def timed_step(kind):
        # Switching the recorders on and off happens outside the timed region.
        if kind == "traced":
            mt.resume()
        elif kind == "pytorch_recorder":
            torch.cuda.memory._record_memory_history(enabled="all", stacks="python", max_entries=a.pt_max_entries, clear_history=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        if kind == "traced":
            mt.pause()
        elif kind == "pytorch_recorder":
            torch.cuda.memory._record_memory_history(enabled=None)
        return ms

    kinds = ["untraced", "traced", "pytorch_recorder"] if mt is not None else ["untraced", "pytorch_recorder"]
    orders = list(itertools.permutations(kinds))  # ABC ACB BAC ...: each kind in each slot alike
    for r in range(a.warmup):
        for kind in orders[r % len(orders)]:
            timed_step(kind)
    step_ms = {k: [] for k in kinds}
    sequence = []
    for r in range(a.steps):
        order = orders[r % len(orders)]
        sequence.append("".join(k[0].upper() for k in order))
        for kind in order:
            step_ms[kind].append(timed_step(kind))
    medians = {k: median(v) for k, v in step_ms.items()}
    base = medians["untraced"]
    overhead_pct = {k: (medians[k] / base - 1.0) * 100.0 for k in kinds if k != "untraced"}

    flat = None
    if a.flat > 0 and mt is not None:
        mt.resume()
        flat_ms = []
        for _ in range(a.flat):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            flat_ms.append((time.perf_counter() - t0) * 1e3)
        mt.pause()
        w = min(20, max(1, a.flat // 2))
        first, last = median(flat_ms[:w]), median(flat_ms[-w:])
        flat = {"steps": a.flat, "window": w, "median_first_ms": first, "median_last_ms": last, "last_vs_first_pct": (last / first - 1.0) * 100.0, "step_ms": flat_ms}
    elif a.flat > 0:
        flat = {"skipped": "no capture running"}

    emit({
        "workload": "overhead",
        "batch": a.batch,
        "steps_per_kind": a.steps,
        "warmup_rounds": a.warmup,
        "memory_tracer": {"available": mt is not None, "note": note},
        "kinds": kinds,
        "orders": sequence,
        "median_ms": medians,
        "overhead_pct": overhead_pct,
        "step_ms": step_ms,
        "flat": flat,
        "pytorch_recorder": {"enabled": "all", "stacks": "python", "max_entries": a.pt_max_entries},
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "torch_version": torch.__version__,
        "device_name": torch.cuda.get_device_name(),
    })


def main(argv=None):
    a = parse_args(argv)
    {"resnet50": resnet50_workload, "gpt2": gpt2_workload, "llama": llama_workload, "overhead": overhead_workload}[a.workload](a)


if __name__ == "__main__":
    main()
