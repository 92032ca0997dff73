"""The recorder fallback: PyTorch's own CUDA memory recorder instead of the native capture.

`_auto` calls `start(torch, socket_path, options, reason)` right after `import torch` when no
capture library fits this torch (or `collector trace --capture recorder` asks for it). Nothing
is compiled: the process runs `torch.cuda.memory._record_memory_history` and names what it
does with `record_function` ranges, which the recorder keeps as the snapshot's
`external_annotations` (START and END, with a time on the recorder's clock):

- `memory_tracer:scope:<depth>:<phase>:<name>`: a module's forward (`layer1.0.conv1`, named by
  `_hooks.Tracker.name_root`, as the native capture names it) or an optimizer's step
  (`optimizer.step`); depth and phase are those at its start;
- `memory_tracer:phase:<forward|backward|optimizer>`: the phases, one at a time;
- `memory_tracer:iteration:<n>`: iteration n (the first optimizer's steps, or
  `--iteration-marker`'s calls, as the native capture counts them).

The recorder starts when the process first initialises CUDA (torch.cuda._lazy_init, or a
module call that finds CUDA initialised), so processes that never use CUDA are left alone and
record nothing. Snapshots (`torch.cuda.memory._snapshot()`) are pickled into the collector's
private folder (the socket's): at exit, and at an iteration end (a top-level module call's in a
run without optimizer) when the entries since the last one would soon fill the recorder's ring
or pass `CHUNK_ENTRIES` (then the recorder is cleared and goes on); the collector puts their
entries and annotations end to end. Each file is written as `NAME.part`,
renamed once complete and only then named to the collector in a note frame (with where each of
its pickles lies), so a process killed mid-write leaves nothing half-written to be read.

Nothing here may raise into the program: failures end the recording with one line on stderr.
"""

import atexit
import inspect
import json
import os
import pickle
import socket
import struct
import sys
import threading
import time

from . import _hooks
from ._device import cuda_stats
from ._shim import FRAME_END, FRAME_HELLO, FRAME_NOTE

FORWARD, BACKWARD, OPTIMIZER, OTHER = 0, 1, 2, 3
PHASES = ("forward", "backward", "optimizer", "other")
PREFIX = "memory_tracer:"
SNAPSHOT_NOTE = "recorder_snapshot"
# A snapshot is taken at an iteration end once about this many entries wait in the recorder
# (at most half its ring): `_snapshot()` builds a Python object per entry, so a chunk bounds
# what the process holds for it.
CHUNK_ENTRIES = 500_000
# Entries per allocation: alloc, free_requested, free_completed.
ENTRIES_PER_ALLOCATION = 3

_current = None


def _warn(msg):
    try:
        sys.stderr.write(f"memory-tracer: {msg}\n")
        sys.stderr.flush()
    except Exception:
        pass


def start(torch, socket_path, options, reason):
    """Starts the recorder fallback for this process; never raises."""
    global _current
    if _current is not None:
        return
    rec = None
    try:
        rec = Recorder(torch, socket_path, dict(options or {}), str(reason))
        rec.begin()
        _current = rec
    except Exception as e:  # the program runs on, unrecorded, and the collector is told why
        _warn(f"the recorder fallback could not start ({e}); running untraced")
        if rec is not None:
            rec.fail(f"the recorder fallback could not start: {e}")


