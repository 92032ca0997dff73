"""Builds the capture library (the C++ shim, `record/shim/`) against one torch's headers and
libraries: the one recipe for every build, whether at packaging time for each supported release
(`record/build.rs` runs this file as a script) or on first use for a torch that Memory Tracer
carries no library for (a newer release, a nightly, a source build).

Flags follow the torch being built against: the C++ standard its own extension builder uses
(`torch/utils/cpp_extension.py`: C++17 up to 2.11, C++20 from 2.12), the C++ ABI its libc10 was
built with (`std::__cxx11` in its dynamic symbols or not: 2.6 has the old ABI), and always `-DNDEBUG` (without it `at::RecordFunction`'s
layout differs from libtorch's). The library links only `libtorch_cpu` and `libc10`, so one build
serves the CPU and CUDA builds of a release.

This file imports nothing of the package: `python3 _build.py --torch-dir DIR --src DIR --out FILE`.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

SOURCES = ("mt_shim.cpp", "mt_shim.h")
# How much of a failing compiler's output to show.
ERROR_TAIL_LINES = 15


class BuildError(Exception):
    """The build failed; the message ends with the compiler's last lines."""


def cxx_standard(torch_dir):
    """`c++17` or `c++20`: what torch's own extension builder passes (`-std=c++17` appears in
    cpp_extension.py up to 2.11; 2.12 on use only C++20). C++20 when the file cannot be read."""
    try:
        with open(os.path.join(torch_dir, "utils", "cpp_extension.py"), encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return "c++20"
    return "c++17" if "-std=c++17" in text else "c++20"


def cxx11_abi(torch_dir):
    """1 when libc10 was built with the C++11 ABI, else 0: whether c10's own dynamic symbols
    name `std::__cxx11` types (`c10::Error::Error(std::__cxx11::basic_string...)`). Looser
    tests mislead: torch 2.6's libc10 has the old ABI, yet its dynamic strings hold `__cxx11`
    in libstdc++ symbols linked into it."""
    path = os.path.join(torch_dir, "lib", "libc10.so")
    try:
        names = _elf_section(path, b".dynstr").split(b"\0")
        return 1 if any(re.match(rb"_ZN[KVR]*3c10", n) and b"__cxx11" in n for n in names) else 0
    except OSError as e:
        raise BuildError(f"cannot read {path} ({e.strerror}): expected torch's lib/ with libc10.so") from e
    except ValueError as e:
        raise BuildError(f"{path} is not a 64-bit ELF shared library as expected: {e}") from e


def library_abi(path):
    """1 when a built capture library uses the C++11 ABI (it imports `std::__cxx11` symbols),
    else 0; None when it cannot be read."""
    try:
        return 1 if b"__cxx11" in _elf_section(path, b".dynstr") else 0
    except (OSError, ValueError):
        return None


def _elf_section(path, wanted):
    """The bytes of the section named `wanted` of a 64-bit little-endian ELF file."""
    import struct

    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            raise ValueError("no ELF64 little-endian header")
        shoff, = struct.unpack_from("<Q", head, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
        f.seek(shoff)
        table = f.read(shentsize * shnum)
        if len(table) < shentsize * shnum or shstrndx >= shnum:
            raise ValueError("section headers cut short")

        def section(i):
            name, _, _, _, offset, size = struct.unpack_from("<IIQQQQ", table, i * shentsize)
            return name, offset, size

        _, names_off, names_size = section(shstrndx)
        f.seek(names_off)
        names = f.read(names_size)
        for i in range(shnum):
            name, offset, size = section(i)
            if names[name:name + len(wanted) + 1] == wanted + b"\0":
                f.seek(offset)
                return f.read(size)
    raise ValueError(f"no {wanted.decode()} section")


def find_compiler():
    """`$CXX`, else the first of c++, g++, clang++ on PATH; None when there is none."""
    env = os.environ.get("CXX")
    if env:
        return env
    for name in ("c++", "g++", "clang++"):
        found = shutil.which(name)
        if found:
            return found
    return None


def command(torch_dir, src_dir, out, compiler):
    include = os.path.join(torch_dir, "include")
    return [
        compiler,
        "-shared",
        "-fPIC",
        "-O2",
        f"-std={cxx_standard(torch_dir)}",
        f"-D_GLIBCXX_USE_CXX11_ABI={cxx11_abi(torch_dir)}",
        "-DNDEBUG",
        "-w",
        "-pthread",
        "-I",
        include,
        "-I",
        os.path.join(include, "torch", "csrc", "api", "include"),
        os.path.join(src_dir, "mt_shim.cpp"),
        "-o",
        out,
        "-L",
        os.path.join(torch_dir, "lib"),
        "-ltorch_cpu",
        "-lc10",
        "-ldl",  # dlsym (mt_py_methods), in libdl before glibc 2.34
        "-Wl,-s",
    ]


def build(torch_dir, src_dir, out, compiler=None):
    """Compiles the shim into `out`, which appears whole or not at all (written beside it, then
    renamed). Raises BuildError saying what was missing or what the compiler said."""
    for name in SOURCES:
        if not os.path.isfile(os.path.join(src_dir, name)):
            raise BuildError(f"the capture's source {os.path.join(src_dir, name)} is missing")
    if not os.path.isdir(os.path.join(torch_dir, "include", "ATen")):
        raise BuildError(f"{torch_dir} has no include/ATen: this torch carries no C++ headers")
    compiler = compiler or find_compiler()
    if compiler is None:
        raise BuildError("no C++ compiler found (set CXX, or install g++)")
    out_dir = os.path.dirname(os.path.abspath(out))
    os.makedirs(out_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        cmd = command(torch_dir, src_dir, tmp, compiler)
        try:
            done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
        except OSError as e:
            raise BuildError(f"cannot run the C++ compiler {compiler}: {e.strerror}") from e
        if done.returncode != 0:
            tail = "\n".join(done.stdout.rstrip().splitlines()[-ERROR_TAIL_LINES:])
            raise BuildError(f"{os.path.basename(compiler)} failed (exit {done.returncode}); its last lines:\n{tail}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def source_hash(src_dir):
    h = hashlib.sha256()
    for name in SOURCES + (os.path.basename(__file__),):
        path = os.path.join(src_dir, name) if name != os.path.basename(__file__) else __file__
        with open(path, "rb") as f:
            h.update(name.encode() + b"\0" + f.read())
    return h.hexdigest()


def file_hash(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cache_root():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "memory-tracer", "capture")


def cache_key(version, git_version, src_dir):
    key = f"{version}-{(git_version or 'nogit')[:12]}-{source_hash(src_dir)[:12]}"
    return re.sub(r"[^A-Za-z0-9._+-]", "_", key)


def cached_build(torch_dir, version, git_version, src_dir, progress=None, root=None):
    """The capture library for this torch from the cache, built on first use. A library is
    used only when its recorded sha256 matches (a cut or corrupt file is rebuilt); concurrent
    first runs (the ranks of a torchrun job) take a lock, so one builds and the others wait
    and load its result. Raises BuildError."""
    import fcntl

    root = root or cache_root()
    entry = os.path.join(root, cache_key(version, git_version, src_dir))
    lib, stamp = os.path.join(entry, "libmt_shim.so"), os.path.join(entry, "build.json")
    try:
        os.makedirs(entry, exist_ok=True)
        lock = open(os.path.join(entry, ".lock"), "w")
    except OSError as e:
        raise BuildError(f"cannot use the cache folder {entry}: {e.strerror}") from e
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _valid(lib, stamp):
            return lib
        if progress:
            progress(f"building the capture for torch {version}, once, ~10 s (into {entry})")
        started = time.monotonic()
        for stale in (stamp, lib):
            if os.path.exists(stale):
                os.unlink(stale)
        build(torch_dir, src_dir, lib)
        info = {"torch_version": version, "git_version": git_version, "sha256": file_hash(lib), "seconds": round(time.monotonic() - started, 1)}
        tmp = stamp + f".{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(info, f)
        os.replace(tmp, stamp)
        return lib


def _valid(lib, stamp):
    try:
        with open(stamp) as f:
            want = json.load(f).get("sha256")
        return isinstance(want, str) and file_hash(lib) == want
    except (OSError, ValueError, AttributeError):
        return False


def build_key(torch_dir, src_dir, compiler):
    """What decides the library's bytes, hashed: the sources and this recipe, the compiler (its
    path and `--version`), the flags that follow the torch (standard, ABI), and the torch itself
    (`version.py`, which names its git commit, and the sizes of the two libraries it links)."""
    h = hashlib.sha256(source_hash(src_dir).encode())
    try:
        done = subprocess.run([compiler, "--version"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
        version = done.stdout
    except OSError:
        version = ""
    h.update(f"\0{shutil.which(compiler) or compiler}\0{version}\0{cxx_standard(torch_dir)}\0{cxx11_abi(torch_dir)}".encode())
    with open(os.path.join(torch_dir, "version.py"), "rb") as f:
        h.update(f.read())
    for name in ("libc10.so", "libtorch_cpu.so"):
        h.update(f"\0{name}:{os.path.getsize(os.path.join(torch_dir, 'lib', name))}".encode())
    return h.hexdigest()[:24]


def build_cached(torch_dir, src_dir, out, cache_dir):
    """`build`, through a folder of earlier results keyed by `build_key` (as ccache does): a
    packaging build of a release whose key is there copies the library (checked against its
    recorded sha256) instead of compiling it. Writes to the cache are whole or absent."""
    compiler = find_compiler()
    if compiler is None:
        raise BuildError("no C++ compiler found (set CXX, or install g++)")
    try:
        key = build_key(torch_dir, src_dir, compiler)
    except OSError as e:
        raise BuildError(f"cannot read {torch_dir} ({e.strerror}): expected a torch package folder with version.py and lib/") from e
    entry = os.path.join(cache_dir, key)
    lib, stamp = os.path.join(entry, "libmt_shim.so"), os.path.join(entry, "build.json")
    if not _valid(lib, stamp):
        build(torch_dir, src_dir, out, compiler)
        try:
            os.makedirs(entry, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".put-", suffix=".so", dir=entry)
            os.close(fd)
            shutil.copyfile(out, tmp)
            os.replace(tmp, lib)
            tmp = stamp + f".{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump({"sha256": file_hash(lib)}, f)
            os.replace(tmp, stamp)
        except OSError as e:
            # A cache that cannot be written costs the next build its time, nothing else.
            sys.stderr.write(f"warning: cannot keep the capture build in {entry}: {e.strerror}\n")
        return
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = out + f".{os.getpid()}.tmp"
    shutil.copyfile(lib, tmp)
    os.chmod(tmp, 0o755)
    os.replace(tmp, out)


def main(argv):
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--torch-dir", required=True, help="a torch package folder (with include/ and lib/)")
    ap.add_argument("--src", required=True, help="the folder with mt_shim.cpp and mt_shim.h")
    ap.add_argument("--out", required=True, help="the library to write")
    ap.add_argument("--cache-dir", help="reuse and keep builds here, keyed by what decides their bytes")
    args = ap.parse_args(argv)
    try:
        if args.cache_dir:
            build_cached(args.torch_dir, args.src, args.out, args.cache_dir)
        else:
            build(args.torch_dir, args.src, args.out)
    except BuildError as e:
        sys.stderr.write(f"error: building the capture against {args.torch_dir}: {e}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
