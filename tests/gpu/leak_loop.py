"""Snapshots of short forward-only loops, leaking and clean (issue 32, part 2).

    python tests/gpu/leak_loop.py OUT_DIR

Each loop runs 6 iterations of ~8 allocations (`x = randn(256, 1024)`, an MLP
1024 -> 4096 -> 1024, `pow(2).mean()`) inside a function; the leaking one keeps each
iteration's `loss` (and so its graph) in a list. Recorded without annotations or optimizer
steps; the snapshot is taken after the function returns, so it ends with the function's frees.
Writes OUT_DIR/leak_loop_{leaky,clean}.pickle and prints `RESULT {json}` with
memory_allocated() after each iteration.
"""
import json
import os
import pickle
import sys

import torch
import torch.nn as nn

out = sys.argv[1]
torch.manual_seed(0)
mlp = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).cuda()


def loop(keep, after):
    kept = []
    for _ in range(6):
        x = torch.randn(256, 1024, device="cuda")
        loss = mlp(x).pow(2).mean()
        if keep:
            kept.append(loss)
        torch.cuda.synchronize()
        after.append(torch.cuda.memory_allocated())
    return len(kept)


for name, keep in (("leaky", True), ("clean", False)):
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    after = []
    torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")
    loop(keep, after)
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    with open(os.path.join(out, f"leak_loop_{name}.pickle"), "wb") as f:
        pickle.dump(snap, f)
    growth = [b - a for a, b in zip(after, after[1:])]
    print("RESULT " + json.dumps({"name": name, "allocated_after_iteration": after, "growth": growth,
                                  "max_memory_allocated": torch.cuda.max_memory_allocated(),
                                  "end_allocated": torch.cuda.memory_allocated()}), flush=True)
