"""What the device and PyTorch's CUDA allocator say beside the capture's own records: the
driver's used memory sampled while the program runs (`DeviceSampler`, with the ledger NVML's
bytes of the process too), and at the end each device's allocator counters (`cuda_stats`) and
the segments of private pools (`private_pool_segments`). Each asks CUDA only where the process
already initialised it, and never raises into the program."""

import threading

# How often the driver's used memory is sampled (DeviceSampler), in seconds.
DEVICE_SAMPLE_S = 0.1
# The ledger watches first launches (each launch then costs microseconds) until this long, and
# LEDGER_QUIET_LAUNCHES launches, passed with no function launched for the first time.
LEDGER_QUIET_S = 2.0
LEDGER_QUIET_LAUNCHES = 1000


class DeviceSampler:
    """The driver's used and total memory (cudaMemGetInfo) of every CUDA device this process
    holds memory on, every `interval` seconds, on the shim's clock: what the allocator never
    sees (CUDA context, NCCL, cuBLAS workspaces) is the gap to PyTorch's reserved bytes.

    Devices the process has not allocated on are skipped: asking them would create a CUDA
    context there. At most `limit` samples are kept; past it every other one is dropped."""

    def __init__(self, lib, interval, nvml=None, limit=100_000, settle=None):
        self.lib = lib
        self.settle = settle  # with the ledger: told when first launches stop being watched
        self.interval = interval
        self.limit = limit
        self.samples = []
        self.nvml = nvml  # with the ledger: NVML's bytes of this process and of the others
        self.process = []
        self.every = 1
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, name="memory-tracer-device-sampler", daemon=True)
        self.thread.start()

    def run(self):
        import torch

        n = 0
        while not self.stopping.wait(self.interval):
            try:
                if self.settle is not None and self.lib.mt_ledger_settle(int(LEDGER_QUIET_S * 1e9), LEDGER_QUIET_LAUNCHES) == 1:
                    self.settle(self.lib.mt_now_ns())
                    self.settle = None
                if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
                    continue
                for d in range(torch.cuda.device_count()):
                    if torch.cuda.memory_reserved(d) == 0:
                        continue
                    free, total = torch.cuda.mem_get_info(d)
                    n += 1
                    if n % self.every == 0:
                        now = self.lib.mt_now_ns()
                        self.samples.append((now, d, total - free, total))
                        usage = self.nvml.usage(d) if self.nvml is not None else None
                        if usage is not None:
                            self.process.append((now, d, usage[0], usage[1]))
                if len(self.samples) >= self.limit:
                    self.samples = self.samples[::2]
                    self.process = self.process[::2]
                    self.every *= 2
            except Exception:  # a device gone bad: stop sampling, keep the program running
                return

    def stop(self):
        self.stopping.set()
        self.thread.join(timeout=2 * self.interval + 1)
        return list(self.samples)


def private_pool_segments(limit=100000):
    """The CUDA allocator's segments of private pools (CUDA graphs, `torch.cuda.MemPool`) at
    the end: the collector gives the allocations made inside them their pool."""
    import torch

    out = []
    try:
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return out
        for seg in torch.cuda.memory_snapshot():
            pool = tuple(seg.get("segment_pool_id") or (0, 0))
            if pool == (0, 0) or len(pool) != 2:
                continue
            out.append({"device": int(seg["device"]), "address": int(seg["address"]), "size": int(seg["total_size"]), "pool": [int(pool[0]), int(pool[1])]})
            if len(out) >= limit:
                break
    except Exception:
        pass
    return out


def cuda_stats():
    import torch

    out = []
    try:
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return out
        for d in range(torch.cuda.device_count()):
            s = torch.cuda.memory_stats(d)
            if not s or s.get("allocated_bytes.all.peak", 0) == 0:
                continue
            props = torch.cuda.get_device_properties(d)
            out.append({
                "device": d,
                "name": props.name,
                "total_memory": props.total_memory,
                "allocated_current": s.get("allocated_bytes.all.current", 0),
                "allocated_peak": s.get("allocated_bytes.all.peak", 0),
                "reserved_current": s.get("reserved_bytes.all.current", 0),
                "reserved_peak": s.get("reserved_bytes.all.peak", 0),
                "num_alloc_retries": s.get("num_alloc_retries", 0),
                "num_ooms": s.get("num_ooms", 0),
            })
    except Exception as e:
        out.append({"error": str(e)})
    return out
