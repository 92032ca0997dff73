"""Real snapshots of two shapes the samples lack, with PyTorch's own counters, for the
importer's tests (tests/data/shape_facts.json; the pickles are copied into tests/data):

- expandable.pickle: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segment_map and
  segment_unmap entries, expandable segments), an MLP's 3 Adam steps recorded from reset.
- wrapped.pickle: the recorder's max_entries (2000) far below what 200 steps make, so its trace
  buffer wraps and its annotations (as many as entries) reach far before its first entry.

    python3 tests/gpu/shape_snapshots.py OUT_DIR

(tests/data holds them as expandable_mlp.pickle and wrapped_mlp.pickle.)
"""
import json
import os
import subprocess
import sys

out = sys.argv[1]
os.makedirs(out, exist_ok=True)

if len(sys.argv) == 2:
    facts = {}
    for shape, conf in [("expandable", "expandable_segments:True"), ("wrapped", "")]:
        env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf)
        line = subprocess.run([sys.executable, __file__, out, shape], env=env, check=True, capture_output=True, text=True).stdout
        facts[f"{shape}.pickle"] = json.loads(line.strip().splitlines()[-1])
    with open(os.path.join(out, "shape_facts.json"), "w") as f:
        json.dump({"what": __doc__.strip().splitlines()[0], "samples": facts}, f, indent=1)
    print(json.dumps(facts, indent=1))
    sys.exit(0)

import torch  # noqa: E402 (after PYTORCH_CUDA_ALLOC_CONF is set, in the child)

shape = sys.argv[2]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).cuda()
opt = torch.optim.Adam(model.parameters())
steps = 3 if shape == "expandable" else 200
max_entries = 100_000 if shape == "expandable" else 2000
torch.cuda.synchronize()
torch.cuda.reset_peak_memory_stats()
torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks="python")
for step in range(steps):
    x = torch.randn(64 + 32 * (step % 3), 512, device="cuda")
    y = torch.randint(0, 10, (x.shape[0],), device="cuda")
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
path = os.path.join(out, f"{shape}.pickle")
torch.cuda.memory._dump_snapshot(path)
snap = torch.cuda.memory._snapshot()
torch.cuda.memory._record_memory_history(enabled=None)
entries = sum(len(t) for t in snap["device_traces"])
actions = sorted({e["action"] for t in snap["device_traces"] for e in t})
print(json.dumps({
    "what": f"MLP 512-2048-512-10, Adam, batches 64/96/128 in turn, {steps} steps, max_entries {max_entries}",
    "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
    "entries": entries,
    "annotations": len(snap.get("external_annotations", [])),
    "actions": actions,
    "expandable_segments": sum(1 for s in snap["segments"] if s.get("is_expandable")),
    "max_allocated": torch.cuda.max_memory_allocated(),
    "max_reserved": torch.cuda.max_memory_reserved(),
    "end_allocated": torch.cuda.memory_allocated(),
    "end_reserved": torch.cuda.memory_reserved(),
    "torch": torch.__version__,
    "gpu": torch.cuda.get_device_name(),
}))
