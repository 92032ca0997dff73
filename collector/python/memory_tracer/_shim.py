"""The C++ shim (libmt_shim.so, the `record` crate's) bound with ctypes, and the choice of
which build of it a process loads.

The package carries one library per supported torch minor version (`_lib/<minor>/`), each
built against that release's headers. The shim binds to the libtorch that `import torch`
already loaded, so it is loaded after torch, and only the library of the installed torch's
version; a torch without one (newer, nightly, source build) gets one built on first use from
`_src/` (`_build.py`), chosen before the program imports torch (`choose`).
"""

import ctypes
import os
import re
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
LIB_DIR = os.path.join(_HERE, "_lib")
SRC_DIR = os.path.join(_HERE, "_src")

# Frame kinds (record/shim/mt_shim.h).
FRAME_HELLO, FRAME_RECORDS, FRAME_STRINGS, FRAME_END, FRAME_NOTE, FRAME_HOLDERS = 1, 2, 3, 4, 5, 6
# Holder kinds (MtHolder.kind).
HOLDER_PARAMETER, HOLDER_BUFFER, HOLDER_GRADIENT, HOLDER_OPTIMIZER_STATE = 1, 2, 3, 4
HOLDER_SAVED, HOLDER_PENDING_FREE, HOLDER_PYTHON, HOLDER_CACHE = 5, 6, 7, 8
# MtHolder as `struct` packs it (the package writes holders; _holders.py).
HOLDER_FORMAT = "<QQQqIIBBbbI"
PHASE_FORWARD, PHASE_BACKWARD, PHASE_OPTIMIZER, PHASE_OTHER = 0, 1, 2, 3


class Counters(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in ("mem_kept", "mem_dropped", "op_kept", "op_dropped", "peak_allocated", "peak_reserved", "buffer_dropped")
    ]


