"""Per-rank memory snapshots and counters of a 2-GPU DDP or FSDP2 job (3 AdamW steps, NCCL),
for checking the snapshot importer's allocator replay and `collector trace -- torchrun`
against PyTorch's own counters, rank by rank.

    torchrun --nproc-per-node 2 tests/gpu/ddp_snapshots.py ddp|fsdp2 OUT_DIR [--no-snapshot]

Each rank writes OUT_DIR/<mode>_rank<R>.pickle (unless --no-snapshot: then it only runs, as
under `collector trace`) and prints `RESULT {json}` with its max_memory_allocated/reserved.
"""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

mode, out = sys.argv[1], sys.argv[2]
snapshot = "--no-snapshot" not in sys.argv
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
if snapshot:
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
torch.manual_seed(0)
model = nn.Sequential(*[nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)) for _ in range(6)]).cuda()
if mode == "ddp":
    model = nn.parallel.DistributedDataParallel(model)
elif mode == "fsdp2":
    from torch.distributed.fsdp import fully_shard

    for block in model:
        fully_shard(block)
    fully_shard(model)
else:
    raise SystemExit(f"unknown mode {mode}; expected ddp or fsdp2")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(3):
    x = torch.randn(16 * (rank + 1), 512, 1024, device="cuda")
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
result = {
    "mode": mode,
    "rank": rank,
    "max_memory_allocated": torch.cuda.max_memory_allocated(),
    "max_memory_reserved": torch.cuda.max_memory_reserved(),
    "memory_allocated": torch.cuda.memory_allocated(),
}
if snapshot:
    torch.cuda.memory._dump_snapshot(os.path.join(out, f"{mode}_rank{rank}.pickle"))
    torch.cuda.memory._record_memory_history(enabled=None)
print("RESULT " + json.dumps(result), flush=True)
dist.destroy_process_group()
