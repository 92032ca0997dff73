"""Capture armed by `collector trace -- COMMAND` (through the bootstrap `sitecustomize`).

The collector passes a Unix socket path in MEMORY_TRACER_SOCKET and its options as JSON in
MEMORY_TRACER_OPTIONS. Each Python process that imports torch connects once and streams its
records; processes without torch, and multiprocessing helpers (spawned DataLoader workers,
resource trackers), stay untraced. The capture starts right after `import torch` finishes,
so everything the program allocates through PyTorch is recorded.
"""

import importlib.abc
import importlib.util
import json
import os
import socket
import struct
import sys

from . import _shim

# Exit status when no capture can serve this torch (the program does not run): a torch older
# than every supported release, or `--capture native` with no library and no way to build one.
EXIT_TORCH_MISMATCH = 97


def _options():
    try:
        return json.loads(os.environ.get("MEMORY_TRACER_OPTIONS") or "{}")
    except ValueError:
        return {}


def _is_multiprocessing_helper():
    """A helper process of the program's libraries, not the program: multiprocessing's
    workers, and Inductor's compile workers (torch.compile starts them while it compiles)."""
    argv = list(getattr(sys, "orig_argv", sys.argv))
    return (
        "--multiprocessing-fork" in argv
        or any("from multiprocessing." in a for a in argv)
        or any(a.replace(os.sep, "/").endswith("_inductor/compile_worker/__main__.py") or a == "torch._inductor.compile_worker" for a in argv)
    )


def _connect(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    return s


def _send_note(path, note):
    """Tells the collector something without the shim (no torch, a torch it cannot serve)."""
    try:
        s = _connect(path)
        data = json.dumps(note).encode()
        s.sendall(struct.pack("<II", _shim.FRAME_NOTE, len(data)) + data)
        s.close()
    except OSError:
        pass


def _refuse(path, kind, found, detail):
    """Stops this process before the program runs: the capture it was asked for cannot run."""
    _send_note(path, {"kind": kind, "pid": os.getpid(), "executable": sys.executable, "found": found, "supported": _shim.supported(), "detail": detail})
    sys.stderr.write(f"memory-tracer: error: {detail}\n")
    sys.stderr.flush()
    os._exit(EXIT_TORCH_MISMATCH)


def install():
    path = os.environ.get("MEMORY_TRACER_SOCKET")
    if not path or _is_multiprocessing_helper():
        return
    found = _shim.installed_torch()
    if found is None:
        _send_note(path, {"kind": "no_torch", "pid": os.getpid(), "executable": sys.executable})
        return
    version = found[0]
    mode = _options().get("capture") or "auto"
    if mode == "recorder":
        start = _recorder_start(path, "forced by --capture recorder")
    else:
        choice = _shim.choose(*found, progress=lambda m: (sys.stderr.write(f"memory-tracer: {m}\n"), sys.stderr.flush()))
        if choice.refused:
            _refuse(path, "torch_mismatch", version, choice.refused)
        if choice.path is None and mode == "native":
            _refuse(path, "torch_mismatch", version, f"--capture native: {choice.fallback}")
        if choice.path is None:
            sys.stderr.write(
                f"memory-tracer: {choice.fallback}\nmemory-tracer: tracing with PyTorch's own recorder instead "
                "(CUDA memory only: no CPU memory, no operators, no live view)\n"
            )
            start = _recorder_start(path, choice.fallback)
        else:
            start = _native_start(path, choice, found)
    if "torch" in sys.modules:
        start(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, _TorchFinder(start))


class _TorchFinder(importlib.abc.MetaPathFinder):
    """Starts the capture when `import torch` has finished executing torch/__init__.py."""

    def __init__(self, start):
        self.start = start

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        original = loader.exec_module
        start = self.start

        def exec_module(module):
            original(module)
            start(module)

        loader.exec_module = exec_module
        return spec


def _native_start(path, choice, found):
    def start(torch):
        try:
            from . import _capture

            lib, how = _load_or_rebuild(choice, found)
            if lib is None:  # neither the chosen library nor a fresh build loads: the recorder
                sys.stderr.write(f"memory-tracer: {how}\nmemory-tracer: tracing with PyTorch's own recorder instead\n")
                return _recorder_start(path, how)(torch)
            sock = _connect(path)
            _capture.begin(lib, sock.detach(), _options(), "auto", {"mode": "auto", "capture": "native", "library": how})
        except Exception as e:  # the program runs on, untraced, and the collector is told why
            sys.stderr.write(f"memory-tracer: the capture could not start ({e}); running untraced\n")
            _send_note(path, {"kind": "capture_failed", "pid": os.getpid(), "detail": str(e)})

    return start


def _load_or_rebuild(choice, found):
    """(library, how) for the chosen path; a carried library that does not load here (built on a
    newer glibc than this machine's, say) is replaced by one built on first use. (None, why)
    when neither loads."""
    try:
        return _shim.load(choice.path), choice.how
    except OSError as e:
        first = f"the capture library {choice.path} does not load here ({e})"
    if choice.how.startswith("built on first use"):
        return None, first
    sys.stderr.write(f"memory-tracer: {first}; building one for this machine\n")
    from . import _build

    try:
        built = _build.cached_build(found[2], found[0], found[1], _shim.SRC_DIR, progress=lambda m: sys.stderr.write(f"memory-tracer: {m}\n"))
        return _shim.load(built), f"built on first use for torch {found[0]}"
    except (_build.BuildError, OSError) as e:
        return None, f"{first}, and building one failed: {e}"


def _recorder_start(path, reason):
    def start(torch):
        try:
            from . import _history

            _history.start(torch, path, _options(), reason)
        except Exception as e:  # never into the user's program
            sys.stderr.write(f"memory-tracer: the recorder capture could not start ({e}); running untraced\n")
            _send_note(path, {"kind": "capture_failed", "pid": os.getpid(), "detail": str(e)})

    return start
