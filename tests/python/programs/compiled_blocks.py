"""A model under torch.compile whose blocks each make activations of a size no other block
makes (hidden widths 96, 160, 224, 288 for a width of 64), trained for a few steps.

    compiled_blocks.py [--fullgraph] [--mode MODE] [--device cpu|cuda] [--steps N] [--bare]

Prints one JSON line: the widths, the batch, the loss, and PyTorch's own peak on CUDA.
`--bare` adds a compiled function with no module in it (its allocations have no module to
belong to)."""
import argparse
import json

import torch
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--fullgraph", action="store_true")
p.add_argument("--mode", default=None)
p.add_argument("--device", default="cpu")
p.add_argument("--steps", type=int, default=3)
p.add_argument("--bare", action="store_true")
a = p.parse_args()

WIDTH, BATCH = 64, 48
HIDDEN = [96, 160, 224, 288]


class Block(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.up = nn.Linear(WIDTH, hidden)
        self.down = nn.Linear(hidden, WIDTH)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(h) for h in HIDDEN])
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


@torch.compile(fullgraph=True)
def bare(x):
    return (x.sin() * x.cos()).sum(dim=0)


torch.manual_seed(0)
model = Net().to(a.device)
compiled = torch.compile(model, fullgraph=a.fullgraph, mode=a.mode)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(a.steps):
    x = torch.randn(BATCH, WIDTH, device=a.device)
    loss = compiled(x).pow(2).mean()
    if a.bare:
        loss = loss + bare(x).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
out = {"width": WIDTH, "batch": BATCH, "hidden": HIDDEN, "loss": round(loss.item(), 5)}
if a.device == "cuda":
    out["max_memory_allocated"] = torch.cuda.max_memory_allocated()
print(json.dumps(out))
