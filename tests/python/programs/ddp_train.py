"""DistributedDataParallel training on the CPU (gloo), for `torchrun --nproc-per-node 2`.

Rank 1 starts 1.5 s after rank 0 (it sleeps before importing torch), so its clock starts
later: a merge that did not align the ranks' clocks would put the two ranks' ends of every
iteration (both wait on the same all-reduce) 1.5 s apart."""
import os
import time

if os.environ.get("RANK") == "1":
    time.sleep(1.5)

import torch
import torch.distributed as dist
import torch.nn as nn

dist.init_process_group("gloo")
torch.manual_seed(dist.get_rank())
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    model(torch.randn(8 * (dist.get_rank() + 1), 32)).square().mean().backward()
    opt.step()
    opt.zero_grad()
print("rank", dist.get_rank(), "done")
dist.destroy_process_group()
