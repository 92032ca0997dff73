"""The built-in models as a Python program: distributed runs under torchrun, and the runs
`collector advise --verify` changes (activation checkpointing, AMP).

    torchrun --nproc-per-node 2 -m memory_tracer.zoo --model resnet50 --strategy ddp
    python -m memory_tracer.zoo --model resnet152 --batch-size 64 --checkpoint layer3,layer4 --amp

`collector serve` runs it for trace requests with `"world_size": N` (through
`collector trace -- python -m torch.distributed.run ...`), and anyone may run it under
`collector trace`. The models match the collector's built-in zoo (`collector trace --model`):
torchvision's ResNets and VGG-16 at 3x224x224 with 1000 classes, a GPT-2-small-shaped decoder
(12 layers, width 768, 12 heads, vocabulary 50257, 1024 positions), a transformer encoder
classifier (6 layers, width 512, 8 heads, vocabulary 32000) and an MLP (784 -> 3 x 1024).

Strategies (under torchrun): `ddp` (DistributedDataParallel) and `fsdp` (FSDP2's
`fully_shard` on every block, then the root). NCCL on CUDA (each rank on `cuda:LOCAL_RANK`),
gloo on the CPU. Without torchrun it runs as one process. `--checkpoint PATHS` wraps those
modules (paths as `named_modules()` gives them, as traces name layers) in
`torch.utils.checkpoint`; `--amp` runs forward and loss under bf16 autocast. Random weights
and inputs; the numbers that matter are the memory's.
"""

import argparse
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

IMAGE_MODELS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "vgg16")
MODELS = IMAGE_MODELS + ("transformer", "gpt", "mlp")
DEFAULT_SHAPES = {"transformer": [8, 512], "gpt": [8, 1024], "mlp": [64, 784]}


class Block(nn.Module):
    """A pre-norm transformer block (causal for the GPT)."""

    def __init__(self, width, heads, causal):
        super().__init__()
        self.causal = causal
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        b, t, w = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(w, dim=2)
        q, k, v = (z.view(b, t, self.heads, w // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, w))
        return x + self.mlp(self.ln2(x))


class Gpt(nn.Module):
    def __init__(self, layers=12, width=768, heads=12, vocab=50257, positions=1024):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(positions, width)
        self.h = nn.ModuleList(Block(width, heads, causal=True) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))

    def blocks(self):
        return list(self.h)


class Transformer(nn.Module):
    def __init__(self, layers=6, width=512, heads=8, vocab=32000, classes=1000):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.layers = nn.ModuleList(Block(width, heads, causal=False) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.layers:
            x = block(x)
        return self.head(self.norm(x).mean(dim=1))

    def blocks(self):
        return list(self.layers)


class Mlp(nn.Module):
    def __init__(self, inputs=784, layers=3, width=1024, classes=1000):
        super().__init__()
        widths = [inputs] + [width] * layers
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(a, b), nn.ReLU()) for a, b in zip(widths, widths[1:]))
        self.head = nn.Linear(width, classes)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)

    def blocks(self):
        return list(self.layers)


def build(name):
    """The model and the blocks FSDP2 shards one by one."""
    if name in IMAGE_MODELS:
        import torchvision

        model = getattr(torchvision.models, name)(weights=None, num_classes=1000)
        if name == "vgg16":
            blocks = [m for m in model.features if isinstance(m, nn.Conv2d)] + [model.classifier]
        else:
            blocks = [model.layer1, model.layer2, model.layer3, model.layer4]
        return model, blocks
    model = {"gpt": Gpt, "transformer": Transformer, "mlp": Mlp}[name]()
    return model, model.blocks()


def batch(name, shape, device):
    """A random input and target of `shape` (batch first)."""
    n = shape[0]
    if name in IMAGE_MODELS:
        return torch.randn(*shape, device=device), torch.randint(0, 1000, (n,), device=device)
    if name == "gpt":
        ids = torch.randint(0, 50257, shape, device=device)
        return ids, ids
    if name == "transformer":
        return torch.randint(0, 32000, shape, device=device), torch.randint(0, 1000, (n,), device=device)
    return torch.randn(*shape, device=device), torch.randint(0, 1000, (n,), device=device)


def loss_of(name, out, target):
    if name == "gpt":
        return F.cross_entropy(out[:, :-1].reshape(-1, out.shape[-1]), target[:, 1:].reshape(-1))
    return F.cross_entropy(out, target)


