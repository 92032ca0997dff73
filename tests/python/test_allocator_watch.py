"""The allocator's settings as `collector trace` records them (`_allocator.py`): the program's
calls to `torch.cuda.memory._set_allocator_settings` and `set_per_process_memory_fraction` are
recorded with their time once PyTorch took them, answer exactly as untraced (a call PyTorch
refuses raises the same error, and is not recorded), and the originals are back after."""

import torch

from memory_tracer import _allocator


def outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except Exception as e:  # the program's own error, compared with the untraced one
        return (type(e).__name__, str(e))


def test_changes_are_recorded_as_pytorch_takes_them():
    memory = torch.cuda.memory
    originals = (memory._set_allocator_settings, memory.set_per_process_memory_fraction, torch.cuda.set_per_process_memory_fraction)
    untraced = [
        outcome(memory._set_allocator_settings, "garbage_collection_threshold:0.6"),
        outcome(torch.cuda.set_per_process_memory_fraction, 0.5, 0),
    ]
    clock = iter(range(100, 1000, 100))
    watch = _allocator.Watch(torch, lambda: next(clock))
    watch.install()
    try:
        assert torch.cuda.set_per_process_memory_fraction is memory.set_per_process_memory_fraction
        assert torch.cuda.set_per_process_memory_fraction is not originals[2]
        traced = [
            outcome(memory._set_allocator_settings, "garbage_collection_threshold:0.6"),
            outcome(torch.cuda.set_per_process_memory_fraction, 0.5, 0),
        ]
    finally:
        watch.uninstall()
    assert traced == untraced
    want = []
    if untraced[0][0] == "ok":
        want.append({"ts_ns": 100, "settings": "garbage_collection_threshold:0.6"})
    if untraced[1][0] == "ok":
        want.append({"ts_ns": want and 200 or 100, "memory_fraction": 0.5, "device": 0})
    assert watch.changes == want
    assert (memory._set_allocator_settings, memory.set_per_process_memory_fraction, torch.cuda.set_per_process_memory_fraction) == originals


def test_the_environment_is_read_as_given(monkeypatch):
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    assert _allocator.env()["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "PYTORCH_ALLOC_CONF" not in _allocator.env()
    # No CUDA here: no effective settings to read, the changes alone.
    w = _allocator.Watch(torch, lambda: 0)
    if not torch.cuda.is_initialized():
        assert w.end() == {"changes": []}
