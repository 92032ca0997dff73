"""The C++ shim (libmt_shim.so, built against libtorch) bound with ctypes.

The shim binds to the libtorch that `import torch` already loaded, so it must be loaded after
torch and only into the torch version it was built for (checked by `check_torch_version`).
"""

import ctypes
import os
import re

_HERE = os.path.dirname(os.path.abspath(__file__))
LIB_DIR = os.path.join(_HERE, "_lib")

# Record kinds and frame kinds (collector/shim/mt_shim.h).
FRAME_HELLO, FRAME_RECORDS, FRAME_STRINGS, FRAME_END, FRAME_NOTE = 1, 2, 3, 4, 5
PHASE_FORWARD, PHASE_BACKWARD, PHASE_OPTIMIZER, PHASE_OTHER = 0, 1, 2, 3


class Counters(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in ("mem_kept", "mem_dropped", "op_kept", "op_dropped", "peak_allocated", "peak_reserved", "buffer_dropped")
    ]


def built_for():
    """The torch version the shim was built against (written next to it at packaging)."""
    try:
        with open(os.path.join(LIB_DIR, "TORCH_VERSION")) as f:
            return f.read().strip()
    except OSError:
        return None


def installed_torch_version():
    """torch's version without importing torch (reads torch/version.py); None without torch."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    try:
        with open(os.path.join(os.path.dirname(spec.origin), "version.py")) as f:
            text = f.read()
    except OSError:
        return "unknown"
    m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return m.group(1) if m else "unknown"


def base_version(v):
    return (v or "").split("+", 1)[0]


def check_torch_version(found):
    """None if the shim fits `found`, else the message that says why not."""
    want = built_for()
    if want is None:
        return f"the capture library is incomplete ({os.path.join(LIB_DIR, 'TORCH_VERSION')} is missing)"
    if base_version(found) != base_version(want):
        return (
            f"this Python has torch {found}, but Memory Tracer's capture was built for torch {want}; "
            f"run the program with a Python whose torch is {want} (or rebuild the collector against torch {found})"
        )
    return None


def load():
    """Loads the shim into this process (torch must be imported first)."""
    path = os.environ.get("MEMORY_TRACER_SHIM") or os.path.join(LIB_DIR, "libmt_shim.so")
    lib = ctypes.CDLL(path)
    u32, u64, i32, sz = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int, ctypes.c_size_t
    sigs = {
        "mt_reset": ([u64, u64, i32, i32], i32),
        "mt_start": ([], i32),
        "mt_stop": ([], i32),
        "mt_is_active": ([], i32),
        "mt_set_phase": ([ctypes.c_uint8], None),
        "mt_intern": ([ctypes.c_char_p], u32),
        "mt_scope_enter": ([u32], None),
        "mt_scope_exit": ([u32], None),
        "mt_mark": ([u32, ctypes.c_int64], None),
        "mt_now_ns": ([], u64),
        "mt_counters": ([ctypes.POINTER(Counters)], None),
        "mt_stream_open": ([i32, u32, u64], i32),
        "mt_stream_send": ([u32, ctypes.c_char_p, sz], i32),
        "mt_stream_close": ([], i32),
        "mt_last_error": ([ctypes.c_char_p, sz], sz),
    }
    for name, (args, res) in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = res
    return lib


def last_error(lib):
    buf = ctypes.create_string_buffer(4096)
    n = lib.mt_last_error(buf, len(buf))
    return buf.raw[:n].decode("utf-8", "replace")


def counters(lib):
    c = Counters()
    lib.mt_counters(ctypes.byref(c))
    return {name: getattr(c, name) for name, _ in Counters._fields_}
