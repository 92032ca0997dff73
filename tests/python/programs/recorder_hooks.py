"""The recorder fallback's hooks (memory_tracer/_history.py) driven on a machine without a GPU:
run under `collector trace --capture recorder`, this program gives the recorder a fake CUDA
memory API (CUDA "initialised", `_record_memory_history` and `_snapshot` answered from a
history kept here) so that every hook runs as on a GPU: module scopes named by path, phases,
iterations, the optimizer's step. The fake history records the recorder's own
`record_function` ranges as the snapshot's `external_annotations` (as PyTorch's recorder
does) and one allocation entry for each module's forward output, each gradient and each
optimizer state tensor, at the time it is made, with its size.

Prints `FACTS {json}`: the allocations by the module (or phase) that made them, each with its
size, the steps taken and the loss, for the collector's test to compare with the trace.
"""

import json
import sys
import time

import torch

from memory_tracer import _history

rec = _history._current
if rec is None:
    sys.exit("the recorder fallback is not running (run under `collector trace --capture recorder`)")

ENTRIES, ANNOTATIONS, OPEN = [], [], {}
NEXT_ADDR = [0x7F00_0000_0000]
FACTS = {"allocs": [], "steps": 0}
RECORDING = [False]


def now_us():
    return time.time_ns() // 1000


def alloc(size, who, phase):
    if not RECORDING[0]:
        return
    # The block the caching allocator would hand out, as its entries give it.
    size = max(512, (size + 511) // 512 * 512)
    addr = NEXT_ADDR[0]
    NEXT_ADDR[0] += size
    ENTRIES.append({"action": "alloc", "addr": addr, "size": size, "stream": 0, "time_us": now_us(), "frames": []})
    FACTS["allocs"].append({"size": size, "who": who, "phase": phase})


# The recorder's ranges, seen as PyTorch's recorder keeps them.
enter_range, exit_range = rec.enter_range, rec.exit_range


def enter(name, args):
    handle = enter_range(name, args)
    OPEN[id(handle)] = name
    ANNOTATIONS.append({"name": name, "stage": "START", "device": 0, "time_us": now_us()})
    return handle


def leave(handle):
    ANNOTATIONS.append({"name": OPEN.pop(id(handle), "?"), "stage": "END", "device": 0, "time_us": now_us()})
    exit_range(handle)


rec.enter_range, rec.leave_range = enter, leave
rec.exit_range = leave


def record_memory_history(enabled="all", **kwargs):
    RECORDING[0] = enabled is not None
    if kwargs.get("clear_history"):
        ENTRIES.clear()


def snapshot():
    return {"device_traces": [list(ENTRIES)], "external_annotations": list(ANNOTATIONS), "segments": [], "allocator_settings": {}}


torch.cuda.is_initialized = lambda: True
torch.cuda.device_count = lambda: 1
torch.cuda.memory._record_memory_history = record_memory_history
torch.cuda.memory._snapshot = snapshot
torch._C._cuda_memoryStats = lambda d: {"allocation": {"all": {"allocated": len(ENTRIES)}}}


class Linear(torch.nn.Linear):
    """A leaf whose output is allocated inside its own forward (global forward hooks, the
    recorder's among them, run before a module's own, so a hook would be too late)."""

    def forward(self, x):
        out = super().forward(x)
        alloc(out.numel() * out.element_size(), PATHS[self], "forward")
        return out


class Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.up = Linear(width, 2 * width)
        self.down = Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(16) for _ in range(3)])
        self.head = Linear(16, 4)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


torch.manual_seed(0)
model = Net()
PATHS = {m: n for n, m in model.named_modules() if n}
for name, p in model.named_parameters():
    p.register_hook(lambda g, name=name: alloc(g.numel() * g.element_size(), f"grad:{name}", "backward") or None)


class Adam(torch.optim.Adam):
    @torch.no_grad()
    def step(self, closure=None):
        fresh = [p for g in self.param_groups for p in g["params"] if p.grad is not None and p not in self.state]
        out = super().step(closure)
        for p in fresh:
            for t in self.state[p].values():
                if torch.is_tensor(t) and t.dim() > 0:
                    alloc(t.numel() * t.element_size(), "state", "optimizer")
        return out


opt = Adam(model.parameters(), lr=1e-3)
x, y = torch.randn(8, 16), torch.randn(8, 4)
for step in range(3):
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    FACTS["steps"] += 1
FACTS["loss"] = loss.item()
FACTS["notes"] = list(rec.notes)
print("FACTS " + json.dumps(FACTS), flush=True)
