"""Builds the memory_tracer wheel (run by `cargo xtask wheel`).

usage: build_wheel.py PACKAGE_DIR COLLECTOR_BINARY OUT_DIR VERSION

PACKAGE_DIR holds memory_tracer/ as `collector python-package` wrote it (sources, the capture
library and TORCH_VERSION); COLLECTOR_BINARY goes in as memory_tracer/_bin/collector.
The wheel is platform-specific (a native library and binary) and needs torch at run time.
"""

import base64
import hashlib
import os
import sys
import zipfile


def digest(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def main():
    pkg_dir, collector, out_dir, version = sys.argv[1:5]
    with open(os.path.join(pkg_dir, "memory_tracer", "_lib", "TORCH_VERSION")) as f:
        torch_version = f.read().strip()
    files = []
    for root, dirs, names in os.walk(os.path.join(pkg_dir, "memory_tracer")):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for n in sorted(names):
            if n.endswith(".pyc"):
                continue
            full = os.path.join(root, n)
            files.append((os.path.relpath(full, pkg_dir), open(full, "rb").read(), 0o644 if not n.endswith(".so") else 0o755))
    files.append(("memory_tracer/_bin/collector", open(collector, "rb").read(), 0o755))
    dist = f"memory_tracer-{version}.dist-info"
    base = torch_version.split("+")[0]
    meta = (
        "Metadata-Version: 2.1\n"
        f"Name: memory_tracer\nVersion: {version}\n"
        "Summary: Where GPU memory goes when a PyTorch program runs: every allocation, operator and nn.Module, traced\n"
        "License: MIT OR Apache-2.0\n"
        f"Requires-Python: >=3.9\nRequires-Dist: torch=={base}\n"
    ).encode()
    wheel = b"Wheel-Version: 1.0\nGenerator: memory-tracer xtask\nRoot-Is-Purelib: false\nTag: py3-none-linux_x86_64\n"
    entry = b"[console_scripts]\nmemory-tracer = memory_tracer.__main__:main\n"
    files += [(f"{dist}/METADATA", meta, 0o644), (f"{dist}/WHEEL", wheel, 0o644), (f"{dist}/entry_points.txt", entry, 0o644)]
    record = "".join(f"{name},{digest(data)},{len(data)}\n" for name, data, _ in files) + f"{dist}/RECORD,,\n"
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"memory_tracer-{version}-py3-none-linux_x86_64.whl")
    with zipfile.ZipFile(path + ".tmp", "w", zipfile.ZIP_DEFLATED) as z:
        for name, data, mode in files + [(f"{dist}/RECORD", record.encode(), 0o644)]:
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    os.replace(path + ".tmp", path)
    print(path)


if __name__ == "__main__":
    main()
