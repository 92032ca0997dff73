"""Frees waiting for another stream (`record_stream`), as `collector trace --holders` reads them
from the allocator's own state at marks and out-of-memory errors (`_holders.Holders.pending_frees`):
a block in state `active_pending_free` is sent once as taken, and let go of at the first look
that finds it done. PyTorch's `torch.cuda.memory_snapshot()` is stood in for here with the
segments it gave on an H200 (tests/gpu/pending_free.py), so this runs without a GPU; the GPU
check runs the real one."""

import struct

import torch

from memory_tracer import _holders, _shim

SEGMENT = 0x7F9A_0000_0000


def segments(state):
    """One 128 MiB segment of cuda:0: a live 64 MiB block, then one whose free waits (or not)."""
    blocks = [
        {"address": SEGMENT, "size": 64 << 20, "requested_size": 64 << 20, "state": "active_allocated", "frames": []},
        {"address": SEGMENT + (64 << 20), "size": 64 << 20, "requested_size": 64 << 20, "state": state, "frames": []},
    ]
    return [{"device": 0, "address": SEGMENT, "total_size": 128 << 20, "stream": 0, "segment_type": "large", "blocks": blocks}]


class Lib:
    def __init__(self):
        self.now, self.sent = 0, []

    def mt_now_ns(self):
        self.now += 1000
        return self.now

    def mt_stream_send(self, kind, data, n):
        assert kind == _shim.FRAME_HOLDERS and len(data) == n
        rec = struct.Struct(_shim.HOLDER_FORMAT)
        self.sent += [rec.unpack_from(data, k) for k in range(0, n, rec.size)]
        return 0


class Cap:
    def __init__(self):
        self.lib = Lib()

    def intern(self, s):
        return 1


def test_a_pending_free_is_sent_once_and_let_go_of_when_seen_done(monkeypatch):
    state = ["active_pending_free"]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda: segments(state[0]))
    cap = Cap()
    h = _holders.Holders(cap)
    h.pending_frees()
    h.pending_frees()  # still pending: nothing new
    state[0] = "inactive"
    h.pending_frees()
    h.pending_frees()  # done already: nothing new
    h.flush()
    got = [(ts, ptr, size, kind, take, dtype, index) for ts, ptr, size, _seq, _n, _m, kind, take, dtype, index, _u in cap.lib.sent]
    where = (SEGMENT + (64 << 20), 64 << 20)
    assert got == [
        (1000, *where, _shim.HOLDER_PENDING_FREE, 1, 1, 0),
        (2000, *where, _shim.HOLDER_PENDING_FREE, 0, 1, 0),
    ]


def test_nothing_is_read_before_cuda_starts_or_from_another_allocator(monkeypatch):
    cap = Cap()
    h = _holders.Holders(cap)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    h.pending_frees()

    def refuse():
        raise RuntimeError("memory_snapshot is not supported by this allocator backend")

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_snapshot", refuse)
    h.pending_frees()
    h.flush()
    assert cap.lib.sent == []


def test_a_slow_read_of_the_allocator_state_is_not_made_again(monkeypatch):
    import time

    calls = []

    def slow():
        calls.append(1)
        time.sleep(0.15)  # the program's own memory history makes the snapshot symbolize stacks
        return segments("active_pending_free")

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_snapshot", slow)
    cap = Cap()
    h = _holders.Holders(cap)
    h.pending_frees()
    h.pending_frees()
    h.flush()
    assert len(calls) == 1
    assert [r[6] for r in cap.lib.sent] == [_shim.HOLDER_PENDING_FREE]
