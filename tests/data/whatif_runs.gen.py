"""Writes whatif_runs.json.gz: one seeded stream of CUDA allocations run under several
PYTORCH_CUDA_ALLOC_CONF settings (and memory fractions), each in a fresh process, with
PyTorch's own counters and, for every allocation in program order, where the block went and
the reserved bytes right after it. shared/tests/whatif.rs replays the stream through
shared::whatif under each setting and must give PyTorch's curves back.

Run on a CUDA machine: python3 whatif_runs.gen.py [OUT_DIR] (default: this folder).
Recorded on an NVIDIA H200 with torch 2.11.0+cu130.
"""
import gzip, json, os, pickle, random, subprocess, sys, tempfile

# name: (PYTORCH_CUDA_ALLOC_CONF, torch.cuda.set_per_process_memory_fraction or None)
CONFIGS = {
    "default": ("", None),
    "expandable": ("expandable_segments:True", None),
    "maxsplit64": ("max_split_size_mb:64", None),
    "maxsplit64_nsr64": ("max_split_size_mb:64,max_non_split_rounding_mb:64", None),
    "roundup4": ("roundup_power2_divisions:4", None),
    "roundup_list": ("roundup_power2_divisions:[64:8,256:4,>:1]", None),
    "large64": ("large_segment_size_mb:64", None),
    "frac_oom": ("", 0.03),
    "frac_gc": ("garbage_collection_threshold:0.6", 0.05),
    "frac_gc_maxsplit": ("garbage_collection_threshold:0.6,max_split_size_mb:64", 0.05),
    "exp_frac": ("expandable_segments:True", 0.03),
}


def ops(seed=7, n=4000):
    """("alloc", key, bytes, stream 0|1), ("free", key, 0), ("empty", 0, 0)."""
    r = random.Random(seed)
    live, out, key = [], [], 0
    for i in range(n):
        if i % 900 == 899:
            out.append(("empty", 0, 0))
            continue
        if live and (len(live) > 120 or r.random() < 0.45):
            out.append(("free", live.pop(r.randrange(len(live))), 0))
            continue
        x = r.random()
        if x < 0.4:
            size = r.randint(1, 1 << 20)
        elif x < 0.75:
            size = r.randint(1 << 20, 20 << 20)
        elif x < 0.95:
            size = r.randint(20 << 20, 300 << 20)
        else:
            size = r.randint(300 << 20, 1200 << 20)
        out.append(("alloc", key, size, 1 if r.random() < 0.15 else 0))
        live.append(key)
        key += 1
    return out


def child(name, snapshot_path):
    import torch

    _, fraction = CONFIGS[name]
    torch.cuda.init()
    if fraction is not None:
        torch.cuda.set_per_process_memory_fraction(fraction)
    side = torch.cuda.Stream()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    tensors = {}
    for op in ops():
        if op[0] == "alloc":
            _, k, size, stream = op
            try:
                with torch.cuda.stream(side if stream else torch.cuda.current_stream()):
                    tensors[k] = torch.empty(size, dtype=torch.uint8, device="cuda")
            except torch.OutOfMemoryError:
                pass
        elif op[0] == "free":
            tensors.pop(op[1], None)
        else:
            torch.cuda.empty_cache()
    torch.cuda.synchronize()
    torch.cuda.memory._dump_snapshot(snapshot_path)
    s = torch.cuda.memory_stats()
    print(json.dumps({
        "torch": torch.__version__,
        "total": torch.cuda.get_device_properties(0).total_memory,
        "max_reserved": s["reserved_bytes.all.peak"],
        "max_allocated": s["allocated_bytes.all.peak"],
        "retries": s["num_alloc_retries"],
        "ooms": s["num_ooms"],
    }))


def allocations(snapshot_path):
    """[address (0: out of memory), reserved bytes after it] per allocation, in order."""
    snap = pickle.load(open(snapshot_path, "rb"))
    reserved, out = 0, []
    for e in (e for t in snap["device_traces"] for e in t):
        a = e["action"]
        if a in ("segment_alloc", "segment_map"):
            reserved += e["size"]
        elif a in ("segment_free", "segment_unmap"):
            reserved -= e["size"]
        elif a in ("alloc", "oom"):
            out.append([e["addr"] if a == "alloc" else 0, reserved])
    return out


def main(out_dir):
    runs, torch_version = {}, None
    with tempfile.TemporaryDirectory() as tmp:
        for name, (conf, fraction) in CONFIGS.items():
            path = os.path.join(tmp, f"{name}.pickle")
            env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF=conf)
            p = subprocess.run([sys.executable, __file__, "--child", name, path], env=env, capture_output=True, text=True, check=True)
            facts = json.loads(p.stdout.strip().splitlines()[-1])
            torch_version = facts.pop("torch")
            runs[name] = {"conf": conf, "fraction": fraction, **facts, "allocs": allocations(path)}
            print(name, {k: v for k, v in runs[name].items() if k != "allocs"}, flush=True)
    doc = {
        "what": "whatif_runs.gen.py: one seeded stream of torch.empty allocations (two streams), frees and "
        "empty_cache calls, run under each allocator setting in a fresh process; per run PyTorch's counters and, "
        "per allocation in program order, the block's address (0 for an out-of-memory) and the reserved bytes "
        "right after it (summed from the snapshot's segment entries)",
        "torch": torch_version,
        "ops": ops(),
        "runs": runs,
    }
    raw = json.dumps(doc, separators=(",", ":")).encode()
    with gzip.open(os.path.join(out_dir, "whatif_runs.json.gz"), "wb", compresslevel=9) as f:
        f.write(raw)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
    else:
        main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))