class Holder(ctypes.Structure):
    _fields_ = [
        ("ts_ns", ctypes.c_uint64),
        ("ptr", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("seq", ctypes.c_int64),
        ("name", ctypes.c_uint32),
        ("module", ctypes.c_uint32),
        ("kind", ctypes.c_uint8),
        ("take", ctypes.c_uint8),
        ("device_type", ctypes.c_int8),
        ("device_index", ctypes.c_int8),
        ("unused", ctypes.c_uint32),
    ]


def supported():
    """The torch releases this package supports, oldest first (`_lib/SUPPORTED`, written from
    `record/torch-versions.txt`); newer releases build their library on first use."""
    try:
        with open(os.path.join(LIB_DIR, "SUPPORTED")) as f:
            return [line.strip() for line in f if line.strip()]
    except OSError:
        return []


def carried():
    """{minor: release} of the capture libraries in `_lib/` (`{"2.11": "2.11.0"}`)."""
    out = {}
    try:
        names = os.listdir(LIB_DIR)
    except OSError:
        return out
    for name in names:
        folder = os.path.join(LIB_DIR, name)
        try:
            with open(os.path.join(folder, "TORCH_VERSION")) as f:
                release = f.read().strip()
        except OSError:
            continue
        if os.path.isfile(os.path.join(folder, "libmt_shim.so")):
            out[name] = release
    return out


def installed_torch():
    """(version, git_version, torch folder) of the torch this Python would import, read from
    torch/version.py without importing torch; None without torch."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    folder = os.path.dirname(spec.origin)
    try:
        with open(os.path.join(folder, "version.py")) as f:
            text = f.read()
    except OSError:
        return ("unknown", None, folder)

    def field(name):
        m = re.search(rf"^{name}\s*(?::\s*\w+\s*)?=\s*['\"]([^'\"]+)['\"]", text, re.M)
        return m.group(1) if m else None

    return (field("__version__") or "unknown", field("git_version"), folder)


def installed_torch_version():
    found = installed_torch()
    return found[0] if found else None


def parse_version(v):
    """(major, minor, rest) of `2.16.0.dev20261101+cu130` -> (2, 16, ".0.dev20261101+cu130"); None
    when it does not start with two numbers."""
    m = re.match(r"(\d+)\.(\d+)(.*)$", v or "")
    return (int(m.group(1)), int(m.group(2)), m.group(3)) if m else None


def is_release(v):
    """A PyPI-style release (`2.11.0`, `2.11.0+cu130`, `2.11.0+cpu`), not a nightly (`.dev`), a
    pre-release (`a0`, `rc1`) or a source build (`+git...`): only releases load a prebuilt
    library, since others may differ in layout from the release they are named after."""
    m = re.match(r"\d+\.\d+(\.\d+)?(\+([A-Za-z0-9.]+))?$", v or "")
    return bool(m) and "git" not in (m.group(3) or "")


def supported_range():
    s = supported()
    return f"{s[0]} to {s[-1]}" if s else "none listed"


class Choice:
    """Which capture library a process loads: `path` (None: no native capture), `how` it was
    found, or `refused` (the program must not run) or `fallback` (why the recorder runs)."""

    def __init__(self, path=None, how=None, refused=None, fallback=None):
        self.path, self.how, self.refused, self.fallback = path, how, refused, fallback


def choose(version, git_version, torch_dir, progress=None):
    """The library for this torch: the prebuilt one of its minor version when it is a release,
    else one built on first use against its own headers (cached); a torch older than every
    supported release is refused."""
    forced = os.environ.get("MEMORY_TRACER_SHIM")
    if forced:
        return Choice(path=forced, how=f"MEMORY_TRACER_SHIM={forced}")
    parsed, oldest = parse_version(version), parse_version(next(iter(supported()), ""))
    if parsed and oldest and parsed[:2] < oldest[:2]:
        return Choice(
            refused=f"torch {version} is older than any Memory Tracer supports: supported are torch {supported_range()} "
            f"and newer releases (built on first use); upgrade torch, or trace with PyTorch's own recorder "
            f"(torch.cuda.memory._record_memory_history)"
        )
    _build = _build_module()
    have = carried()
    if parsed and is_release(version):
        minor = f"{parsed[0]}.{parsed[1]}"
        if minor in have:
            path = os.path.join(LIB_DIR, minor, "libmt_shim.so")
            # The same release can come in both C++ ABIs (PyPI's 2.6 has the old one, PyTorch's
            # own index a C++11 one): a library of the other ABI would not load.
            try:
                same_abi = _build.library_abi(path) in (None, _build.cxx11_abi(torch_dir))
            except _build.BuildError:
                same_abi = True
            if same_abi:
                return Choice(path=path, how=f"built for torch {have[minor]}")
    try:
        path = _build.cached_build(torch_dir, version, git_version, SRC_DIR, progress=progress)
    except (_build.BuildError, OSError) as e:
        return Choice(fallback=f"no capture library for torch {version}, and building one failed: {e}")
    return Choice(path=path, how=f"built on first use for torch {version}")


def _build_module():
    try:
        from . import _build
    except ImportError:  # this file loaded alone (record/tests/layout.rs does)
        import importlib.util

        spec = importlib.util.spec_from_file_location("_mt_build", os.path.join(_HERE, "_build.py"))
        _build = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(_build)
    return _build


def check_torch_version(found):
    """None if a capture library fits `found` (carried, or buildable), else why not."""
    parsed, oldest = parse_version(found), parse_version(next(iter(supported()), ""))
    if parsed and oldest and parsed[:2] < oldest[:2]:
        return f"torch {found} is older than any Memory Tracer supports (torch {supported_range()} and newer)"
    return None


u32, u64, i32, sz = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int, ctypes.c_size_t
# The shim's functions this package calls: (argument types, result type), checked against the
# header by record/tests/layout.rs.
SIGNATURES = {
        "mt_reset": ([u64, u64, i32, i32], i32),
        "mt_start": ([], i32),
        "mt_stop": ([], i32),
        "mt_is_active": ([], i32),
        "mt_thread_attach": ([], i32),
        "mt_set_phase": ([ctypes.c_uint8], None),
        "mt_intern": ([ctypes.c_char_p], u32),
        "mt_python_node": ([u32], None),
        "mt_scope_enter": ([u32], None),
        "mt_py_methods": ([], ctypes.c_void_p),
        "mt_py_module_call": ([], ctypes.c_void_p),
        "mt_py_switch": ([], ctypes.c_void_p),
        "mt_scope_exit": ([u32], None),
        "mt_mark": ([u32, ctypes.c_int64], None),
        "mt_now_ns": ([], u64),
        "mt_counters": ([ctypes.POINTER(Counters)], None),
        "mt_stream_open": ([i32, u32, u64], i32),
        "mt_stream_send": ([u32, ctypes.c_char_p, sz], i32),
        "mt_holders_queue": ([ctypes.c_char_p, sz], i32),
        "mt_stream_close": ([], i32),
        "mt_name_workspaces": ([i32], None),
        "mt_py_user_frames": ([], ctypes.c_void_p),
        "mt_ledger_start": ([ctypes.c_char_p], i32),
        "mt_ledger_stop": ([], i32),
        "mt_ledger_growth_watched": ([], i32),
        "mt_ledger_settle": ([u64, u64], i32),
        "mt_last_error": ([ctypes.c_char_p, sz], sz),
}


# Functions a shim built from older sources lacks (`module_call_functions` falls back).
OPTIONAL = {"mt_holders_queue", "mt_py_module_call", "mt_py_switch", "mt_name_workspaces", "mt_py_user_frames", "mt_ledger_start", "mt_ledger_stop", "mt_ledger_growth_watched", "mt_ledger_settle"}

# Called on the traced program's hot path; each returns at once (no I/O, no waiting on a lock
# held for long).
HOT = {"mt_thread_attach", "mt_set_phase", "mt_python_node", "mt_scope_enter", "mt_scope_exit", "mt_mark", "mt_now_ns", "mt_intern"}


def load(path=None):
    """Loads the shim into this process (torch must be imported first): `path`, else the
    library `choose` picks for the imported torch."""
    if path is None:
        found = installed_torch()
        if found is None:
            raise RuntimeError("memory-tracer: torch is not installed")
        choice = choose(*found, progress=lambda m: sys.stderr.write(f"memory-tracer: {m}\n"))
        if choice.path is None:
            raise RuntimeError(f"memory-tracer: {choice.refused or choice.fallback}")
        path = choice.path
    lib = ctypes.CDLL(path)
    # The calls made per module call, phase change or mark keep the GIL (PyDLL): they never
    # block, and releasing the GIL around each would hand it to another thread mid-forward.
    keep_gil = ctypes.PyDLL(path)
    for name, (args, res) in SIGNATURES.items():
        try:
            fn = getattr(keep_gil if name in HOT else lib, name)
        except AttributeError:
            if name in OPTIONAL:  # a shim built before it: its callers fall back
                continue
            raise
        fn.argtypes = args
        fn.restype = res
        setattr(lib, name, fn)
    return lib


def _builtins(methods, n):
    """The first `n` entries of a PyMethodDef table at `methods` as Python builtins."""
    new = ctypes.pythonapi.PyCFunction_NewEx
    new.argtypes = [ctypes.c_void_p, ctypes.py_object, ctypes.py_object]
    new.restype = ctypes.py_object
    size = 4 * ctypes.sizeof(ctypes.c_void_p)  # PyMethodDef: name, meth, flags, doc
    return tuple(new(methods + k * size, None, None) for k in range(n))


def _table(lib, symbol, n):
    """The `n` builtins of the shim's method table `symbol`, or None where this shim (an older
    build) or process has none."""
    try:
        methods = getattr(lib, symbol)()
        return _builtins(methods, n) if methods else None
    except (AttributeError, OSError, TypeError):
        return None


def scope_functions(lib):
    """(enter, exit): the shim's scope calls as Python builtins (a fraction of a ctypes call's
    cost), else, where the shim cannot make them, its ctypes functions."""
    try:
        methods = lib.mt_py_methods()
        if methods:
            return _builtins(methods, 2)
    except (AttributeError, OSError, TypeError):
        pass
    return lib.mt_scope_enter, lib.mt_scope_exit


def switch_functions(lib):
    """(open, to, close, live): the scope switches of Inductor's generated code as the shim's
    builtins (see `mt_py_switch`), or None where this shim (an older build) or process has none."""
    return _table(lib, "mt_py_switch", 4)


def module_call_functions(lib):
    """(setup, live): the shim's nn.Module.__call__ as a C method descriptor (see
    `mt_py_module_call`), or None where this shim (an older build) or process has none."""
    return _table(lib, "mt_py_module_call", 2)


def user_frame_functions(lib):
    """(setup, off, start, line, ret): the shim's sys.monitoring callbacks that keep each
    thread's line of the program's own code (see `mt_py_user_frames`), or None where this
    shim has none."""
    return _table(lib, "mt_py_user_frames", 5)


def last_error(lib):
    buf = ctypes.create_string_buffer(4096)
    n = lib.mt_last_error(buf, len(buf))
    return buf.raw[:n].decode("utf-8", "replace")


def counters(lib):
    c = Counters()
    lib.mt_counters(ctypes.byref(c))
    return {name: getattr(c, name) for name, _ in Counters._fields_}
