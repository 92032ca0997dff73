"""The capture library is NCCL's profiler plugin too (the ledger's split of NCCL's bytes by
communicator): NCCL reads `ncclProfiler_v5`, else `ncclProfiler_v4`, from the library that
NCCL_PROFILER_PLUGIN names. Checked here as NCCL calls them, on the CPU: the tables' layout,
and that a process whose ledger is not running (a child that inherited the variable) asks
for no events and keeps no communicator."""
import ctypes

import torch  # noqa: F401  (the shim needs torch's libraries loaded)

from memory_tracer import _ledger, _shim

Init4 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int), ctypes.c_char_p, ctypes.c_uint64,
                         ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p)
Init5 = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint64, ctypes.POINTER(ctypes.c_int), ctypes.c_char_p,
                         ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p)
Start = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)
Stop = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
Record = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)
Finalize = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


def table(init):
    class Profiler(ctypes.Structure):  # ncclProfiler_v4_t / ncclProfiler_v5_t
        _fields_ = [("name", ctypes.c_char_p), ("init", init), ("startEvent", Start), ("stopEvent", Stop), ("recordEventState", Record),
                    ("finalize", Finalize)]

    return Profiler


def test_the_capture_library_is_an_nccl_profiler_plugin_that_stays_silent_without_the_ledger():
    lib = _shim.load()
    for symbol, init in (("ncclProfiler_v5", Init5), ("ncclProfiler_v4", Init4)):
        p = table(init).in_dll(lib, symbol)
        assert p.name == b"memory-tracer", symbol
        context, mask = ctypes.c_void_p(1), ctypes.c_int(-1)
        if init is Init5:
            rc = p.init(ctypes.byref(context), 0xAB, ctypes.byref(mask), b"default_pg", 1, 2, 0, None)
        else:
            rc = p.init(ctypes.byref(context), ctypes.byref(mask), b"default_pg", 0xAB, 1, 2, 0, None)
        # No ledger running: success (NCCL goes on), no events asked for, no communicator kept.
        assert (rc, mask.value, context.value) == (0, 0, None), symbol
        handle = ctypes.c_void_p(1)
        assert p.startEvent(None, ctypes.byref(handle), None) == 0 and handle.value is None
        assert p.stopEvent(None) == 0 and p.recordEventState(None, 0, None) == 0 and p.finalize(None) == 0


def test_nccl_is_pointed_at_the_capture_library_unless_the_program_named_its_own(monkeypatch):
    lib = _shim.load()
    monkeypatch.delenv("NCCL_PROFILER_PLUGIN", raising=False)
    assert _ledger.nccl_communicators(lib) is None
    import os

    assert os.environ["NCCL_PROFILER_PLUGIN"] == lib._name and os.path.isabs(lib._name)
    monkeypatch.setenv("NCCL_PROFILER_PLUGIN", "/opt/their/libnccl-profiler.so")
    why = _ledger.nccl_communicators(lib)
    assert "the program's own (/opt/their/libnccl-profiler.so)" in why
    assert os.environ["NCCL_PROFILER_PLUGIN"] == "/opt/their/libnccl-profiler.so"
