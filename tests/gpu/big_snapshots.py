"""Records real memory snapshots of 1 GB and more with PyTorch's recorder, then imports each
with Memory Tracer's importer and checks its peak against PyTorch's counters (issue 17).

A small transformer trains on the GPU with memory history on (`stacks="python"` or
`stacks="all"`), for as many steps as the pickle needs to reach --target-mb (the recorder's
ring buffer is larger than the run, so nothing is dropped and the recording covers the whole
run from `reset_peak_memory_stats()` on). The snapshot is dumped with
`torch.cuda.memory._dump_snapshot`; then, if --importer names the `import_file` example
(`cargo build --release -p shared --example import_file`), it imports the file
and the peak it reports must equal `torch.cuda.max_memory_allocated()`.

    python big_snapshots.py --stacks python --target-mb 3000 --out DIR --importer ./import_file

Writes DIR/big_<stacks>_<MB>.json: file size, steps, entries per step, PyTorch's counters,
and the importer's line (events, time, memory). The pickles stay in /tmp (they are regenerated, never committed); the JSON
facts of a run go to tests/data/big_snapshots.json.
"""
import argparse
import json
import os
import pickle
import subprocess
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--stacks", choices=["python", "all"], default="python")
p.add_argument("--target-mb", type=int, default=1000)
p.add_argument("--max-record-s", type=float, default=300.0)
p.add_argument("--out", required=True)
p.add_argument("--importer")
a = p.parse_args()
os.makedirs(a.out, exist_ok=True)
dev = torch.device("cuda")
torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024, batch_first=True)
model = torch.nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False).to(dev)
head = torch.nn.Linear(256, 1000).to(dev)
params = list(model.parameters()) + list(head.parameters())
opt = torch.optim.AdamW(params, lr=1e-4)
x = torch.randn(8, 64, 256, device=dev)
y = torch.randint(0, 1000, (8 * 64,), device=dev)


def step():
    loss = torch.nn.functional.cross_entropy(head(model(x)).reshape(-1, 1000), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


step()  # optimizer state exists before recording, as in a long run's later window
torch.cuda.synchronize()
torch.cuda.memory._record_memory_history(max_entries=60_000_000, stacks=a.stacks)
torch.cuda.reset_peak_memory_stats()
t0 = time.time()
# Pickle bytes per step, from a few steps (a small snapshot is cheap to take and pickle).
for _ in range(3):
    step()
torch.cuda.synchronize()
probe = torch.cuda.memory._snapshot()
probe_entries = sum(len(t) for t in probe["device_traces"])
bytes_per_entry = len(pickle.dumps(probe)) / max(probe_entries, 1)
entries_per_step = probe_entries / 3
del probe
steps = int(a.target_mb * 1e6 / bytes_per_entry / entries_per_step * 1.05)
done = 3
while done < steps and time.time() - t0 < a.max_record_s:
    step()
    done += 1
torch.cuda.synchronize()
record_s = time.time() - t0
path = f"/tmp/big_{a.stacks}_{a.target_mb}.pickle"
t1 = time.time()
torch.cuda.memory._dump_snapshot(path)
dump_s = time.time() - t1
torch.cuda.memory._record_memory_history(enabled=None)
facts = {
    "file": os.path.basename(path),
    "stacks": a.stacks,
    "bytes": os.path.getsize(path),
    "steps": done,
    "steps_planned": steps,
    "entries_per_step": entries_per_step,
    "record_s": round(record_s, 1),
    "dump_s": round(dump_s, 1),
    "max_allocated": torch.cuda.max_memory_allocated(),
    "max_reserved": torch.cuda.max_memory_reserved(),
    "end_allocated": torch.cuda.memory_allocated(),
    "end_reserved": torch.cuda.memory_reserved(),
    "torch": torch.__version__,
    "gpu": torch.cuda.get_device_name(),
}
# Events, counted by the importer (loading the pickle in Python costs ~10x its size).
if a.importer:
    out = subprocess.run([a.importer, path], capture_output=True, text=True)
    facts["importer"] = (out.stdout + out.stderr).strip()
    line = out.stdout
    if "peak allocated " in line:
        peak = int(line.split("peak allocated ")[1].split(" ")[0])
        facts["importer_peak_allocated"] = peak
        facts["peak_matches"] = peak == facts["max_allocated"]
        facts["importer_events"] = int(line.split(" events in")[0].rsplit(" ", 1)[1])
with open(os.path.join(a.out, f"big_{a.stacks}_{a.target_mb}.json"), "w") as f:
    json.dump(facts, f, indent=1)
print(json.dumps(facts, indent=1))
