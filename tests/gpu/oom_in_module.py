"""A real CUDA out-of-memory inside a module's forward (issue 32, part 4).

    python oom_in_module.py snapshot OUT_DIR   # oom_in_module.pickle + oom_in_module_facts.json
    python oom_in_module.py program            # run under `collector trace`: dies of the OOM

The process may use 1 GiB of the device (set_per_process_memory_fraction). An inference loop
keeps every output (4096 x 1024 floats, 16 MiB) of an MLP whose hidden layer `fc1` makes a
64 MiB activation; the forward call that no longer fits fails in `fc1`'s request.
"""
import json
import os
import re
import sys

import torch
import torch.nn as nn

LIMIT = 1 << 30


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(1024, 4096)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(4096, 1024)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def run(calls):
    torch.cuda.set_per_process_memory_fraction(LIMIT / torch.cuda.get_device_properties(0).total_memory)
    model = Mlp().cuda()
    x = torch.randn(4096, 1024, device="cuda")
    kept = []
    with torch.no_grad():
        while True:
            calls.append(len(calls) + 1)
            kept.append(model(x))


def main():
    calls = []
    if sys.argv[1] == "program":
        try:
            run(calls)
        finally:
            print(f"forward calls: {len(calls)}", file=sys.stderr)
        return
    out = sys.argv[2]
    torch.cuda.memory._record_memory_history(max_entries=100000, stacks="python")
    try:
        run(calls)
    except torch.OutOfMemoryError as e:
        message = str(e)
    path = os.path.join(out, "oom_in_module.pickle")
    torch.cuda.memory._dump_snapshot(path)
    asked = re.search(r"Tried to allocate ([0-9.]+) (GiB|MiB|KiB)", message)
    facts = {
        "what": "an MLP (fc1 1024->4096, ReLU, fc2) called on 4096x1024 in a loop that keeps every output, under a 1 GiB per-process limit: out of memory in fc1's forward",
        "message": message.splitlines()[0],
        "failing_forward_call": len(calls),
        "max_allocated": torch.cuda.max_memory_allocated(),
        "allocated_at_oom": torch.cuda.memory_allocated(),
        "reserved_at_oom": torch.cuda.memory_reserved(),
        "tried_to_allocate": asked.group(0) if asked else None,
    }
    json.dump(facts, open(os.path.join(out, "oom_in_module_facts.json"), "w"), indent=1)
    print(json.dumps(facts))


if __name__ == "__main__":
    main()
