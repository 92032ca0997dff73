"""Writes synthetic CUDA memory snapshots in the layouts PyTorch 2.12 to 2.15 write
(torch.cuda.memory._dump_snapshot), hostile variants of them, and the results an importer must
give for each, computed here by simulating PyTorch's caching allocators (independently of any
importer):

- layout_2_12.pickle: one device; default pool (0,0) and a CUDA-graph private pool (0,1) with
  its own segments; `pool_id` on every entry; memory allocated before recording; segments freed
  by empty_cache and an address range cudaMalloc hands out again.
- layout_2_13.pickle: as 2.12 on two devices, 2.13's allocator_settings (max_round_threshold,
  max_cached_size) and user_metadata "phase=warmup" on a stretch of entries.
- layout_2_14.pickle: `annotate` entries (one on an allocation freed later, several alive at
  the end), pinned host memory (`host_segments`, one flat `host_traces`: cached blocks reused, a
  segment freed by empty_cache), external_annotations, a MemPool-style private pool (1,0).
- layout_2_15.pickle (protocol 5, as Python 3.14's default writes) and
  layout_2_15.protocol4.pickle (the same dict at protocol 4): everything of 2.14 on two
  devices, plus `internal_metadata` "mallocWithAddress" alloc/free pairs, user_metadata as
  compact JSON text, and pinned memory allocated before recording.
- layout_bad_pool_arity.pickle, layout_bad_annotate.pickle, layout_host_traces_only.pickle,
  layout_pool_mismatch.pickle: small valid-looking 2.14/2.15 snapshots with one defect each.
- snapshot_layouts.expected.json: per file, per device the peak and final allocated bytes (sum
  of allocated block sizes) and reserved bytes (sum of segment sizes), the same per pool, pinned
  host memory apart (never added to a GPU's), the annotations, the count of entries per
  non-empty user_metadata text, the count of entries with internal_metadata, and the defects an
  importer must report as notes.

Every generation checks what it wrote against the simulation (check_written). A snapshot with
one user_metadata text of MB MiB (the importer's test of huge strings) is written only on demand:
Run: python3 tests/data/snapshot_layouts.gen.py   (writes next to itself; no randomness)
     python3 tests/data/snapshot_layouts.gen.py --huge PATH MB"""
import json
import os
import pickle
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
KIB, MIB = 1 << 10, 1 << 20
DEFAULT = (0, 0)
T0 = 1_800_000_000_000_000  # time_us near the real samples' (a CLOCK_REALTIME in µs)
DEVICE_BASE = {0: 0x7F4A00000000, 1: 0x7E1200000000}
HOST_BASE = 0x7F2C00000000
MALLOC_WITH_ADDRESS = "mallocWithAddress"

# Frames are (name, filename, line); their dicts are written name, filename, line, as PyTorch does.
F = {
    "load": [("load_weights", "train.py", 12), ("<module>", "train.py", 118)],
    "fwd": [("forward", "model.py", 31), ("train_step", "train.py", 57), ("<module>", "train.py", 118)],
    "bwd": [("backward", "train.py", 61), ("<module>", "train.py", 118)],
    "opt": [("step", "optim.py", 19), ("train_step", "train.py", 64)],
    "graph": [("capture", "graphs.py", 23), ("<module>", "train.py", 101)],
    "pin": [("pin_batch", "data.py", 44), ("__next__", "data.py", 70), ("<module>", "train.py", 118)],
    "ann": [("annotate", "train.py", 75)],
    "cache": [("empty_cache", "train.py", 90)],
    "internal": [("_alloc_with_address", "allocator.py", 8)],
}


def round_size(size):
    """CUDACachingAllocator's round_size (no roundup_power2_divisions): multiples of 512."""
    return 512 if size < 512 else (size + 511) // 512 * 512


def allocation_size(rounded):
    """CUDACachingAllocator's get_allocation_size: the size of a new segment."""
    if rounded <= MIB:
        return 2 * MIB
    if rounded < 10 * MIB:
        return 20 * MIB
    return (rounded + 2 * MIB - 1) // (2 * MIB) * (2 * MIB)


def pool_key(pool):
    return f"{pool[0]},{pool[1]}"


def jtext(value):
    """user_metadata as 2.15 serializes a dict: compact JSON."""
    return json.dumps(value, separators=(",", ":"))


class Block:
    __slots__ = ("addr", "size", "state", "req", "frames")

    def __init__(self, addr, size, state="inactive", req=0, frames=()):
        self.addr, self.size, self.state, self.req, self.frames = addr, size, state, req, frames


class Segment:
    def __init__(self, device, addr, size, kind, pool, frames):
        self.device, self.addr, self.size, self.kind, self.pool = device, addr, size, kind, pool
        self.stream, self.frames = 0, frames
        self.blocks = [Block(addr, size)]

    def allocated(self):
        return sum(b.size for b in self.blocks if b.state == "active_allocated")


