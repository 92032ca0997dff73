"""A Hugging Face transformers causal LM (GPT-2 architecture) from a small config with random
weights (no download), trained with AdamW for a few steps."""
import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=1000, n_positions=128)
model = GPT2LMHeadModel(config)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(2):
    ids = torch.randint(0, config.vocab_size, (2, 32))
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    opt.step()
    opt.zero_grad()
print("loss", round(out.loss.item(), 3))
