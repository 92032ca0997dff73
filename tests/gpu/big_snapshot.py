"""Records a large real PyTorch memory snapshot for the viewer benchmark.

Trains torchvision's resnet50 on the GPU with memory history on (Python stacks) until the
trace holds at least --entries entries, dumps the snapshot, and writes it gzip-compressed in
parts of at most 15 MiB (the device tool brings back 16 MiB files) with facts.json:
entry count, raw pickle size and PyTorch's own counters.

    python big_snapshot.py --entries 600000 --out DIR
Rejoin with `cat DIR/snapshot.pickle.gz.part* > snapshot.pickle.gz`.
"""
import argparse, gzip, json, os, pickle, time
import torch, torchvision

p = argparse.ArgumentParser()
p.add_argument("--entries", type=int, default=600_000)
p.add_argument("--batch", type=int, default=32)
p.add_argument("--out", required=True)
p.add_argument("--xz", action="store_true", help="compress with xz (in parallel) instead of gzip, for snapshots near 1 GB")
a = p.parse_args()
os.makedirs(a.out, exist_ok=True)
dev = torch.device("cuda")
model = torchvision.models.resnet50().to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(a.batch, 3, 224, 224, device=dev)
y = torch.randint(0, 1000, (a.batch,), device=dev)
torch.cuda.memory._record_memory_history(max_entries=a.entries, stacks="python")
t0 = time.time()
it = 0
while True:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    it += 1
    # A training step of this model records about 2,000 entries; snapshots are costly to take
    # when large, so check rarely.
    if it % max(20, a.entries // 20000) == 0:
        torch.cuda.synchronize()
        n = sum(len(t) for t in torch.cuda.memory._snapshot()["device_traces"])
        if n >= a.entries * 0.999:
            break
torch.cuda.synchronize()
snap = torch.cuda.memory._snapshot()
raw = os.path.join("/tmp", "big_snapshot.pickle")
with open(raw, "wb") as f:
    pickle.dump(snap, f)
entries = sum(len(t) for t in snap["device_traces"])
facts = {
    "iterations": it, "entries": entries, "raw_bytes": os.path.getsize(raw),
    "record_s": time.time() - t0, "batch": a.batch,
    "max_allocated": torch.cuda.max_memory_allocated(), "max_reserved": torch.cuda.max_memory_reserved(),
    "end_allocated": torch.cuda.memory_allocated(), "end_reserved": torch.cuda.memory_reserved(),
}
raw_data = open(raw, "rb").read()
if a.xz:
    import lzma
    from concurrent.futures import ProcessPoolExecutor
    chunks = [raw_data[i:i + (32 << 20)] for i in range(0, len(raw_data), 32 << 20)]
    with ProcessPoolExecutor(16) as ex:
        data = b"".join(ex.map(lzma.compress, chunks))  # concatenated .xz streams
    suffix = "xz"
else:
    data = gzip.compress(raw_data, compresslevel=6)
    suffix = "gz"
facts["compressed_bytes"] = len(data)
part = 15 << 20
for i in range(0, len(data), part):
    with open(os.path.join(a.out, f"snapshot.pickle.{suffix}.part{i // part:02d}"), "wb") as f:
        f.write(data[i:i + part])
json.dump(facts, open(os.path.join(a.out, "facts.json"), "w"), indent=1)
print(json.dumps(facts))
