"""Memory snapshots of programs that allocate from private pools (issue 35), with what the
allocator itself reports, for checking the importer's pools against PyTorch.

    python tests/gpu/graph_snapshots.py graph|compiled|mempool OUT_DIR

- graph: an MLP's training step (forward, backward, SGD) captured in a `torch.cuda.graph`
  (its own private pool) after a warm-up on a side stream, then replayed 5 times.
- compiled: `torch.compile(mode="reduce-overhead")` (CUDA graphs through Inductor) on the
  same MLP, 6 training steps.
- mempool: allocations made inside `torch.cuda.use_mem_pool(torch.cuda.MemPool())`, some
  freed, some kept, beside default-pool ones.

Recording starts after `empty_cache()` and `reset_peak_memory_stats()`. Writes
OUT_DIR/<mode>.pickle and prints `RESULT {json}`: max_memory_allocated/reserved,
memory_allocated/reserved at the end, and per pool id the allocated and reserved bytes the
allocator's own snapshot gives at the end (its segments' `allocated_size` and `total_size`
by `segment_pool_id`).
"""
import json
import pickle
import sys

import torch
import torch.nn as nn

mode, out = sys.argv[1], sys.argv[2]
dev = torch.device("cuda")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024), nn.GELU(), nn.Linear(1024, 10)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(256, 1024, device=dev)
y = torch.randint(0, 10, (256,), device=dev)
loss_fn = nn.CrossEntropyLoss()

torch.cuda.synchronize()
torch.cuda.empty_cache()
torch.cuda.reset_peak_memory_stats()
torch.cuda.memory._record_memory_history(max_entries=200000)


def step():
    opt.zero_grad(set_to_none=False)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    return loss


if mode == "graph":
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_loss = step()
    for _ in range(5):
        g.replay()
elif mode == "compiled":
    compiled = torch.compile(lambda x, y: loss_fn(model(x), y), mode="reduce-overhead")
    for _ in range(6):
        torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad()
        loss = compiled(x, y)
        loss.backward()
        opt.step()
elif mode == "mempool":
    pool = torch.cuda.MemPool()
    kept = []
    with torch.cuda.use_mem_pool(pool):
        a = torch.empty(3 << 20, device=dev)
        b = torch.empty(1000, device=dev)
        kept.append(torch.empty(5 << 20, device=dev))
        del a
    c = torch.empty(2 << 20, device=dev)
    step()
    del b
else:
    raise SystemExit(f"unknown mode {mode}")
torch.cuda.synchronize()

snap = torch.cuda.memory._snapshot()
torch.cuda.memory._record_memory_history(enabled=None)
with open(f"{out}/{mode}.pickle", "wb") as f:
    pickle.dump(snap, f)
pools = {}
for seg in snap["segments"]:
    key = ",".join(str(v) for v in seg.get("segment_pool_id", (0, 0)))
    p = pools.setdefault(key, {"allocated": 0, "reserved": 0, "segments": 0})
    p["allocated"] += seg["allocated_size"]
    p["reserved"] += seg["total_size"]
    p["segments"] += 1
result = {
    "mode": mode,
    "torch": torch.__version__,
    "max_memory_allocated": torch.cuda.max_memory_allocated(),
    "max_memory_reserved": torch.cuda.max_memory_reserved(),
    "memory_allocated": torch.cuda.memory_allocated(),
    "memory_reserved": torch.cuda.memory_reserved(),
    "pools_at_end": pools,
    "entries": len(snap["device_traces"][0]),
}
print("RESULT " + json.dumps(result), flush=True)
