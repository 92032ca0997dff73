"""Training fed by a DataLoader with two worker processes: forked (Linux's default) or, with
the argument `spawn`, fresh interpreters that run the bootstrap again."""
import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

if __name__ == "__main__":
    context = sys.argv[1] if len(sys.argv) > 1 else None
    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(128, 16), torch.randint(0, 4, (128,)))
    dl = DataLoader(ds, batch_size=32, num_workers=2, multiprocessing_context=context)
    m = nn.Linear(16, 4)
    opt = torch.optim.Adam(m.parameters())
    for x, y in dl:
        nn.functional.cross_entropy(m(x), y).backward()
        opt.step()
        opt.zero_grad()
    print("batches", len(dl))
