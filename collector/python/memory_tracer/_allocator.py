"""The CUDA caching allocator's settings a traced process runs under, for the replays that
start from them (`collector whatif`, `advise`, the out-of-memory report) and the summary:

- the environment it started with (`PYTORCH_CUDA_ALLOC_CONF`, `PYTORCH_ALLOC_CONF`,
  `PYTORCH_HIP_ALLOC_CONF`), in the stream's header;
- every change the program makes while it runs: `torch.cuda.memory._set_allocator_settings`
  and `torch.cuda.set_per_process_memory_fraction`, each with its time on the capture's clock;
- the effective settings at the end (the `allocator_settings` of `torch.cuda.memory._snapshot()`,
  whose values PyTorch itself parsed), unless the program records its own history (then the
  snapshot would carry every entry of it, and is not taken).

The wrappers call PyTorch's own function first and record only once it returned, so a call
PyTorch refuses raises exactly as untraced and records nothing.
"""

import functools
import os

ENV_KEYS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")


def env():
    """The allocator's variables in this process's environment."""
    return {k: os.environ[k] for k in ENV_KEYS if k in os.environ}


class Watch:
    """Records the program's changes to the allocator; `now_ns` is the capture's clock."""

    def __init__(self, torch, now_ns):
        self.torch = torch
        self.now_ns = now_ns
        self.changes = []
        self.patches = []

    def install(self):
        memory = getattr(self.torch.cuda, "memory", None)
        if memory is None:
            return
        for name, record in (("_set_allocator_settings", self._settings), ("set_per_process_memory_fraction", self._fraction)):
            orig = getattr(memory, name, None)
            if orig is None or getattr(orig, "__memory_tracer__", False):
                continue
            ours = _wrapped(orig, record)
            for mod in (memory, self.torch.cuda):
                if getattr(mod, name, None) is orig:
                    setattr(mod, name, ours)
                    self.patches.append((mod, name, orig, ours))

    def uninstall(self):
        for mod, name, orig, ours in reversed(self.patches):
            if getattr(mod, name, None) is ours:
                setattr(mod, name, orig)
        self.patches.clear()

    def _settings(self, args, kwargs):
        s = args[0] if args else kwargs.get("env")
        if isinstance(s, str):
            self.changes.append({"ts_ns": self.now_ns(), "settings": s})

    def _fraction(self, args, kwargs):
        fraction = args[0] if args else kwargs.get("fraction")
        device = args[1] if len(args) > 1 else kwargs.get("device")
        change = {"ts_ns": self.now_ns(), "memory_fraction": float(fraction)}
        try:
            cuda = self.torch.cuda
            change["device"] = int(cuda._utils._get_device_index(device, optional=True)) if device is not None else int(cuda.current_device())
        except Exception:
            pass
        self.changes.append(change)

    def end(self):
        """What the stream's end says: the changes, and the effective settings when they can be
        read cheaply."""
        out = {"changes": self.changes}
        torch = self.torch
        try:
            if torch.cuda.is_initialized() and not torch._C._cuda_isHistoryEnabled():
                settings = torch.cuda.memory._snapshot().get("allocator_settings")
                if isinstance(settings, dict):
                    out["settings"] = settings
        except Exception:
            pass
        return out


def _wrapped(orig, record):
    @functools.wraps(orig)
    def call(*args, **kwargs):
        result = orig(*args, **kwargs)
        try:
            record(args, kwargs)
        except Exception:
            pass
        return result

    call.__memory_tracer__ = True
    return call
