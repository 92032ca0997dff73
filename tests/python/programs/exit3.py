"""Trains one step, prints to stdout and stderr, then exits with status 3."""
import sys

import torch

m = torch.nn.Linear(16, 16)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
m(torch.randn(4, 16)).sum().backward()
opt.step()
print("to stdout")
print("to stderr", file=sys.stderr)
sys.exit(3)
