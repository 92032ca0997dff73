"""The memory_tracer Python API on a GPU: the peak that MemoryTracer reports for a traced
block equals torch.cuda.max_memory_allocated() over that block (the API resets the peak at
its start), with weights and inputs allocated before tracing began.

    PYTHONPATH=<folder with memory_tracer> MEMORY_TRACER_COLLECTOR=<collector> python3 tests/gpu/python_api_check.py
Prints one `RESULT {json}` line and its CHECK line (tests/gpu/checks.py); exit 0 when the
peaks are equal.
"""
import json
import sys

import torch
import torchvision
from checks import check

from memory_tracer import MemoryTracer

torch.manual_seed(0)
model = torchvision.models.resnet18().cuda()
opt = torch.optim.AdamW(model.parameters())
x = torch.randn(16, 3, 224, 224, device="cuda")
tracer = MemoryTracer(device="cuda:0")
with tracer.trace(model):
    for _ in range(3):
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
torch.cuda.synchronize()
torch_peak = torch.cuda.max_memory_allocated()
summary = tracer.get_summary()
stats = tracer.get_layer_stats()
result = {
    "trace_peak_allocated_bytes": summary["peak_allocated_bytes"],
    "torch_max_memory_allocated": torch_peak,
    "peak_layer": summary["peak_layer"],
    "layers": len(stats),
    "events": summary["total_events"],
    "optimizer_step_allocations": stats["optimizer.step"].total_allocations,
}
print("RESULT " + json.dumps(result))
ok = check("resnet18.peak", result["trace_peak_allocated_bytes"], f"={torch_peak}", result["trace_peak_allocated_bytes"] == torch_peak,
           "MemoryTracer's peak against max_memory_allocated()")
sys.exit(0 if ok else 1)
