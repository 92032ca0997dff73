"""Trains until interrupted (Ctrl-C), saying when each step is done."""
import sys
import time

import torch

m = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(m.parameters(), lr=0.01)
step = 0
while True:
    m(torch.randn(8, 64)).sum().backward()
    opt.step()
    opt.zero_grad()
    print(f"step {step}", flush=True)
    step += 1
    time.sleep(0.02)
    if step > 100000:
        sys.exit(0)
