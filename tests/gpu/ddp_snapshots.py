"""Per-rank memory snapshots and counters of a 2-GPU DDP or FSDP2 job (3 AdamW steps, NCCL),
for checking the snapshot importer's allocator replay and `collector trace -- torchrun`
against PyTorch's own counters, rank by rank.

    torchrun --nproc-per-node 2 tests/gpu/ddp_snapshots.py ddp|fsdp2 OUT_DIR [--no-snapshot]
        [--width D] [--blocks N] [--tokens T] [--prefix NAME]

Recorded as issue 32 describes: the model (N blocks of LayerNorm -> Linear D->4D -> GELU ->
Linear 4D->D with a residual, and a Linear head) is built and wrapped first; then
`synchronize()`, `empty_cache()`, `reset_peak_memory_stats()` and only then
`_record_memory_history(stacks="python")`, so that parameters, DDP buckets, NCCL and FSDP
state exist before recording. Rank r's batch is `randn(8, T*(1+r), D)` (uneven work). The
snapshot is taken after `synchronize()` while recording is still on, so blocks freed on
another stream and not yet released (`active_pending_free`) are in it.

Each rank writes OUT_DIR/<prefix>_rank<R>.pickle (unless --no-snapshot: then it only runs, as
under `collector trace`) and prints `RESULT {json}` with its max_memory_allocated/reserved.
"""
import argparse
import json
import os
import pickle

import torch
import torch.distributed as dist
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("mode", choices=["ddp", "fsdp2"])
p.add_argument("out")
p.add_argument("--no-snapshot", action="store_true")
p.add_argument("--width", type=int, default=1024)
p.add_argument("--blocks", type=int, default=8)
p.add_argument("--tokens", type=int, default=256)
p.add_argument("--prefix", default=None)
args = p.parse_args()
mode, out, d = args.mode, args.out, args.width
prefix = args.prefix or mode


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class Model(nn.Module):
    def __init__(self, d, n):
        super().__init__()
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.head = nn.Linear(d, d)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


dist.init_process_group("nccl")
rank = dist.get_rank()
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
torch.manual_seed(0)
model = Model(d, args.blocks).cuda()
if mode == "ddp":
    model = nn.parallel.DistributedDataParallel(model, device_ids=[local])
else:
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
torch.cuda.synchronize()
torch.cuda.empty_cache()
torch.cuda.reset_peak_memory_stats()
if not args.no_snapshot:
    torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python")
for step in range(3):
    x = torch.randn(8, args.tokens * (1 + rank), d, device="cuda")
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
result = {
    "mode": mode,
    "rank": rank,
    "width": d,
    "blocks": args.blocks,
    "tokens": args.tokens,
    "max_memory_allocated": torch.cuda.max_memory_allocated(),
    "max_memory_reserved": torch.cuda.max_memory_reserved(),
    "memory_allocated": torch.cuda.memory_allocated(),
    "memory_reserved": torch.cuda.memory_reserved(),
}
if not args.no_snapshot:
    snap = torch.cuda.memory._snapshot()
    with open(os.path.join(out, f"{prefix}_rank{rank}.pickle"), "wb") as f:
        pickle.dump(snap, f)
    torch.cuda.memory._record_memory_history(enabled=None)
    states = {}
    for seg in snap["segments"]:
        for b in seg["blocks"]:
            states[b["state"]] = states.get(b["state"], 0) + b["size"]
    result["final_block_bytes_by_state"] = states
print("RESULT " + json.dumps(result), flush=True)
dist.destroy_process_group()
