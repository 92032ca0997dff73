"""Three training programs whose reserved memory moves with the allocator's settings, for
`collector whatif` (issue 48): each prints one `COUNTERS {json}` line at the end with
PyTorch's own `max_memory_allocated()`, `max_memory_reserved()` and the settings it ran under.

    whatif_train.py --model cnn|llama|moe [--steps N] [--seed S] [--memory-limit-gib G]
                    [--set-alloc-conf CONF]

`--memory-limit-gib` sets a per-process memory fraction of G GiB of the device before the
first allocation; `--set-alloc-conf` hands CONF to `torch.cuda.memory._set_allocator_settings`
before it (settings made by the program, not the environment).

- `cnn`: torchvision ResNet-50, SGD with momentum, batches of varying size (32, 48, 24, 64,
  40, 56, ... at 224x224), as a loader with a ragged last batch or a curriculum gives them.
- `llama`: a Llama-architecture decoder (transformers' LlamaForCausalLM, 8 layers of 1024,
  GQA), AdamW, bf16 autocast, sequences of varying length.
- `moe`: top-2 routed mixture of experts whose expert batches are what the router decides
  (data-dependent sizes every step), AdamW.

The data are drawn from a seeded generator, so every run of one program makes the same
requests in the same order whatever PYTORCH_CUDA_ALLOC_CONF says.
"""
import argparse
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


def cnn(steps, g):
    import torchvision

    model = torchvision.models.resnet50(num_classes=100).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sizes = [32, 48, 24, 64, 40, 56, 16, 72]
    for step in range(steps):
        b = sizes[step % len(sizes)]
        x = torch.randn(b, 3, 224, 224, generator=g).cuda()
        y = torch.randint(0, 100, (b,), generator=g).cuda()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return loss.item()


def llama(steps, g):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=4,
        max_position_embeddings=2048,
    )
    model = LlamaForCausalLM(config).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    lengths = [512, 1024, 384, 768, 896, 256, 640, 1024]
    for step in range(steps):
        t = lengths[step % len(lengths)]
        ids = torch.randint(0, config.vocab_size, (8, t), generator=g).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return loss.item()


class Expert(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.up = nn.Linear(d, h)
        self.down = nn.Linear(h, d)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class MoELayer(nn.Module):
    def __init__(self, d, experts, h):
        super().__init__()
        self.router = nn.Linear(d, experts)
        self.experts = nn.ModuleList(Expert(d, h) for _ in range(experts))

    def forward(self, x):
        weights, choice = self.router(x).softmax(-1).topk(2, dim=-1)
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            rows, slot = (choice == i).nonzero(as_tuple=True)
            if rows.numel():
                out.index_add_(0, rows, expert(x[rows]) * weights[rows, slot, None])
        return x + out


class MoE(nn.Module):
    def __init__(self, d=1024, layers=4, experts=8, h=2048):
        super().__init__()
        self.embed = nn.Embedding(8192, d)
        self.layers = nn.ModuleList(MoELayer(d, experts, h) for _ in range(layers))
        self.head = nn.Linear(d, 8192)

    def forward(self, ids):
        x = self.embed(ids).flatten(0, 1)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def moe(steps, g):
    model = MoE().cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(steps):
        t = [1024, 512, 1536, 768][step % 4]
        # Skewed token ids so that the router's choices, and the expert batches, vary.
        ids = (torch.rand(8, t, generator=g) ** (1 + step % 3) * 8192).long().cuda()
        logits = model(ids)
        loss = F.cross_entropy(logits, ids.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return loss.item()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["cnn", "llama", "moe"], required=True)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--memory-limit-gib", type=float)
    p.add_argument("--set-alloc-conf")
    a = p.parse_args()
    if a.set_alloc_conf:
        torch.cuda.memory._set_allocator_settings(a.set_alloc_conf)
    if a.memory_limit_gib:
        torch.cuda.set_per_process_memory_fraction(a.memory_limit_gib * 2**30 / torch.cuda.get_device_properties(0).total_memory, 0)
    torch.manual_seed(a.seed)
    g = torch.Generator().manual_seed(a.seed)
    loss = {"cnn": cnn, "llama": llama, "moe": moe}[a.model](a.steps, g)
    torch.cuda.synchronize()
    counters = {
        "model": a.model,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "set_alloc_conf": a.set_alloc_conf or "",
        "memory_limit_gib": a.memory_limit_gib,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "device_total_memory": torch.cuda.get_device_properties(0).total_memory,
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "loss": round(loss, 4),
    }
    print("COUNTERS " + json.dumps(counters), flush=True)


if __name__ == "__main__":
    main()
