"""torch.compile and torch.export, traced or not, must behave the same: one case per run
(`compile_parity.py CASE`), printing one JSON line with dynamo's own counters (graph breaks,
unique graphs, recompiles, frames), the outputs' checksum and whether dynamo warned, which
collector/tests/python_cpu.rs compares between a plain run and `collector trace`.

Its blocks make hidden activations of sizes no other block makes (block i: 64 * (i + 2)
features), so a trace can tell which block each allocation came from.

CASE: module_fullgraph, module, function_fullgraph, method_compile, early_dynamo,
api_after_compile, train_fullgraph, train (default mode), graph_break (one the program makes), export, all (each in turn, in one process, with dynamo
imported before the first module call). `--backend NAME` compiles with another backend than
Inductor (`aot_eager`: dynamo and AOTAutograd alike, without Inductor's C++ compile);
`--device cuda` runs it on the GPU.
"""
import io
import json
import logging
import sys

BACKEND = "inductor"
if "--backend" in sys.argv:
    i = sys.argv.index("--backend")
    BACKEND = sys.argv[i + 1]
    del sys.argv[i : i + 2]
DEVICE = "cpu"
if "--device" in sys.argv:
    i = sys.argv.index("--device")
    DEVICE = sys.argv[i + 1]
    del sys.argv[i : i + 2]
EARLY = len(sys.argv) > 1 and sys.argv[1] in ("early_dynamo", "all")
if EARLY:
    import torch._dynamo  # noqa: F401  (imported before the first module call)

import torch
import torch.nn as nn

torch.manual_seed(0)
WIDTH = 48


class Block(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.up = nn.Linear(WIDTH, hidden)
        self.act = nn.GELU()
        self.down = nn.Linear(hidden, WIDTH)

    def forward(self, x):
        return x + self.down(self.act(self.up(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block(64 * (i + 2)) for i in range(4))
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def batch(n=32):
    return torch.randn(n, WIDTH).to(DEVICE)


def counters():
    from torch._dynamo.utils import counters as c
    return {
        "graph_breaks": sum(c["graph_break"].values()),
        "unique_graphs": c["stats"].get("unique_graphs", 0),
        "calls_captured": c["stats"].get("calls_captured", 0),
        "frames_ok": c["frames"].get("ok", 0),
        "recompiles": sum(c["recompiles"].values()) if "recompiles" in c else 0,
    }


def run(case):
    model = Net().to(DEVICE)
    if case == "module_fullgraph":
        f = torch.compile(model, fullgraph=True, backend=BACKEND)
        outs = [f(batch()) for _ in range(3)]
    elif case == "module":
        f = torch.compile(model, backend=BACKEND)
        outs = [f(batch()) for _ in range(3)]
    elif case == "function_fullgraph":
        loss_fn = nn.MSELoss()

        @torch.compile(fullgraph=True, backend=BACKEND)
        def step(x, y):
            return loss_fn(model(x), y)

        outs = [step(batch(), torch.randn(32, 10).to(DEVICE)) for _ in range(3)]
    elif case == "method_compile":
        model.compile(fullgraph=True, backend=BACKEND)
        outs = [model(batch()) for _ in range(3)]
    elif case == "early_dynamo":
        f = torch.compile(model, fullgraph=True, backend=BACKEND)
        outs = [f(batch()) for _ in range(2)] + [model(batch())]
    elif case == "api_after_compile":
        # Compiled and run before a tracer starts (the MemoryTracer API, when importable),
        # then run while it traces: no recompilation, no break.
        f = torch.compile(model, fullgraph=True, backend=BACKEND)
        outs = [f(batch())]
        try:
            from memory_tracer import MemoryTracer
        except ImportError:
            MemoryTracer = None
        if MemoryTracer is not None and not __import__("memory_tracer").is_tracing():
            tracer = MemoryTracer(device=DEVICE)
            with tracer.trace(model):
                outs.append(f(batch()))
            print(f"TRACED {int(tracer.get_summary()['total_allocations'] > 0)}")
        else:
            outs.append(f(batch()))
    elif case in ("train_fullgraph", "train"):
        f = torch.compile(model, fullgraph=case == "train_fullgraph", backend=BACKEND)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        outs = []
        for _ in range(3):
            loss = f(batch()).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            outs.append(loss.detach())
    elif case == "graph_break":
        # A break the program makes itself: the modules around it run eagerly inside the
        # compiled function, the path where a tracer's own frames would show.
        def step(x):
            y = model.blocks[0](x)
            torch._dynamo.graph_break()
            return model.head(model.blocks[1](y))

        f = torch.compile(step, backend=BACKEND)
        outs = [f(batch()) for _ in range(3)]
    elif case == "export":
        ep = torch.export.export(model, (batch(),))
        outs = [ep.module()(batch()) for _ in range(2)]
    else:
        raise SystemExit(f"unknown case {case!r}")
    return float(sum(o.detach().double().sum() for o in outs))


def main():
    cases = sys.argv[1:] or ["module_fullgraph"]
    if cases == ["all"]:
        cases = ["module_fullgraph", "module", "function_fullgraph", "method_compile", "api_after_compile", "train_fullgraph", "graph_break", "export"]
    # Dynamo's warnings go to its loggers (and warnings.warn): both are collected.
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    logging.getLogger("torch._dynamo").addHandler(handler)
    import warnings
    result = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for case in cases:
            torch.manual_seed(0)
            result[case] = round(run(case), 3)
    result["counters"] = counters()
    text = log.getvalue() + "".join(str(w.message) for w in caught)
    result["dynamo_warned"] = [line for line in text.splitlines() if "Dynamo" in line or "graph break" in line.lower()][:5]
    print("PARITY " + json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
