"""A GPT-style LM whose loss is computed outside every module, over fp32 logits (bf16 autocast,
AdamW): the peak is in `train_step`'s own lines, which is where the summary should point.
Prints one JSON line: the loss, PyTorch's peak, and the line of the loss (`# at:loss`)."""

import argparse
import json
import os

import torch
import torch.nn.functional as F
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--device", default="cpu")
p.add_argument("--compile", action="store_true")
p.add_argument("--steps", type=int, default=3)
a = p.parse_args()
VOCAB, WIDTH, SEQ, BATCH = (32000, 256, 256, 8) if a.device == "cuda" else (2000, 32, 16, 2)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.attn = nn.MultiheadAttention(WIDTH, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x):
        h = self.norm(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(x)


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList([Block() for _ in range(2)])
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)

    def forward(self, ids):
        x = self.embed(ids)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def train_step(model, opt, ids, target):
    with torch.autocast(a.device, dtype=torch.bfloat16):
        logits = model(ids)
    loss = F.cross_entropy(logits.float().view(-1, VOCAB), target.view(-1))  # at:loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


torch.manual_seed(0)
model = LM().to(a.device)
run = torch.compile(model) if a.compile else model
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _ in range(a.steps):
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), device=a.device)
    loss = train_step(run, opt, ids, torch.roll(ids, -1, dims=1))
out = {"loss": round(loss.item(), 4)}
if a.compile:
    from torch._dynamo.utils import counters

    out["graphs"] = counters["stats"]["unique_graphs"]
    out["graph_breaks"] = sum(counters["graph_break"].values())
if a.device == "cuda":
    out["max_memory_allocated"] = torch.cuda.max_memory_allocated()
src = open(__file__).read().splitlines()
line = next(i for i, l in enumerate(src, 1) if l.rstrip().endswith("# at:loss"))
out["loss_line"] = f"{os.path.basename(__file__)}:{line} in train_step"
print(json.dumps(out))
