"""Training that leaks: a module keeps a copy of its input every call (128 KiB a step), the
way a history list or an un-detached metric does."""
import torch
import torch.nn as nn


class Memo(nn.Module):
    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, x):
        self.seen.append(x.detach().clone())
        return x


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(1024, 256), nn.ReLU(), Memo(), nn.Linear(256, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(6):
    x = torch.randn(128, 1024)
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()
print("kept", len(model[2].seen), "copies")
