"""A mixture-of-experts training loop whose sizes depend on the data: batches of varying size
(some dropped before the step, as a loop that skips bad batches does), routed to experts in
counts the router decides, the last outputs held across the iteration's end. With `--leak`,
each iteration also keeps 64 KiB derived from the router's logits, never freed, the way a
debugging list of routing statistics does. With `--leak-varying`, each iteration keeps a copy
of its input batch instead, whose size follows the data (24 to 200 KiB).

`--model lm` trains a small transformer encoder on sequences of varying length instead.

`moe_loop.py [--leak | --leak-varying] [--model moe|lm] [--iters N] [--device cpu|cuda]`; on CUDA it prints PyTorch's own
`memory_allocated()` after each optimizer step (`ALLOCATED <step> <bytes>`), the truth a
leak verdict is checked against.
"""
import argparse

import torch
import torch.nn as nn

KEEP_FLOATS = 64 * 1024 // 4


class Expert(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.up = nn.Linear(d, h)
        self.down = nn.Linear(h, d)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


class MoE(nn.Module):
    def __init__(self, d=128, experts=4):
        super().__init__()
        self.router = nn.Linear(d, experts)
        self.experts = nn.ModuleList(Expert(d, 256 + 64 * i) for i in range(experts))
        self.head = nn.Linear(d, 8)

    def forward(self, x):
        logits = self.router(x)
        choice = logits.argmax(-1)
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            picked = (choice == i).nonzero().squeeze(-1)
            if picked.numel():
                out.index_add_(0, picked, expert(x[picked]))
        return self.head(out), logits


class VarLenLM(nn.Module):
    """Sequences of the batch's own length through two encoder layers: activations, attention
    scores and the held outputs all follow the data."""

    def __init__(self, d=128):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, 4, 256, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(d, 8)

    def forward(self, x):
        h = self.encoder(x.view(8, -1, x.shape[-1]))
        return self.head(h), h[:, 0]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--leak", action="store_true")
    p.add_argument("--leak-varying", action="store_true")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--device", default="cpu")
    p.add_argument("--model", default="moe", choices=["moe", "lm"])
    a = p.parse_args()
    dev = torch.device(a.device)
    torch.manual_seed(0)
    model = (MoE() if a.model == "moe" else VarLenLM()).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    kept = []
    gen = torch.Generator().manual_seed(1)
    step = 0
    out = None
    for it in range(a.iters + 2):
        n = int(torch.randint(48, 400, (1,), generator=gen))
        n -= n % 8  # the language model's batch of 8 sequences of n / 8 tokens
        x = torch.randn(n, 128, generator=gen).to(dev)
        out, logits = model(x)
        loss = out.pow(2).mean()
        if it in (3, 7):  # a dropped batch: no backward, no step
            continue
        loss.backward()
        if a.leak:
            kept.append(torch.zeros(KEEP_FLOATS, device=dev) + logits.detach().mean())
        if a.leak_varying:
            kept.append(x.detach().clone())
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        if dev.type == "cuda":
            torch.cuda.synchronize()
            print(f"ALLOCATED {step} {torch.cuda.memory_allocated(dev)}", flush=True)
        if step == a.iters:
            break
    print(f"moe trained {step} steps, kept {len(kept)}", flush=True)


if __name__ == "__main__":
    main()
