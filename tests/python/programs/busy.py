"""Many small operators in a tight loop: records arrive faster than a slow drain takes them."""
import torch

x = torch.zeros(4)
m = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
for i in range(20000):
    x = x + 1
m(x).sum().backward()
opt.step()
print("sum", float(x.sum()))
