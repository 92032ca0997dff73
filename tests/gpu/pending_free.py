"""A real snapshot of a free that waits for another stream (`record_stream`), for
tests/data/pending_free_real.pickle.gz (shared/tests/holders.rs): a 64 MiB tensor read on a side
stream kept busy for about two seconds, freed on the main stream (free_requested) while that
stream still runs, an allocation made while the free is pending, then, once both streams are
done, an allocation that lets the allocator complete the free (free_completed). The side
stream's blocks are cached first: a cudaMalloc while it runs would wait for it.
    python tests/gpu/pending_free.py OUT.pickle
    collector trace --holders -o T.mtrace.json -- python tests/gpu/pending_free.py --mark
      (no recording of PyTorch's own; a mark `after_free` just after the free, where
      `collector why --at after_free T.mtrace.json` names the pending free)
Prints the block's state just after the free (PyTorch's own snapshot) and PyTorch's counters
at the end: max_memory_allocated, memory_allocated, memory_reserved."""
import sys

import torch


def main():
    out = None if sys.argv[1] == "--mark" else sys.argv[1]
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.empty(16 << 20, device="cuda")  # freed at once: a 64 MiB block cached for the side stream
    torch.cuda.synchronize()
    if out:
        torch.cuda.memory._record_memory_history(max_entries=100_000, stacks="python")
    x = torch.ones(16 << 20, device="cuda")  # 64 MiB
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(4_000_000_000)  # about two seconds of GPU cycles
        y = x * 2
    x.record_stream(side)
    ptr = x.data_ptr()
    del x  # free_requested: the side stream still reads it
    state = [b["state"] for s in torch.cuda.memory_snapshot() for b in s["blocks"] if s["address"] <= ptr < s["address"] + s["total_size"]]
    print("after the free:", state)
    if not out:
        import memory_tracer

        memory_tracer.mark("after_free")
    z = torch.empty(8 << 20, device="cuda")  # allocated while the free is pending
    torch.cuda.synchronize()
    w = torch.empty(8 << 20, device="cuda")  # the allocator finds the side stream done: free_completed
    if out:
        torch.cuda.memory._dump_snapshot(out)
        torch.cuda.memory._record_memory_history(enabled=None)
    print(torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated(), torch.cuda.memory_reserved())
    del y, z, w


if __name__ == "__main__":
    main()
