"""Allocations outside every module: in the program's own functions, through torch's Python
(F.cross_entropy) and straight from C++ (torch.cat at the top level). Prints the sizes and the
lines they come from, read from the `# at:NAME` tags below, as one JSON line."""

import json
import os
import sys

import torch
import torch.nn.functional as F

torch.manual_seed(0)
device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
torch.set_default_device(device)
model = torch.nn.Linear(64, 1000)
opt = torch.optim.SGD(model.parameters(), lr=0.1)


class Double(torch.nn.Module):
    def forward(self, x):
        return x * 2


double = Double()


def prepare(n):
    return torch.randn(n, 64) + 1  # at:prepare


def loss_of(logits, target):
    scaled = logits * 3  # at:scale
    return F.cross_entropy(scaled, target)  # at:loss


for step in range(3):
    x = prepare(32)
    shifted = double(x)[:, :16] - 1  # at:after
    target = torch.randint(0, 1000, (32,))
    loss = loss_of(model(x), target)
    loss.backward()
    opt.step()
    opt.zero_grad()
kept = torch.cat([x, x, x])  # at:cat

src = open(__file__).read().splitlines()
base = os.path.basename(__file__)
at = {}
for i, line in enumerate(src, 1):
    if "# at:" in line and not line.lstrip().startswith("#"):
        at[line.split("# at:")[1].strip()] = i
functions = {"prepare": "prepare", "scale": "loss_of", "loss": "loss_of", "cat": "<module>", "after": "<module>"}
if device != "cpu":
    torch.cuda.synchronize()
print(f"RESULT {loss.item():.6f}")
print("OUTSIDE " + json.dumps({k: f"{base}:{v} in {functions[k]}" for k, v in at.items() if k in functions}))
