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

# Exit status when the shim cannot serve this torch (the program does not run).
EXIT_TORCH_MISMATCH = 97


def _options():
    try:
        return json.loads(os.environ.get("MEMORY_TRACER_OPTIONS") or "{}")
    except ValueError:
        return {}


def _is_multiprocessing_helper():
    argv = list(getattr(sys, "orig_argv", sys.argv))
    return "--multiprocessing-fork" in argv or any("from multiprocessing." in a for a in argv)


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


def install():
    path = os.environ.get("MEMORY_TRACER_SOCKET")
    if not path or _is_multiprocessing_helper():
        return
    version = _shim.installed_torch_version()
    if version is None:
        _send_note(path, {"kind": "no_torch", "pid": os.getpid(), "executable": sys.executable})
        return
    problem = _shim.check_torch_version(version)
    if problem:
        _send_note(path, {"kind": "torch_mismatch", "pid": os.getpid(), "executable": sys.executable, "found": version, "expected": _shim.built_for(), "detail": problem})
        sys.stderr.write(f"memory-tracer: error: {problem}\n")
        sys.stderr.flush()
        os._exit(EXIT_TORCH_MISMATCH)
    if "torch" in sys.modules:
        _start(sys.modules["torch"], path)
    else:
        sys.meta_path.insert(0, _TorchFinder(path))


class _TorchFinder(importlib.abc.MetaPathFinder):
    """Starts the capture when `import torch` has finished executing torch/__init__.py."""

    def __init__(self, path):
        self.path = path

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
        sock_path = self.path

        def exec_module(module):
            original(module)
            _start(module, sock_path)

        loader.exec_module = exec_module
        return spec


def _start(torch, path):
    try:
        from . import _capture

        lib = _shim.load()
        sock = _connect(path)
        _capture.begin(lib, sock.detach(), _options(), "auto", {"mode": "auto"})
    except Exception as e:  # the program runs on, untraced, and the collector is told why
        sys.stderr.write(f"memory-tracer: the capture could not start ({e}); running untraced\n")
        _send_note(path, {"kind": "capture_failed", "pid": os.getpid(), "detail": str(e)})