class AddressSpace:
    """cudaMalloc / cudaHostAlloc stand-in: first fit in a free list, so a freed range is handed
    out again (a later segment at a freed segment's address)."""

    def __init__(self, base):
        self.free = [(base, 1 << 36)]

    def take(self, size):
        for k, (a, s) in enumerate(self.free):
            if s >= size:
                self.free[k] = (a + size, s - size)
                return a
        raise AssertionError("address space exhausted")

    def give(self, addr, size):
        self.free.append((addr, size))
        self.free.sort()
        merged = []
        for a, s in self.free:
            if merged and merged[-1][0] + merged[-1][1] == a:
                merged[-1] = (merged[-1][0], merged[-1][1] + s)
            else:
                merged.append((a, s))
        self.free = merged


class Sim:
    """PyTorch's CUDA caching allocator (best fit, split rules, merging, empty_cache) and its
    pinned host allocator (power-of-two blocks, one per segment, cached when freed), writing the
    trace entries PyTorch `version` (12 to 15, as 2.<version>) writes while recording."""

    def __init__(self, version, devices=(0,), host=False):
        self.version = version
        self.devices = list(devices)
        self.n, self.t = 0, T0
        self.recording = False
        self.metadata = ""
        self.segs = {d: [] for d in self.devices}
        self.space = {d: AddressSpace(DEVICE_BASE[d]) for d in self.devices}
        self.traces = {d: [] for d in self.devices}
        self.host = host
        self.host_segs = []
        self.host_space = AddressSpace(HOST_BASE)
        self.host_trace = []
        self.live = {}  # (device, addr) -> the alloc entry (device -1: host)
        self.annotations, self.defects, self.external = [], [], []
        self.peaks = {}  # name -> [peak, time_us of the entry that first reached it]
        self.before = None
        self.whole_region_takes = 0  # allocations that took a free region bigger than rounded
        self.pairs = []

    # -- clock and entries -------------------------------------------------------------------
    def now(self):
        self.n += 1
        self.t += 3 + (self.n * 37) % 41
        return self.t

    def entry(self, device, action, addr, size, frames, pool=DEFAULT, metadata=None, internal=None,
              stream=0):
        """Key order as the real samples beside this script show it (action, addr, size, stream,
        time_us, compile_context, user_metadata, frames); where pool_id and internal_metadata go
        is inferred (added after user_metadata, frames still last since PyTorch fills them in
        after gathering the entry)."""
        if not self.recording:
            return None
        e = {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": self.now(),
             "compile_context": "N/A",
             "user_metadata": self.metadata if metadata is None else metadata}
        if self.version >= 12:
            e["pool_id"] = (pool[0], pool[1])  # a tuple of its own, as each entry's is
        if internal is not None:
            e["internal_metadata"] = internal
        e["frames"] = [{"name": n, "filename": f, "line": ln} for n, f, ln in frames]
        (self.host_trace if device < 0 else self.traces[device]).append(e)
        self.measure(e["time_us"])
        return e

    # -- totals ------------------------------------------------------------------------------
    def totals(self):
        out = {}
        for d in self.devices:
            out[f"dev{d}.allocated"] = sum(s.allocated() for s in self.segs[d])
            out[f"dev{d}.reserved"] = sum(s.size for s in self.segs[d])
            for s in self.segs[d]:
                k = f"dev{d}.pool{pool_key(s.pool)}"
                out[k + ".allocated"] = out.get(k + ".allocated", 0) + s.allocated()
                out[k + ".reserved"] = out.get(k + ".reserved", 0) + s.size
        if self.host:
            out["host.allocated"] = sum(s.allocated() for s in self.host_segs)
            out["host.reserved"] = sum(s.size for s in self.host_segs)
        return out

    def measure(self, time_us):
        for k, v in self.totals().items():
            p = self.peaks.setdefault(k, [0, None])
            if v > p[0]:
                p[0], p[1] = v, time_us

    def start_recording(self):
        self.recording = True
        self.before = self.totals()
        self.peaks = {k: [v, None] for k, v in self.before.items()}

    def set_metadata(self, text):
        self.metadata = text

    def mark(self, stage, name, device=0):
        """An external annotation (record_function-style span edge) at the current time."""
        self.external.append({"stage": stage, "name": name, "device": device, "time_us": self.now()})

    # -- the CUDA caching allocator ----------------------------------------------------------
    def malloc(self, device, req, frames, pool=DEFAULT, internal=None):
        rounded = round_size(req)
        kind = "small" if rounded <= MIB else "large"
        fits = [(b.size, b.addr, s, k) for s in self.segs[device] if s.pool == pool and s.kind == kind
                and s.stream == 0 for k, b in enumerate(s.blocks) if b.state == "inactive" and b.size >= rounded]
        if fits:
            _, _, seg, k = min(fits, key=lambda f: (f[0], f[1]))
        else:
            size = allocation_size(rounded)
            seg = Segment(device, self.space[device].take(size), size, kind, pool, frames)
            self.segs[device].append(seg)
            self.segs[device].sort(key=lambda s: s.addr)
            self.entry(device, "segment_alloc", seg.addr, size, frames, pool, internal=internal)
            k = 0
        block = seg.blocks[k]
        rest = block.size - rounded
        if (kind == "small" and rest >= 512) or (kind == "large" and rest > MIB):
            seg.blocks.insert(k + 1, Block(block.addr + rounded, rest))
            block.size = rounded
        elif rest:
            self.whole_region_takes += 1
        block.state, block.req, block.frames = "active_allocated", req, frames
        e = self.entry(device, "alloc", block.addr, req, frames, pool, internal=internal)
        self.live[(device, block.addr)] = {"entry": e, "pool": pool, "req": req, "block": block.size}
        return block.addr

    def find(self, device, addr):
        for s in self.segs[device]:
            for k, b in enumerate(s.blocks):
                if b.addr == addr:
                    return s, k
        raise AssertionError(f"no block at {addr:#x}")

    def free(self, device, addr, frames=None, internal=None):
        seg, k = self.find(device, addr)
        block = seg.blocks[k]
        assert block.state == "active_allocated"
        info = self.live.pop((device, addr))
        fr = frames if frames is not None else F["fwd"][:1]
        block.state, block.frames = "inactive", ()
        # Merge with free neighbours in the same segment (the lower block absorbs the higher).
        if k + 1 < len(seg.blocks) and seg.blocks[k + 1].state == "inactive":
            block.size += seg.blocks.pop(k + 1).size
        if k > 0 and seg.blocks[k - 1].state == "inactive":
            seg.blocks[k - 1].size += seg.blocks.pop(k).size
        e1 = self.entry(device, "free_requested", addr, info["req"], fr, info["pool"], internal=internal)
        e2 = self.entry(device, "free_completed", addr, info["req"], fr, info["pool"], internal=internal)
        return e1, e2

    def internal_pair(self, device, req):
        """2.15's allocator-internal alloc immediately followed by its free, all tagged."""
        before = self.totals()
        n_segs = len(self.segs[device])
        addr = self.malloc(device, req, F["internal"], internal=MALLOC_WITH_ADDRESS)
        assert len(self.segs[device]) == n_segs, "an internal pair must not make a segment"
        self.free(device, addr, F["internal"], internal=MALLOC_WITH_ADDRESS)
        self.pairs.append((device, before[f"dev{device}.allocated"] + round_size(req)))
        return addr

    def empty_cache(self, device, pools=(DEFAULT,)):
        for s in list(self.segs[device]):
            if s.pool in pools and len(s.blocks) == 1 and s.blocks[0].state == "inactive":
                self.segs[device].remove(s)
                self.space[device].give(s.addr, s.size)
                self.entry(device, "segment_free", s.addr, s.size, F["cache"], s.pool)

    def annotate(self, device, addr, text, valid=True):
        """2.14's annotate entry: addr is a live allocation's base address, user_metadata the
        text. Its size is written as 0 (not the allocation's size), its pool_id as the
        allocation's pool."""
        info = self.live.get((device, addr))
        assert (info is not None) == valid
        e = self.entry(device, "annotate", addr, 0, F["ann"], info["pool"] if info else DEFAULT, metadata=text)
        if valid:
            a = info["entry"]
            self.annotations.append({"device": device, "address": addr, "text": text, "time_us": e["time_us"],
                                     "alloc_time_us": a["time_us"], "alloc_size": a["size"],
                                     "alloc_block_size": info["block"]})
        return e

    # -- the pinned host allocator -----------------------------------------------------------
    def host_malloc(self, size, frames=F["pin"]):
        assert size & (size - 1) == 0, "host entries carry power-of-two sizes"
        cached = [s for s in self.host_segs if s.size == size and s.blocks[0].state == "inactive"]
        if cached:
            seg = min(cached, key=lambda s: s.addr)
        else:
            seg = Segment(-1, self.host_space.take(size), size, "large", DEFAULT, frames)
            self.host_segs.append(seg)
            self.host_segs.sort(key=lambda s: s.addr)
            self.entry(-1, "segment_alloc", seg.addr, size, frames)
        b = seg.blocks[0]
        b.state, b.req, b.frames = "active_allocated", size, frames
        e = self.entry(-1, "alloc", seg.addr, size, frames)
        self.live[(-1, seg.addr)] = {"entry": e, "pool": DEFAULT, "req": size, "block": size}
        return seg.addr

    def host_free(self, addr):
        seg = next(s for s in self.host_segs if s.addr == addr)
        assert seg.blocks[0].state == "active_allocated"
        del self.live[(-1, addr)]
        seg.blocks[0].state, seg.blocks[0].frames = "inactive", ()
        self.entry(-1, "free_requested", addr, seg.size, F["pin"][:1])
        self.entry(-1, "free_completed", addr, seg.size, F["pin"][:1])

    def host_empty_cache(self):
        for s in list(self.host_segs):
            if s.blocks[0].state == "inactive":
                self.host_segs.remove(s)
                self.host_space.give(s.addr, s.size)
                self.entry(-1, "segment_free", s.addr, s.size, F["cache"])

    # -- the snapshot dict -------------------------------------------------------------------
    @staticmethod
    def segment_dict(s, device):
        def fr(frames):
            return [{"name": n, "filename": f, "line": ln} for n, f, ln in frames]
        blocks = [{"address": b.addr, "size": b.size, "requested_size": b.req, "state": b.state,
                   "frames": fr(b.frames)} for b in s.blocks]
        alloc = s.allocated()
        return {"device": device, "address": s.addr, "total_size": s.size, "allocated_size": alloc,
                "active_size": alloc,
                "requested_size": sum(b.req for b in s.blocks if b.state == "active_allocated"),
                "stream": 0, "segment_type": s.kind, "segment_pool_id": (s.pool[0], s.pool[1]), "is_expandable": False,
                "frames": fr(s.frames), "blocks": blocks}

    def snapshot(self):
        """Top-level key order: the real samples' (segments, device_traces, allocator_settings,
        external_annotations), with 2.14's host keys inferred to come after them."""
        snap = {"segments": [self.segment_dict(s, d) for d in self.devices for s in self.segs[d]],
                "device_traces": [self.traces.get(d, []) for d in range(max(self.devices) + 1)],
                "allocator_settings": allocator_settings(self.version)}
        if self.external:
            snap["external_annotations"] = self.external
        if self.host:
            snap["host_segments"] = [self.segment_dict(s, -1) for s in self.host_segs]
            snap["host_traces"] = self.host_trace
        return snap

    def expected(self, name, protocol):
        final = self.totals()

        def peak(key):
            return self.peaks[key][0]

        devices = {}
        for d in self.devices:
            pools = sorted({k.split(".pool")[1].split(".")[0] for k in self.peaks if k.startswith(f"dev{d}.pool")})
            devices[str(d)] = {
                "peak_allocated": peak(f"dev{d}.allocated"),
                "peak_allocated_time_us": self.peaks[f"dev{d}.allocated"][1],
                "final_allocated": final[f"dev{d}.allocated"],
                "peak_reserved": peak(f"dev{d}.reserved"),
                "final_reserved": final[f"dev{d}.reserved"],
                "allocated_before_recording": self.before[f"dev{d}.allocated"],
                "reserved_before_recording": self.before[f"dev{d}.reserved"],
                "pools": {p: {"peak_allocated": peak(f"dev{d}.pool{p}.allocated"),
                              "peak_reserved": peak(f"dev{d}.pool{p}.reserved"),
                              "final_allocated": final.get(f"dev{d}.pool{p}.allocated", 0),
                              "final_reserved": final.get(f"dev{d}.pool{p}.reserved", 0)} for p in pools},
            }
        host = None
        if self.host:
            host = {"peak_allocated": peak("host.allocated"), "final_allocated": final["host.allocated"],
                    "peak_reserved": peak("host.reserved"), "final_reserved": final["host.reserved"],
                    "allocated_before_recording": self.before["host.allocated"],
                    "reserved_before_recording": self.before["host.reserved"]}
        counts = {}
        for e in [e for d in self.devices for e in self.traces[d]] + self.host_trace:
            if e["action"] != "annotate" and e["user_metadata"]:
                counts[e["user_metadata"]] = counts.get(e["user_metadata"], 0) + 1
        internal = sum(1 for d in self.devices for e in self.traces[d] if e.get("internal_metadata"))
        # The internal pairs change no peak: at each one, the device's allocated bytes with the
        # pair's block stay below its peak.
        for d, at in self.pairs:
            assert at < peak(f"dev{d}.allocated")
        return {"torch": f"2.{self.version}", "protocol": protocol,
                "entries": {"devices": {str(d): len(self.traces[d]) for d in self.devices},
                            "host": len(self.host_trace) if self.host else None},
                "devices": devices, "host": host, "annotations": self.annotations,
                "user_metadata_counts": counts, "internal_metadata_entries": internal,
                "defects": self.defects}


