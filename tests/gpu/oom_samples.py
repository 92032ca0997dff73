"""Real CUDA out-of-memory samples for tests/data (issue 18's OOM explanation).

    python oom_samples.py snapshot OUT_DIR   # oom_mlp.pickle + oom_facts.json
    python oom_samples.py program            # run under `collector trace`: dies of an OOM

The process may use 1 GiB of the device (set_per_process_memory_fraction); an MLP trains at
batch 64, then batch 1M, whose first activation does not fit. The snapshot records the
allocator's `oom` action; the facts keep PyTorch's own numbers at the failure.
"""
import json
import os
import re
import sys

import torch
import torch.nn as nn

LIMIT = 1 << 30


def run():
    torch.cuda.set_per_process_memory_fraction(LIMIT / torch.cuda.get_device_properties(0).total_memory)
    model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10)).cuda()
    opt = torch.optim.Adam(model.parameters())
    for batch in (64, 64, 1 << 20):
        x = torch.randn(batch, 512, device="cuda")
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()


def main():
    if sys.argv[1] == "program":
        run()
        return
    out = sys.argv[2]
    torch.cuda.memory._record_memory_history(max_entries=100000)
    try:
        run()
        sys.exit("expected an out-of-memory")
    except torch.OutOfMemoryError as e:
        message = str(e)
    path = os.path.join(out, "oom_mlp.pickle")
    torch.cuda.memory._dump_snapshot(path)
    asked = re.search(r"Tried to allocate ([0-9.]+) (GiB|MiB|KiB)", message)
    facts = {
        "what": "MLP 512-2048-2048-10, Adam, batch 64 twice then 1M rows: out of memory under a 1 GiB per-process limit",
        "message": message.splitlines()[0],
        "max_allocated": torch.cuda.max_memory_allocated(),
        "allocated_at_oom": torch.cuda.memory_allocated(),
        "reserved_at_oom": torch.cuda.memory_reserved(),
        "num_ooms": torch.cuda.memory_stats()["num_ooms"],
        "tried_to_allocate": asked.group(0) if asked else None,
        "bytes": os.path.getsize(path),
    }
    json.dump(facts, open(os.path.join(out, "oom_facts.json"), "w"), indent=1)
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
