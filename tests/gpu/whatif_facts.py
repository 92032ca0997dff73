"""tests/data/whatif/facts.json from what tests/gpu/whatif.sh left in OUT_DIR: per program and
setting, PyTorch's counters of the traced run (`collector whatif --verify`'s rows) and of the
untraced one (the COUNTERS lines).

    python tests/gpu/whatif_facts.py OUT_DIR > tests/data/whatif/facts.json
"""
import json
import os
import sys


def main(out):
    programs, total, device, torch = {}, None, None, None
    for name in sorted(os.listdir(out)):
        if not name.endswith(".counters.jsonl"):
            continue
        model = name[: -len(".counters.jsonl")]
        untraced = {}
        for line in open(os.path.join(out, name)):
            c = json.loads(line)
            untraced[c["alloc_conf"]] = c
            total, device, torch = c["device_total_memory"], c["device"], c["torch"]
        verified = json.load(open(os.path.join(out, model + ".json")))
        rows = []
        for r in verified["rows"]:
            u = untraced.get(r["env"])
            if r.get("error") or u is None:
                sys.exit(f"{model} under {r['alloc_conf']!r}: no measurement ({r.get('error') or 'no untraced run'})")
            rows.append({
                "alloc_conf": r["alloc_conf"],
                "max_memory_allocated": r["measured_allocated_peak_bytes"],
                "max_memory_reserved": r["measured_reserved_peak_bytes"],
                "untraced_max_memory_allocated": u["max_memory_allocated"],
                "untraced_max_memory_reserved": u["max_memory_reserved"],
            })
        programs[model] = {"settings": rows}
    facts = {
        "about": f"tests/gpu/whatif.sh and `collector whatif --verify` on one {device}, torch {torch}: "
        "tests/gpu/whatif_train.py --model M traced under PyTorch's default allocator settings (M.default.mtrace.json.gz), "
        "then run under each PYTORCH_CUDA_ALLOC_CONF below; max_memory_allocated/max_memory_reserved are PyTorch's own "
        "counters of the traced runs, untraced_* those of untraced runs (the same: tracing changes no allocation).",
        "device_total_memory": total,
        "programs": programs,
    }
    json.dump(facts, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main(sys.argv[1])