def allocator_settings(version):
    """The real samples' keys (torch 2.10/2.11) with, from 2.13, max_round_threshold and
    max_cached_size (their place in the dict is inferred)."""
    s = {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1, "garbage_collection_threshold": 0.0,
         "expandable_segments": False, "pinned_num_register_threads": 1, "release_lock_on_cudamalloc": False,
         "pinned_use_cuda_host_register": False, "graph_capture_record_stream_reuse": False,
         "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)}}
    if version >= 13:
        s["max_round_threshold"] = -1
        s["max_cached_size"] = -1
    return s


# -- scenarios -----------------------------------------------------------------------------------
def training_step(sim, d, step, keep):
    """One forward/backward/optimizer step on device d: large activations (one takes a whole
    free region, its remainder being ≤ 1 MiB), small temporaries, a >10 MiB gradient buffer."""
    a1 = sim.malloc(d, 6 * MIB, F["fwd"])
    a2 = sim.malloc(d, 5 * MIB, F["fwd"])
    t1 = sim.malloc(d, 70_000, F["fwd"])
    t2 = sim.malloc(d, 1_000, F["fwd"])
    a3 = sim.malloc(d, 2 * MIB + 512 * KIB, F["fwd"])
    sim.free(d, t1)
    g = sim.malloc(d, 24 * MIB + 100, F["bwd"])
    t3 = sim.malloc(d, 300 * KIB, F["bwd"])
    sim.free(d, a3, F["bwd"][:1])
    sim.free(d, a2, F["bwd"][:1])
    o = sim.malloc(d, 3 * MIB, F["opt"])
    sim.free(d, g, F["opt"][:1])
    sim.free(d, a1, F["opt"][:1])
    sim.free(d, t3, F["opt"][:1])
    sim.free(d, o, F["opt"][:1])
    keep.append(sim.malloc(d, 4096 * (step + 1), F["opt"]))  # optimizer state that stays
    sim.free(d, t2, F["opt"][:1])


def graph_capture(sim, d, pool):
    """A CUDA-graph capture: its allocations go to the private pool's own segments; one is freed
    during capture (stays cached in the pool), the rest are alive at the end."""
    g1 = sim.malloc(d, 1536 * KIB, F["graph"], pool)
    g2 = sim.malloc(d, 300 * KIB, F["graph"], pool)
    g3 = sim.malloc(d, 4 * MIB, F["graph"], pool)
    sim.free(d, g2, F["graph"][:1])
    g4 = sim.malloc(d, 100 * KIB, F["graph"], pool)
    return [g1, g3, g4]


def before_recording(sim, d):
    """Weights and a buffer allocated before recording: in the final segments, never in the trace."""
    w1 = sim.malloc(d, 8 * MIB, F["load"])
    w2 = sim.malloc(d, 3 * MIB + 1000, F["load"])
    b1 = sim.malloc(d, 4000, F["load"])
    return [w1, w2, b1]


def layout_2_12():
    sim = Sim(12)
    before_recording(sim, 0)
    sim.start_recording()
    keep = []
    for step in range(3):
        training_step(sim, 0, step, keep)
    graph_capture(sim, 0, (0, 1))
    sim.empty_cache(0)
    freed = [e["addr"] for e in sim.traces[0] if e["action"] == "segment_free"]
    keep.append(sim.malloc(0, 14 * MIB, F["fwd"]))  # a new 14 MiB segment where a freed one was
    assert sim.traces[0][-2]["action"] == "segment_alloc" and sim.traces[0][-2]["addr"] in freed
    assert sim.whole_region_takes >= 1
    return sim


def layout_2_13():
    sim = Sim(13, devices=(0, 1))
    before_recording(sim, 0)
    sim.start_recording()
    keep = []
    sim.set_metadata("phase=warmup")
    training_step(sim, 0, 0, keep)
    training_step(sim, 1, 0, keep)
    sim.set_metadata("")
    for step in range(1, 3):
        training_step(sim, 0, step, keep)
        training_step(sim, 1, step, keep)
    graph_capture(sim, 0, (0, 1))
    sim.empty_cache(0)
    sim.empty_cache(1)
    keep.append(sim.malloc(1, 12 * MIB, F["fwd"]))
    return sim


def pinned_traffic(sim):
    """Pinned batches: new segments, frees that keep the block cached, reuse of a cached segment
    of the same size, empty_cache freeing the unused ones."""
    h1 = sim.host_malloc(1 * MIB)
    h2 = sim.host_malloc(256 * KIB)
    h3 = sim.host_malloc(4 * MIB)
    sim.host_free(h1)
    sim.host_free(h2)
    h4 = sim.host_malloc(1 * MIB)  # reuses h1's segment
    assert h4 == h1
    sim.host_free(h3)
    return h4


def layout_2_14():
    sim = Sim(14, host=True)
    before_recording(sim, 0)
    sim.start_recording()
    sim.mark("START", "train_step")
    keep = []
    a = sim.malloc(0, 6 * MIB, F["fwd"])
    sim.annotate(0, a, "activation cache")  # freed later
    h = pinned_traffic(sim)
    training_step(sim, 0, 0, keep)
    sim.annotate(0, keep[-1], "optimizer state step 0")  # alive at the end
    sim.free(0, a, F["bwd"][:1])
    sim.mark("END", "train_step")
    sim.mark("START", "train_step")
    training_step(sim, 0, 1, keep)
    sim.host_empty_cache()  # frees h2's and h3's segments
    h5 = sim.host_malloc(64 * KIB)
    sim.host_free(h5)  # stays cached at the end
    g = graph_capture(sim, 0, (1, 0))
    sim.annotate(0, g[1], "graph output")  # alive at the end, private pool
    sim.annotate(0, keep[0], "optimizer state step 0 (moved)")  # a second annotate on one block
    sim.mark("END", "train_step")
    sim.empty_cache(0)
    assert h in [s.addr for s in sim.host_segs]
    return sim


def layout_2_15():
    sim = Sim(15, devices=(0, 1), host=True)
    before_recording(sim, 0)
    pre = sim.host_malloc(2 * MIB, F["load"])  # pinned before recording, alive at the end
    sim.start_recording()
    keep = []
    sim.mark("START", "warmup")
    sim.set_metadata("phase=warmup")
    training_step(sim, 1, 0, keep)
    sim.set_metadata("")
    sim.mark("END", "warmup")
    a = sim.malloc(0, 6 * MIB, F["fwd"])
    sim.annotate(0, a, "activation cache")
    h = pinned_traffic(sim)
    sim.set_metadata(jtext({"step": 3, "tag": "fwd"}))
    training_step(sim, 0, 0, keep)
    sim.set_metadata(jtext({"step": 3, "tag": "bwd"}))
    sim.annotate(0, keep[-1], jtext({"note": "optimizer state", "step": 3}))
    sim.free(0, a, F["bwd"][:1])
    sim.internal_pair(0, 512 * KIB)
    sim.set_metadata("")
    training_step(sim, 0, 1, keep)
    sim.internal_pair(0, 2 * MIB)
    sim.internal_pair(1, 4 * KIB)
    sim.host_empty_cache()
    g = graph_capture(sim, 0, (0, 1))
    sim.annotate(0, g[0], "graph input")
    sim.annotate(1, keep[0], "device 1 state")
    sim.empty_cache(0)
    sim.empty_cache(1)
    assert pre in [s.addr for s in sim.host_segs] and h in [s.addr for s in sim.host_segs]
    return sim


def small_base(version, annotate_ok=True):
    """The hostile files' base: a short valid snapshot with both pools, annotations and host."""
    sim = Sim(version, host=True)
    w = sim.malloc(0, 8 * MIB, F["load"])
    sim.start_recording()
    a = sim.malloc(0, 5 * MIB, F["fwd"])
    t = sim.malloc(0, 20_000, F["fwd"])
    sim.annotate(0, a, "activation")
    h1 = sim.host_malloc(512 * KIB)
    sim.free(0, t)
    b = sim.malloc(0, 2 * MIB, F["bwd"])
    sim.host_free(h1)
    g1 = sim.malloc(0, 600 * KIB, F["graph"], (0, 1))
    g2 = sim.malloc(0, 3 * MIB, F["graph"], (0, 1))
    sim.free(0, g1, F["graph"][:1])
    sim.host_malloc(512 * KIB)
    sim.free(0, a, F["bwd"][:1])
    if annotate_ok:
        sim.annotate(0, b, "gradient")
    return sim, {"w": w, "a": a, "t": t, "b": b, "g1": g1, "g2": g2}


def index_of(trace, e):
    return next(k for k, x in enumerate(trace) if x is e)


def bad_pool_arity():
    sim, _ = small_base(14)
    trace = sim.traces[0]
    alloc = next(e for e in trace if e["action"] == "alloc" and e["size"] == 20_000)
    freq = next(e for e in trace if e["action"] == "free_requested" and e["size"] == 5 * MIB)
    alloc["pool_id"] = (0, 0, 0)
    freq["pool_id"] = "0,0"
    sim.defects = [
        {"kind": "pool_id_not_a_pair", "device": 0, "entry_index": index_of(trace, alloc),
         "time_us": alloc["time_us"],
         "text": "the alloc entry's pool_id is the 3-tuple (0, 0, 0), not a pair of ints; "
                 "its block is in a default-pool (0,0) segment"},
        {"kind": "pool_id_not_a_pair", "device": 0, "entry_index": index_of(trace, freq),
         "time_us": freq["time_us"],
         "text": "the free_requested entry's pool_id is the string '0,0', not a pair of ints; "
                 "its block is in a default-pool (0,0) segment"},
    ]
    return sim


def bad_annotate():
    sim, blocks = small_base(14, annotate_ok=False)
    # `a` was freed just before: this annotate names no live allocation.
    e = sim.annotate(0, blocks["a"], "stale activation", valid=False)
    sim.malloc(0, 1 * MIB + 512 * KIB, F["opt"])  # a later allocation, not to be annotated
    sim.defects = [{"kind": "annotate_not_live", "device": 0, "entry_index": index_of(sim.traces[0], e),
                    "time_us": e["time_us"], "address": blocks["a"],
                    "text": "an annotate entry names an address whose allocation was freed before it "
                            "(at no time between its alloc and this entry is it live)"}]
    return sim


def host_traces_only():
    sim, _ = small_base(14)
    sim.defects = [{"kind": "host_traces_without_host_segments",
                    "text": "host_traces is present but host_segments is not: the pinned end state "
                            "cannot be checked against segments; the host totals come from the trace alone "
                            "(all pinned memory was allocated during recording)"}]
    return sim


def pool_mismatch():
    sim, blocks = small_base(15)
    trace = sim.traces[0]
    freq = next(e for e in trace if e["action"] == "free_requested" and e["addr"] == blocks["g1"])
    assert freq["pool_id"] == (0, 1)
    freq["pool_id"] = (0, 0)
    sim.defects = [{"kind": "free_pool_differs_from_alloc", "device": 0, "entry_index": index_of(trace, freq),
                    "time_us": freq["time_us"], "address": blocks["g1"],
                    "text": "a free_requested entry carries pool_id (0, 0) while its alloc (and the "
                            "segment holding the block) are in private pool (0, 1); its free_completed "
                            "carries (0, 1)"}]
    return sim


# -- self-check ----------------------------------------------------------------------------------
def check_written(path, sim, exp):
    """Reads the written pickle back and checks it against the simulation: per device the sum of
    allocated block sizes and of segment sizes in `segments` equal the simulated final numbers
    (host likewise), blocks cover each segment contiguously, times increase, the trace agrees
    with the end state, and every annotate names an allocation live at its time (except the
    ones listed as defects)."""
    with open(path, "rb") as f:
        snap = pickle.load(f)
    for d, dev in exp["devices"].items():
        segs = [s for s in snap["segments"] if s["device"] == int(d)]
        assert sum(b["size"] for s in segs for b in s["blocks"] if b["state"] == "active_allocated") == dev["final_allocated"]
        assert sum(s["total_size"] for s in segs) == dev["final_reserved"]
        for p, v in dev["pools"].items():
            ps = [s for s in segs if pool_key(s["segment_pool_id"]) == p]
            assert sum(s["total_size"] for s in ps) == v["final_reserved"], (path, p)
    all_segs = list(snap["segments"])
    if exp["host"] is not None and "host_segments" in snap:
        hs = snap["host_segments"]
        assert all(s["device"] == -1 and len(s["blocks"]) == 1 and s["blocks"][0]["size"] == s["total_size"] for s in hs)
        assert sum(s["total_size"] for s in hs) == exp["host"]["final_reserved"]
        assert sum(s["total_size"] for s in hs if s["blocks"][0]["state"] == "active_allocated") == exp["host"]["final_allocated"]
        all_segs += hs
    for s in all_segs:
        at = s["address"]
        for b in s["blocks"]:
            assert b["address"] == at and b["size"] >= 512
            at += b["size"]
        assert at == s["address"] + s["total_size"]
        assert s["allocated_size"] == sum(b["size"] for b in s["blocks"] if b["state"] == "active_allocated")
    times = [e["time_us"] for t in snap["device_traces"] for e in t] + [e["time_us"] for e in snap.get("host_traces", [])]
    assert len(set(times)) == len(times)
    for t in snap["device_traces"] + [snap.get("host_traces", [])]:
        assert all(a["time_us"] < b["time_us"] for a, b in zip(t, t[1:]))
    # Replay the trace's liveness alone, against the end state.
    bad = {(x["device"], x["time_us"]) for x in exp["defects"] if x["kind"] == "annotate_not_live"}
    n_ann = 0
    traces = [(d, t) for d, t in enumerate(snap["device_traces"])]
    if "host_traces" in snap:
        traces.append((-1, snap["host_traces"]))
    for d, trace in traces:
        live, segs_live, seen, seg_seen = {}, set(), set(), set()
        for e in trace:
            a = e["action"]
            if a == "alloc":
                assert e["addr"] not in live
                live[e["addr"]] = e
                seen.add(e["addr"])
            elif a == "free_requested":
                assert live.pop(e["addr"])["size"] == e["size"]
            elif a == "segment_alloc":
                segs_live.add(e["addr"])
                seg_seen.add(e["addr"])
            elif a == "segment_free":
                segs_live.discard(e["addr"])
            elif a == "annotate":
                assert (e["addr"] in live) == ((d, e["time_us"]) not in bad), (path, e)
                n_ann += e["addr"] in live
            if "internal_metadata" in e:
                assert e["internal_metadata"] == MALLOC_WITH_ADDRESS
        if d < 0 and "host_segments" not in snap:
            continue
        dsegs = snap["host_segments"] if d < 0 else [s for s in snap["segments"] if s["device"] == d]
        ends = {b["address"]: (b, s) for s in dsegs for b in s["blocks"] if b["state"] == "active_allocated"}
        # Alive at the end per the trace == allocated blocks, except those from before recording.
        assert set(live) <= set(ends), path
        assert all(a not in seen for a in set(ends) - set(live)), path
        for a, e in live.items():
            b, s = ends[a]
            assert b["requested_size"] == e["size"]
            if "pool_id" in e and isinstance(e["pool_id"], tuple) and len(e["pool_id"]) == 2:
                assert s["segment_pool_id"] == e["pool_id"]
        addrs = {s["address"] for s in dsegs}
        assert segs_live <= addrs and all(a not in seg_seen for a in addrs - segs_live), path
    assert n_ann == len(exp["annotations"])


# -- writing -------------------------------------------------------------------------------------
def write(name, sim, protocol, expected, snap=None):
    snap = sim.snapshot() if snap is None else snap
    path = os.path.join(HERE, name)
    with open(path, "wb") as f:
        pickle.dump(snap, f, protocol=protocol)
    exp = sim.expected(name, protocol)
    expected[name] = exp
    check_written(path, sim, exp)
    assert os.path.getsize(path) < 60_000, (name, os.path.getsize(path))


def huge_metadata(path, mb):
    """A 2.15 snapshot whose one alloc entry carries a user_metadata text of `mb` MiB (ASCII)."""
    sim = Sim(15)
    sim.start_recording()
    unit = "phase=warmup;"
    sim.set_metadata((unit * (mb * MIB // len(unit) + 1))[: mb * MIB])
    a = sim.malloc(0, 4096, F["fwd"])
    sim.set_metadata("")
    sim.free(0, a)
    with open(path, "wb") as f:
        pickle.dump(sim.snapshot(), f, protocol=5)


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--huge":
        huge_metadata(sys.argv[2], int(sys.argv[3]))
        return
    assert len(sys.argv) == 1, __doc__
    expected = {}
    write("layout_2_12.pickle", layout_2_12(), 4, expected)
    write("layout_2_13.pickle", layout_2_13(), 4, expected)
    write("layout_2_14.pickle", layout_2_14(), 4, expected)
    sim = layout_2_15()
    snap = sim.snapshot()
    write("layout_2_15.pickle", sim, 5, expected, snap)
    write("layout_2_15.protocol4.pickle", sim, 4, expected, snap)
    with open(os.path.join(HERE, "layout_2_15.pickle"), "rb") as f, \
            open(os.path.join(HERE, "layout_2_15.protocol4.pickle"), "rb") as g:
        assert pickle.load(f) == pickle.load(g)
    write("layout_bad_pool_arity.pickle", bad_pool_arity(), 4, expected)
    write("layout_bad_annotate.pickle", bad_annotate(), 4, expected)
    sim = host_traces_only()
    snap = sim.snapshot()
    del snap["host_segments"]
    write("layout_host_traces_only.pickle", sim, 4, expected, snap)
    write("layout_pool_mismatch.pickle", pool_mismatch(), 5, expected)
    expected = {"_about": "Written by snapshot_layouts.gen.py from its own simulation. Bytes: allocated = "
                          "sum of allocated block sizes (requests rounded to 512, or the whole free region "
                          "when the rest would not be split), reserved = sum of segment sizes; peaks are "
                          "over the recorded window, starting from the memory allocated before recording "
                          "(in the final segments, not in the trace). Pools are keyed 'a,b' per device. "
                          "Host (pinned) totals are apart from every GPU's. user_metadata_counts counts "
                          "entries of device_traces and host_traces other than annotate (whose "
                          "user_metadata is the annotation). internal_metadata entries: each "
                          "mallocWithAddress pair is an alloc, free_requested and free_completed, all "
                          "tagged; the pairs change no peak or final number. annotate entries have size 0 "
                          "and the allocation's pool_id; alloc_size is the alloc entry's (requested) "
                          "size, alloc_block_size its block's.", **expected}
    with open(os.path.join(HERE, "snapshot_layouts.expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
