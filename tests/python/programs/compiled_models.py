"""A real model trained under torch.compile, for checking where compiled code's allocations
land: torchvision's ViT-B/16 (bf16 autocast, two micro-batches accumulated per step) or a
Llama-architecture causal LM from transformers.

    compiled_models.py vit|lm [--device cuda] [--steps N] [--mode MODE] [--fullgraph]

Prints one JSON line with the loss and PyTorch's own peak (CUDA)."""
import argparse
import json

import torch

p = argparse.ArgumentParser()
p.add_argument("model", choices=["vit", "lm"])
p.add_argument("--device", default="cuda")
p.add_argument("--steps", type=int, default=3)
p.add_argument("--mode", default=None)
p.add_argument("--fullgraph", action="store_true")
a = p.parse_args()

torch.manual_seed(0)
if a.model == "vit":
    import torchvision

    model = torchvision.models.vit_b_16().to(a.device)
    micro = 2

    def batch():
        return torch.randn(16, 3, 224, 224, device=a.device), torch.randint(0, 1000, (16,), device=a.device)

    def loss_of(out, y):
        return torch.nn.functional.cross_entropy(out, y)
else:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=8192, hidden_size=512, intermediate_size=1408, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512)
    model = LlamaForCausalLM(cfg).to(a.device)
    micro = 1

    def batch():
        ids = torch.randint(0, 8192, (8, 256), device=a.device)
        return ids, ids

    def loss_of(out, y):
        logits = out.logits if hasattr(out, "logits") else out[0]
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten())

compiled = torch.compile(model, mode=a.mode, fullgraph=a.fullgraph)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(a.steps):
    for _ in range(micro):
        x, y = batch()
        with torch.autocast(a.device, dtype=torch.bfloat16):
            loss = loss_of(compiled(x), y) / micro
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
out = {"model": a.model, "loss": round(loss.item(), 4)}
if a.device == "cuda":
    out["max_memory_allocated"] = torch.cuda.max_memory_allocated()
print(json.dumps(out))
