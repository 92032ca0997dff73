"""A torchrun job (gloo, 2 ranks) where rank 1 dies: `--when start` exits before importing
torch (it never streams a trace), `--when step` kills itself with SIGKILL after its first
training step (its trace stops there). torchrun then stops rank 0."""
import argparse
import os
import signal
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--when", choices=("start", "step"), required=True)
when = p.parse_args().when
rank = int(os.environ["RANK"])
if rank == 1 and when == "start":
    time.sleep(4)  # rank 0 imports torch and records meanwhile, then waits for rank 1
    sys.exit(3)

import torch
import torch.distributed as dist
import torch.nn as nn

warm = [torch.randn(256, 256) for _ in range(4)]  # rank 0 records something before it waits
dist.init_process_group("gloo")
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    model(torch.randn(8, 32)).square().mean().backward()
    opt.step()
    opt.zero_grad()
    if rank == 1 and step == 0:
        os.kill(os.getpid(), signal.SIGKILL)
dist.destroy_process_group()
