"""A loop that keeps every batch in a list until it runs out of memory: `collector trace
--holders=python` names the list holding them at the out-of-memory error, with no mark made
(collector/tests/python_cpu.rs; tests/gpu/holders.sh on a GPU). On a GPU the allocator runs out
for real; the CPU allocator raises no out-of-memory error, so there the program raises
`torch.OutOfMemoryError` itself, as torch does from C++."""
import argparse

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    keep = []
    try:
        if a.device == "cpu":
            for _ in range(4):
                keep.append(torch.zeros(64 << 10))  # 256 KiB each
            raise torch.OutOfMemoryError("simulated: the CPU allocator raises no out-of-memory error")
        _, total = torch.cuda.mem_get_info()
        while True:
            keep.append(torch.empty(total // 8, dtype=torch.uint8, device=a.device))
    except torch.OutOfMemoryError:
        print(f"OOM after {len(keep)} batches")
        # What PyTorch says the list holds, for tests/gpu to set beside `collector why --at oom`.
        held = sum(t.untyped_storage().nbytes() for t in keep)
        allocated = torch.cuda.memory_allocated() if a.device != "cpu" else 0
        print(f"held by keep: {held} bytes; torch.cuda.memory_allocated: {allocated}")


if __name__ == "__main__":
    main()
