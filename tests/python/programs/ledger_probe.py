"""Issue 67's probe: a small model trained a few steps, a 1-rank NCCL group that all-reduces, a
raw 256 MiB cudaMalloc through ctypes and a second group of the same rank (a communicator of
its own) that all-reduces too, all held at the mark `held`. Prints one JSON line with PyTorch's
reserved bytes and the raw block's size, for the ledger to be checked against."""

import ctypes
import glob
import json
import os
import socket
import time

import torch
import torch.distributed as dist

dev = torch.device("cuda", torch.cuda.current_device())
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).to(dev)
opt = torch.optim.AdamW(model.parameters())
for _ in range(3):
    loss = model(torch.randn(256, 1024, device=dev)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
t = torch.ones(1 << 20, device=dev)
dist.all_reduce(t)
torch.cuda.synchronize()

site = os.path.dirname(os.path.dirname(torch.__file__))
cudart = sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib", "libcudart.so*")) + glob.glob(os.path.join(site, "nvidia", "cuda_runtime", "lib", "libcudart.so*")))
rt = ctypes.CDLL(cudart[-1])
raw = ctypes.c_void_p()
RAW = 256 << 20
assert rt.cudaMalloc(ctypes.byref(raw), ctypes.c_size_t(RAW)) == 0
# A second group of the same rank: a communicator of its own.
pair = dist.new_group([0])
t2 = torch.ones(1 << 18, device=dev)
dist.all_reduce(t2, group=pair)
torch.cuda.synchronize()

try:
    import memory_tracer

    memory_tracer.mark("held")
except ImportError:
    pass
# Held long enough for NVML's samples (a tenth of a second apart) to see it all.
time.sleep(0.6)
out = {"raw_bytes": RAW, "reserved": torch.cuda.memory_reserved(), "allocated": torch.cuda.memory_allocated(), "allreduce": float(t[0].item()), "allreduce_pair": float(t2[0].item()), "groups": 2}
print("PROBE " + json.dumps(out))
rt.cudaFree(raw)
dist.destroy_process_group()