def check_shape(name, shape):
    """The shape the model takes, or a message saying what was expected."""
    if any(d < 1 for d in shape):
        return "every dimension must be at least 1"
    if name in IMAGE_MODELS and (len(shape) != 4 or shape[1] != 3 or min(shape[2:]) < 32):
        return "expected batch,3,height,width with height and width at least 32"
    if name in ("gpt", "transformer") and len(shape) != 2:
        return "expected batch,tokens"
    if name == "gpt" and shape[1] > 1024:
        return "gpt takes at most 1024 positions"
    if name == "mlp" and (len(shape) != 2 or shape[1] != 784):
        return "expected batch,784"
    if math.prod(shape) > 1 << 34:
        return "more than 2^34 elements"
    return None


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m memory_tracer.zoo", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, choices=MODELS)
    p.add_argument("--strategy", default="ddp", choices=("ddp", "fsdp"))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    p.add_argument("--input-shape", type=lambda s: [int(x) for x in s.split(",")], help="full shape, batch first (default: the model's)")
    p.add_argument("--batch-size", type=int, help="replaces the first dimension of the shape")
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--mode", default="train", choices=("train", "infer"))
    p.add_argument("--optimizer", default="sgd", choices=("sgd", "adam", "adamw"))
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--checkpoint", default="", help="module paths to recompute in backward (torch.utils.checkpoint), comma-separated")
    p.add_argument("--amp", action="store_true", help="bf16 autocast for forward and loss")
    a = p.parse_args(argv)
    a.shape = list(a.input_shape or DEFAULT_SHAPES.get(a.model, [8, 3, 224, 224]))
    if a.batch_size is not None:
        a.shape[0] = a.batch_size
    why = check_shape(a.model, a.shape)
    if why:
        p.error(f"--input-shape {','.join(map(str, a.shape))} for {a.model}: {why}")
    if a.iterations < 1:
        p.error("--iterations must be at least 1")
    return a


def checkpoint_modules(model, paths):
    """Wraps the forward of each module named in `paths` in torch.utils.checkpoint; returns an
    error message for a path the model lacks."""
    import torch.utils.checkpoint as cp

    modules = dict(model.named_modules())
    for path in paths:
        m = modules.get(path)
        if m is None or path == "":
            some = ", ".join(n for n in list(modules)[1:12])
            return f"--checkpoint {path}: the model has no module of that path (it has {some}, ...)"
        forward = m.forward

        def wrapped(*args, _forward=forward, **kwargs):
            if not torch.is_grad_enabled():
                return _forward(*args, **kwargs)
            return cp.checkpoint(_forward, *args, use_reentrant=False, **kwargs)

        m.forward = wrapped
    return None


def main(argv=None):
    a = parse(sys.argv[1:] if argv is None else argv)
    distributed = "RANK" in os.environ
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if a.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("--device cuda, but torch sees no CUDA device")
        if local >= torch.cuda.device_count():
            sys.exit(f"rank with LOCAL_RANK {local} needs cuda:{local}, but only {torch.cuda.device_count()} CUDA devices are visible")
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    rank = 0
    if distributed:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", device_id=device if device.type == "cuda" else None)
        rank = dist.get_rank()
    torch.manual_seed(1234 + rank)
    model, blocks = build(a.model)
    why = checkpoint_modules(model, [p for p in a.checkpoint.split(",") if p])
    if why:
        sys.exit(why)
    model.to(device)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if not distributed:
        pass
    elif a.strategy == "ddp":
        model = nn.parallel.DistributedDataParallel(model, device_ids=[local] if device.type == "cuda" else None)
    else:
        from torch.distributed.fsdp import fully_shard

        for b in blocks:
            fully_shard(b)
        fully_shard(model)
    make = {"sgd": lambda p: torch.optim.SGD(p, lr=a.lr, momentum=0.9), "adam": lambda p: torch.optim.Adam(p, lr=a.lr), "adamw": lambda p: torch.optim.AdamW(p, lr=a.lr)}
    opt = make[a.optimizer](model.parameters())
    for step in range(a.iterations):
        x, y = batch(a.model, a.shape, device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.amp):
            if a.mode == "infer":
                with torch.no_grad():
                    model(x)
                continue
            loss = loss_of(a.model, model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
        peak, reserved = torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)
        print(f"rank {rank}: {a.model} {a.strategy if distributed else 'single'} parameters {param_bytes} B, peak allocated {peak} B, peak reserved {reserved} B", flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
