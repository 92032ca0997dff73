"""DistributedDataParallel on the CPU (gloo) across nodes, for two `torchrun --nnodes 2
--node-rank K ...` started on one machine (`collector/tests/multinode.rs`). Each rank
allocates before the process group forms, so a rank whose peers never come has recorded
something before it gives up after `--init-timeout` seconds. `--fail-node K`: the ranks of
node K (torchrun's GROUP_RANK) exit with status 3 before importing torch."""
import argparse
import datetime
import os
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--init-timeout", type=float, default=120)
p.add_argument("--steps", type=int, default=4)
p.add_argument("--fail-node", type=int, default=-1)
args = p.parse_args()
if int(os.environ.get("GROUP_RANK", "0")) == args.fail_node:
    print("node", args.fail_node, "fails on purpose", file=sys.stderr)
    sys.exit(3)

import torch
import torch.distributed as dist
import torch.nn as nn

warm = [torch.randn(128, 128) for _ in range(2)]
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.init_timeout))
rank = dist.get_rank()
torch.manual_seed(rank)
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(args.steps):
    model(torch.randn(8 * (rank + 1), 32)).square().mean().backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.3)  # the live view gets each step's points before the next
print("rank", rank, "done")
dist.destroy_process_group()