class Recorder(_hooks.Tracker):
    """One process's recording through PyTorch's recorder, told to the collector at the end
    of `sock`. The native capture's rules are its own too (`_hooks.Tracker`): names of modules
    by path (the first model bare, other roots by class), the iteration marker, and iterations
    ended by the first optimizer's steps."""

    def __init__(self, torch, socket_path, options, reason):
        self.torch = torch
        self.socket_path = socket_path
        self.dir = os.path.dirname(os.path.abspath(socket_path))
        self.options = options
        self.reason = reason
        self.pid = os.getpid()
        self.thread = threading.get_ident()
        self.sock = None
        self.send_lock = threading.Lock()
        self.max_entries = max(1000, int(options.get("max_events", 5_000_000)))
        # MEMORY_TRACER_RECORDER_CHUNK_ENTRIES: a smaller chunk, for tests of snapshots taken
        # at iteration ends (tests/gpu/recorder_fallback.py).
        chunk = os.environ.get("MEMORY_TRACER_RECORDER_CHUNK_ENTRIES", "")
        self.chunk_entries = int(chunk) if chunk.isdigit() else min(CHUNK_ENTRIES, self.max_entries // 2)
        # The tracker's names, optimizers and iterations (the recorder records no holders).
        self.track(options.get("iteration_marker") or None)
        # Open ranges (record_function handles).
        self.depth = 0
        self.phase = OTHER
        self.open = []  # (id(module) or optimizer scope name, handle)
        self.phase_handle = None
        self.iteration_handle = None
        self.scope_names = {}
        self.recording = False
        self.starting = False
        self.stopped = False
        self.finished = False
        self.cuda_first_thread = None
        self.record_kwargs = {}
        self.allocations_at_clear = 0
        self.ends_since_clear = 0
        self.written_entries = 0
        self.snapshots = 0
        self.notes = []
        self.handles = []
        self.patches = []
        self.enter_range = None
        self.exit_range = None

    # -- the collector ---------------------------------------------------------------------
    def send(self, kind, obj):
        data = json.dumps(obj, default=str).encode()
        with self.send_lock:
            self.sock.sendall(struct.pack("<II", kind, len(data)) + data)

    def fail(self, detail):
        """Tells the collector the recording failed (best effort)."""
        try:
            if self.sock is None:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.connect(self.socket_path)
            self.send(FRAME_NOTE, {"kind": "capture_failed", "pid": self.pid, "detail": detail})
        except Exception:
            pass

    # -- start -----------------------------------------------------------------------------
    def begin(self):
        torch = self.torch
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.socket_path)
        # A CUDA (or ROCm) build of torch; whether a device is there is left to the program's
        # own first use (asking the driver now could break CUDA in forked children).
        version = getattr(torch, "version", None)
        cuda_built = bool(getattr(version, "cuda", None) or getattr(version, "hip", None))
        hello = {
            "capture": "recorder",
            "reason": self.reason,
            "mode": "auto",
            "pid": self.pid,
            "ppid": os.getppid(),
            "argv": list(getattr(sys, "orig_argv", sys.argv)),
            "executable": sys.executable,
            "python_version": sys.version.split()[0],
            "torch_version": getattr(torch, "__version__", "unknown"),
            "cwd": os.getcwd(),
            "start_unix_ns": time.time_ns(),
            "start_ns": time.monotonic_ns(),
            "cuda_built": cuda_built,
            "options": self.options,
            "env": {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID") if k in os.environ},
        }
        self.send(FRAME_HELLO, hello)
        self.enter_range = torch.ops.profiler._record_function_enter_new
        self.exit_range = torch.ops.profiler._record_function_exit._RecordFunction
        os.register_at_fork(after_in_child=self.after_fork_in_child)
        atexit.register(self.finish)
        if cuda_built:
            self.install()
            if torch.cuda.is_initialized():
                self.start_recording()
            else:
                self.watch_cuda_init()

    def watch_cuda_init(self):
        """Starts recording right after CUDA's first initialisation (every use from Python goes
        through torch.cuda._lazy_init, which tensor factories call by name)."""
        cuda = self.torch.cuda
        original = cuda._lazy_init
        rec = self

        def _lazy_init():
            original()
            if not rec.recording and not rec.starting and not rec.finished and cuda.is_initialized():
                rec.start_recording()

        _lazy_init.__wrapped__ = original
        _lazy_init.__doc__ = original.__doc__
        cuda._lazy_init = _lazy_init
        self.patches.append((cuda, "_lazy_init", original))

    def record_history(self, clear):
        """(Re)starts PyTorch's recorder with the arguments this torch takes."""
        memory = self.torch.cuda.memory
        try:
            params = inspect.signature(memory._record_memory_history).parameters
        except (TypeError, ValueError):
            params = {}
        # Stacks of allocations only (not of frees), Python frames only: the cheapest that
        # still says which line allocated a block.
        wanted = {"context": "alloc", "stacks": "python", "max_entries": self.max_entries}
        if threading.get_ident() != self.thread:
            # The annotations' callback is per thread unless global; ours are made on the
            # thread that imported torch.
            wanted["global_record_annotations"] = True
        if clear:
            wanted["clear_history"] = True
        kwargs = {k: v for k, v in wanted.items() if k in params} if params else {"max_entries": self.max_entries}
        if clear and "clear_history" not in kwargs:
            memory._record_memory_history(None)  # older torch: stopping clears the ring
        memory._record_memory_history("all", **kwargs)
        self.record_kwargs = kwargs

    def start_recording(self):
        if self.recording or self.starting or self.finished or os.getpid() != self.pid:
            return
        self.starting = True
        try:
            self.record_history(clear=False)
            self.recording = True
            self.cuda_first_thread = threading.get_ident()
            if self.cuda_first_thread != self.thread and "global_record_annotations" not in self.record_kwargs:
                self.notes.append(
                    "CUDA was first used on another thread and this torch's recorder keeps annotations of that thread only: "
                    "module scopes, phases and iterations were not recorded"
                )
            self.allocations_at_clear = self.allocations()
            for obj, attr, orig in self.patches:
                if attr == "_lazy_init":
                    setattr(obj, attr, orig)
            self.patches = [p for p in self.patches if p[1] != "_lazy_init"]
        except Exception as e:
            self.stopped = True
            self.notes.append(f"PyTorch's recorder could not start: {e}")
            _warn(f"PyTorch's memory recorder could not start ({e}); running untraced")
        finally:
            self.starting = False

    # -- ranges ----------------------------------------------------------------------------
    def enter(self, name):
        return self.enter_range(name, None)

    def leave(self, handle):
        self.exit_range(handle)

    def intern(self, name):
        return name  # `name_root` keeps (path, id); here the id is the path itself

    def scope_name(self, name):
        key = (name, self.depth, self.phase)
        s = self.scope_names.get(key)
        if s is None:
            s = f"{PREFIX}scope:{self.depth}:{PHASES[self.phase]}:{name}"
            self.scope_names[key] = s
        return s

    def set_phase(self, phase):
        if phase == self.phase:
            return
        if self.phase_handle is not None:
            self.leave(self.phase_handle)
            self.phase_handle = None
        self.phase = phase
        if phase != OTHER:
            self.phase_handle = self.enter(f"{PREFIX}phase:{PHASES[phase]}")

    def begin_iteration(self):
        if self.iteration_open:
            self.end_iteration()
        self.iteration_handle = self.enter(f"{PREFIX}iteration:{self.iteration}")
        self.iteration_open = True

    def end_iteration(self):
        if not self.iteration_open:
            return
        self.leave(self.iteration_handle)
        self.iteration_handle = None
        self.iteration_open = False
        self.iteration += 1
        self.ends_since_clear += 1
        if self.depth == 0 and not self.open:
            self.maybe_snapshot()

    def open_scope(self, key, name):
        self.open.append((key, self.enter(self.scope_name(name))))

    def close_scope(self, key):
        """Closes the scope of `key` and any left open inside it."""
        for i in range(len(self.open) - 1, -1, -1):
            if self.open[i][0] == key:
                while len(self.open) > i:
                    self.leave(self.open.pop()[1])
                return True
        return False

    def active(self):
        """Whether hooks record now: recording, on the thread that imported torch, not inside
        torch.compile's tracing. A call that finds CUDA initialised starts the recording."""
        if threading.get_ident() != self.thread or self.finished:
            return False
        if not self.recording:
            if self.stopped or self.starting or not self.torch.cuda.is_initialized():
                return False
            self.start_recording()
            if not self.recording:
                return False
        return not self.compiling()

    # -- hooks -----------------------------------------------------------------------------
    def install(self):
        torch = self.torch
        from torch.nn.modules import module as nn_module

        self.compiling = getattr(torch.compiler, "is_compiling", lambda: False)
        rec = self

        def pre(module, args):
            try:
                if not rec.active():
                    return None
                entry = rec.names.get(id(module))
                if entry is None or entry[2]() is not module:
                    entry = rec.name_root(module)
                if rec.depth == 0:
                    if rec.phase == OTHER:
                        rec.set_phase(FORWARD)
                    if rec.marker is None and not rec.iteration_open:
                        rec.begin_iteration()
                if rec.marker is not None and rec.is_marker(module, entry[0]):
                    rec.begin_iteration()
                rec.open_scope(id(module), entry[0])
                rec.depth += 1
            except Exception as e:
                rec.broken(e)
            return None

        def post(module, args, output):
            try:
                if not rec.active():
                    return None
                entry = rec.names.get(id(module))
                if entry is None or entry[2]() is not module or not rec.close_scope(id(module)):
                    return None
                rec.depth = max(0, rec.depth - 1)
                if rec.depth == 0 and rec.phase == FORWARD:
                    rec.set_phase(OTHER)
                if rec.marker is not None and rec.is_marker(module, entry[0]):
                    rec.end_iteration()
                elif rec.depth == 0 and rec.steps == 0 and rec.marker is None:
                    # No optimizer (yet): an inference loop's one iteration would hold every
                    # entry until exit; each top-level call's end is a point to write them.
                    rec.ends_since_clear += 1
                    rec.maybe_snapshot()
            except Exception as e:
                rec.broken(e)
            return None

        self.handles.append(nn_module.register_module_forward_pre_hook(pre))
        self.handles.append(nn_module.register_module_forward_hook(post, always_call=True))
        handles, patches = _hooks.install(self, self)
        self.handles.extend(handles)
        self.patches.extend(p[:3] for p in patches)

    # -- the hooks' backend (`_hooks.install`) ---------------------------------------------
    def records_now(self):
        return self.recording and not self.finished and threading.get_ident() == self.thread

    def step_begins(self, opt):
        try:
            if not self.active():
                return
            e = self.optimizer_entry(opt)
            self.set_phase(OPTIMIZER)
            self.open_scope(e[1], e[1])
        except Exception as err:
            self.broken(err)

    def step_ends(self, opt):
        try:
            if not self.active():
                return
            e = self.optimizer_entry(opt)
            self.close_scope(e[1])
            self.set_phase(OTHER)
            self.after_step(opt, e)
        except Exception as err:
            self.broken(err)

    def backward_begins(self, args, kwargs, roots_arg):
        if not self.recording or self.finished or threading.get_ident() != self.thread:
            return None
        prev = self.phase
        self.set_phase(BACKWARD)
        return prev

    def backward_ends(self, prev, args, kwargs, retain_at):
        if self.recording and not self.finished:
            self.set_phase(prev)

    def uninstall(self):
        for h in self.handles:
            try:
                h.remove()
            except Exception:
                pass
        self.handles.clear()
        for obj, attr, orig in reversed(self.patches):
            try:
                setattr(obj, attr, orig)
            except Exception:
                pass
        self.patches.clear()

    def broken(self, e):
        """A hook failed: stop annotating (the recording itself goes on), say so once."""
        if not any(n.startswith("the recorder's hooks failed") for n in self.notes):
            self.notes.append(f"the recorder's hooks failed ({e}); module scopes stop there")
            _warn(f"the recorder's hooks failed ({e}); module scopes stop there")
        self.uninstall()

    # -- snapshots -------------------------------------------------------------------------
    def allocations(self):
        """Allocations the CUDA allocator has served so far, all devices together."""
        cuda = self.torch.cuda
        total = 0
        for d in range(cuda.device_count()):
            try:
                s = self.torch._C._cuda_memoryStats(d)
                total += int(s["allocation"]["all"]["allocated"])
            except Exception:
                try:
                    total += int(cuda.memory_stats(d).get("allocation.all.allocated", 0))
                except Exception:
                    pass
        return total

    def maybe_snapshot(self):
        """At an iteration end (or a top-level call's, without optimizer): a snapshot (and a
        fresh ring) when the entries waiting would soon fill the ring, or past `chunk_entries`.
        The collector puts the snapshots' entries and annotations end to end, so a range open
        across a snapshot is whole again there."""
        if not self.recording or self.stopped:
            return
        try:
            waiting = (self.allocations() - self.allocations_at_clear) * ENTRIES_PER_ALLOCATION
            per_iteration = waiting // max(1, self.ends_since_clear)
            if waiting < self.chunk_entries and waiting + 2 * per_iteration < self.max_entries:
                return
            self.write_snapshot("iteration")
            if self.written_entries >= self.max_entries:
                self.torch.cuda.memory._record_memory_history(None)
                self.stopped = True
                self.recording = False
                self.notes.append(
                    f"the event limit (--max-events {self.max_entries}) was reached after iteration {self.iteration - 1}: "
                    "recording stopped there, and later memory is not in the trace"
                )
                return
            self.record_history(clear=True)
            self.allocations_at_clear = self.allocations()
            self.ends_since_clear = 0
        except Exception as e:
            self.stop(f"a snapshot at an iteration end failed ({e}); recording stopped there")

    def stop(self, note):
        self.notes.append(note)
        _warn(note)
        self.stopped = True
        self.recording = False
        try:
            self.torch.cuda.memory._record_memory_history(None)
        except Exception:
            pass

    def write_snapshot(self, why):
        """Pickles the recorder's snapshot into the collector's folder as separate protocol-2
        pickles (each device's entries, the annotations, the segments, the settings) so that
        the collector can put every snapshot's entries end to end into one snapshot and replay
        the allocator once, from the first entry (a snapshot's start state, recovered from its
        own segments alone, misses blocks that the allocator left unsplit)."""
        snap = self.torch.cuda.memory._snapshot()
        traces = snap.get("device_traces", [])
        entries = sum(len(t) for t in traces)
        if entries >= self.max_entries:
            self.notes.append(
                f"PyTorch's recorder kept its last {self.max_entries} entries (--max-events) and dropped older ones "
                f"before snapshot {self.snapshots}: the trace misses what they did"
            )
        name = f"recorder-{self.pid}-{self.snapshots}.pickles"
        path = os.path.join(self.dir, name)
        pieces = []
        with open(path + ".part", "wb") as f:

            def piece(what, obj, device=None):
                start = f.tell()
                # Protocol 2: memo keys written out, no FRAME opcodes, so pieces concatenate.
                pickle.dump(obj, f, protocol=2)
                pieces.append({"what": what, "device": device, "offset": start, "bytes": f.tell() - start})

            for d, t in enumerate(traces):
                piece("entries", t, d)
            piece("annotations", snap.get("external_annotations", []))
            piece("segments", snap.get("segments", []))
            piece("settings", snap.get("allocator_settings", {}))
        del snap, traces
        os.rename(path + ".part", path)
        size = os.path.getsize(path)
        self.send(FRAME_NOTE, {"kind": SNAPSHOT_NOTE, "pid": self.pid, "file": name, "bytes": size, "entries": entries, "index": self.snapshots, "why": why, "pieces": pieces})
        self.snapshots += 1
        self.written_entries += entries

    # -- end -------------------------------------------------------------------------------
    def finish(self):
        """At exit: closes what is open, writes the last snapshot, ends the stream; never
        raises."""
        global _current
        if self.finished or os.getpid() != self.pid:
            return
        try:
            if self.iteration_open and self.steps == 0 and self.marker is None:
                self.end_iteration_quietly()
            self.finished = True
            self.uninstall()
            if not self.recording and not self.stopped:
                try:
                    if self.torch.cuda.is_initialized():
                        self.notes.append(
                            "CUDA was used but PyTorch's recorder never started (CUDA was not initialised through "
                            "torch.cuda._lazy_init and no module ran after it): nothing was recorded"
                        )
                except Exception:
                    pass
            if self.recording:
                self.write_snapshot("exit")
            if self.marker is None and self.steps == 0 and self.recording:
                self.notes.append("no optimizer step was seen (and no --iteration-marker given): the whole run is one iteration")
            elif self.marker is not None and self.iteration == 0 and self.recording:
                self.notes.append(f"the iteration marker `{self.marker}` (a module path or class name) was never called")
            end = {
                "reason": "exit",
                "cuda_used": bool(self.recording or self.stopped or self.snapshots),
                "snapshots": self.snapshots,
                "steps": self.steps,
                "iterations": self.iteration,
                "optimizers": sorted(e[0] for e in self.optimizers.values()),
                "notes": self.notes,
                "cuda": cuda_stats(),
            }
            self.send(FRAME_END, end)
        except Exception as e:  # never let the recording's end break the program's
            _warn(f"ending the recorder fallback failed: {e}")
        finally:
            self.finished = True
            try:
                self.sock.close()
            except Exception:
                pass
            if _current is self:
                _current = None

    def end_iteration_quietly(self):
        """The one iteration of a run without steps ends at exit (no snapshot of its own)."""
        self.leave(self.iteration_handle)
        self.iteration_handle = None
        self.iteration_open = False
        self.iteration += 1

    def after_fork_in_child(self):
        # A forked child (DataLoader worker) is not recorded; its copy of the socket closes so
        # that the collector sees the parent's end.
        self.finished = True
        self.recording = False
        try:
            self.sock.close()
        except Exception:
            pass
