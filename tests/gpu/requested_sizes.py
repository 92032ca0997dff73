"""Allocations of known byte sizes, for the requested sizes of native traces (issue 48): each
`torch.empty(n, dtype=torch.uint8)` asks the caching allocator for exactly n bytes, which it
rounds up to a block. Prints `ASKED [n, ...]` (in the order asked) and `COUNTERS {json}`.

    collector trace -o requested.mtrace.json -- python requested_sizes.py
"""
import json

import torch

MIB = 1 << 20
# Small-pool sizes (rounded to 512), large-pool sizes (rounded to 512 above 1 MiB), a block
# cut from a cached segment, and a request served whole by a cached block larger than it.
SIZES = [1, 511, 513, 4096, 1000, 1 * MIB + 1, 3 * MIB, 5 * MIB + 12345, 21 * MIB + 7]


def main():
    torch.cuda.init()
    dev = torch.device("cuda")
    asked, keep = [], []
    for n in SIZES:
        keep.append(torch.empty(n, dtype=torch.uint8, device=dev))
        asked.append(n)
    # A 3 MiB block freed, then 2.5 MiB asked: less than 1 MiB would remain, so the whole
    # cached block serves it (its block is 3 MiB, its request 2.5 MiB).
    keep[6] = None
    keep.append(torch.empty(5 * MIB // 2, dtype=torch.uint8, device=dev))
    asked.append(5 * MIB // 2)
    # Through an operator: a float32 sum of 1000 elements asks for 4 bytes.
    x = torch.ones(1000, device=dev)
    asked.append(4000)
    s = x.sum()
    asked.append(4)
    torch.cuda.synchronize()
    print("ASKED " + json.dumps(asked), flush=True)
    print("COUNTERS " + json.dumps({
        "torch": torch.__version__,
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "sum": float(s),
    }), flush=True)


if __name__ == "__main__":
    main()
