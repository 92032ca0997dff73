"""Trains one step, then fails with an exception (exit status 1)."""
import torch

m = torch.nn.Linear(16, 16)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
m(torch.randn(4, 16)).sum().backward()
opt.step()
raise ValueError("the program failed on purpose")
