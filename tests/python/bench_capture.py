"""What the capture costs inside a Python process, on this machine's CPU (run by
`cargo xtask bench`): per operator (memory only, autograd nodes, every operator, with
tensors) and per nn.Module call (the module scopes), medians of 5 runs, untraced vs traced
in the same process. Needs PYTHONPATH to hold the memory_tracer package (with its _lib)."""
import os
import socket
import statistics
import threading
import time

import torch
import torch.nn as nn

from memory_tracer import _capture, _shim


def sink():
    a, b = socket.socketpair()
    threading.Thread(target=lambda: [None for _ in iter(lambda: b.recv(1 << 20), b"")], daemon=True).start()
    return a


def per_call_ns(fn, calls, runs=5):
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) / calls * 1e9)
    return statistics.median(out)


def main():
    lib = _shim.load()
    x = torch.zeros(4)

    def ops():
        y = x
        for _ in range(20000):
            y = y.add(1)

    base = per_call_ns(ops, 20000)
    print(f"operator (x.add(1), allocates): untraced {base:.0f} ns")
    for name, options in [("memory only", {"capture_ops": 0}), ("autograd nodes (default)", {"capture_ops": 2}), ("every operator", {"capture_ops": 1, "capture_tensors": False}), ("every operator + tensors", {"capture_ops": 1, "capture_tensors": True})]:
        cap = _capture.begin(lib, sink().detach(), options, "api", {"mode": "bench"})
        traced = per_call_ns(ops, 20000)
        cap.finish("bench")
        print(f"  {name:<26} +{traced - base:.0f} ns per operator")

    class Tiny(nn.Module):
        def forward(self, v):
            return v

    model = nn.Sequential(*[Tiny() for _ in range(200)])

    def calls():
        for _ in range(100):
            model(x)

    base = per_call_ns(calls, 100 * 201)
    cap = _capture.begin(lib, sink().detach(), {"capture_ops": 0}, "api", {"mode": "bench"})
    traced = per_call_ns(calls, 100 * 201)
    cap.finish("bench")
    print(f"nn.Module call: untraced {base:.0f} ns, +{traced - base:.0f} ns with module scopes")


if __name__ == "__main__":
    main()
