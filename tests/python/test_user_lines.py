"""Inductor's generated code is never the program's own (issue 68): an allocation outside every
module is named by the program's line, and the capture follows only the program's lines
(sys.monitoring LINE events; Python 3.12+). torch finds Inductor's cache through `getpass`,
which names the user where USER and LOGNAME are unset (a container's root): the capture
must find the same folder, or every line of every compiled function is followed as the
program's, at a cost on every step, and named as the program's."""

import json
import os
import shutil
import sys
import uuid

import pytest
import torch

from memory_tracer import MemoryTracer, _frames


def torchs_folder(monkeypatch):
    """Inductor's folder as torch finds it with no user variable set, and the environment left
    without them (importing Inductor sets TORCHINDUCTOR_CACHE_DIR, which would hide the case)."""
    from torch._inductor.runtime import cache_dir_utils

    for name in ("USER", "LOGNAME", "LNAME", "USERNAME", "TORCHINDUCTOR_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    return cache_dir_utils.default_cache_dir()


def test_inductors_folder_is_torchs_without_user_variables(monkeypatch):
    torchs = torchs_folder(monkeypatch)
    # As at a trace's start, before the program has loaded Inductor.
    monkeypatch.delitem(sys.modules, "torch._inductor.runtime.cache_dir_utils")
    lines = _frames.user_frame_prefixes(torch).splitlines()
    assert "s" + os.path.join(torchs, "") in lines, lines


@pytest.mark.skipif(sys.version_info < (3, 12), reason="the program's lines are followed with sys.monitoring (Python 3.12+)")
def test_code_in_inductors_folder_is_not_named_as_the_programs(monkeypatch, tmp_path):
    """A module written where Inductor writes its code (as generated code is), called outside
    every module: its allocation is named by this file's line, not the generated one's."""
    folder = os.path.join(torchs_folder(monkeypatch), f"mt_{uuid.uuid4().hex}")
    os.makedirs(folder)
    try:
        name = f"c{uuid.uuid4().hex}"
        with open(os.path.join(folder, name + ".py"), "w") as f:
            f.write("import torch\n\ndef call(n):\n    x = torch.empty(n, dtype=torch.uint8)\n    return x\n")
        sys.path.insert(0, folder)
        try:
            generated = __import__(name)
        finally:
            sys.path.remove(folder)
        tracer = MemoryTracer(device="cpu")
        monkeypatch.delitem(sys.modules, "torch._inductor.runtime.cache_dir_utils")
        with tracer.trace():
            kept = generated.call(123_457)  # this line names it
        del kept
        path = tmp_path / "t.mtrace.json"
        tracer.save(path)
        t = json.loads(path.read_text())["trace"]
        ev = t["events"]
        layers = [t["strings"][l] for l, z in zip(ev["layer"], ev["size_bytes"]) if z == 123_457 and l is not None]
        assert layers, "the allocation was not recorded"
        assert all(os.path.basename(__file__) in l and name not in l for l in layers), layers
    finally:
        shutil.rmtree(folder, ignore_errors=True)
