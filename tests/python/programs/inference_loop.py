"""Inference only: no optimizer, five batches through a small encoder under no_grad."""
import torch
import torch.nn as nn


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(32, 64)
        self.blocks = nn.ModuleList([nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 64), nn.GELU()) for _ in range(2)])
        self.head = nn.Linear(64, 4)

    def forward(self, x):
        x = self.embed(x)
        for b in self.blocks:
            x = x + b(x)
        return self.head(x)


torch.manual_seed(0)
model = Encoder().eval()
with torch.no_grad():
    for i in range(5):
        y = model(torch.randn(8, 32))
print("batches", 5, "out", tuple(y.shape))
