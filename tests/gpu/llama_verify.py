"""A transformers Llama-architecture causal LM for `collector advise --verify` (issue 32,
part 3): 6 layers, width 512, 8 heads, 4 key/value heads (GQA), vocabulary 32000, random
weights (no download), batch 8 x 512, AdamW, fp32 weights.

    collector advise --verify -- python tests/gpu/llama_verify.py [--iterations N]
    python tests/gpu/llama_verify.py --checkpoint model.layers.0,model.norm --amp

`--checkpoint PATHS` wraps each named module's forward in torch.utils.checkpoint
(use_reentrant=False); `--amp` runs the forward and the loss under bf16 autocast.
"""
import argparse

import torch
import torch.utils.checkpoint as cp
from transformers import LlamaConfig, LlamaForCausalLM

p = argparse.ArgumentParser()
p.add_argument("--checkpoint", default="")
p.add_argument("--amp", action="store_true")
p.add_argument("--iterations", type=int, default=4)
p.add_argument("--layers", type=int, default=6)
p.add_argument("--batch", type=int, default=8)
p.add_argument("--seq", type=int, default=512)
a = p.parse_args()
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
config = LlamaConfig(
    hidden_size=512,
    intermediate_size=1376,
    num_hidden_layers=a.layers,
    num_attention_heads=8,
    num_key_value_heads=4,
    vocab_size=32000,
    max_position_embeddings=1024,
    attn_implementation="sdpa",
)
model = LlamaForCausalLM(config).to(device)
modules = dict(model.named_modules())
for path in filter(None, a.checkpoint.split(",")):
    m = modules.get(path)
    if m is None:
        raise SystemExit(f"--checkpoint {path}: no such module (it has {', '.join(list(modules)[1:12])}, ...)")

    def wrapped(*args, _forward=m.forward, **kwargs):
        if not torch.is_grad_enabled():
            return _forward(*args, **kwargs)
        return cp.checkpoint(_forward, *args, use_reentrant=False, **kwargs)

    m.forward = wrapped
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(a.iterations):
    ids = torch.randint(0, config.vocab_size, (a.batch, a.seq), device=device)
    with torch.autocast(device, dtype=torch.bfloat16, enabled=a.amp):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print("loss", round(loss.item(), 3))
