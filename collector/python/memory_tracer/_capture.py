"""One process's capture: the shim streaming to a collector, plus the Python-side hooks that
name layers (nn.Module paths), set phases (forward, backward, optimizer) and mark iterations.

The hooks are process-wide (a replacement of nn.Module.__call__, `_scopes`; the global optimizer
step hooks and wrappers around torch.autograd.backward/grad, `_hooks`), so programs need no
changes. They do nothing while torch.compile traces (so compiled graphs do not break on them)
and nothing in forked children (DataLoader workers).
"""

import atexit
import json
import os
import sys
import threading
import time

from . import _allocator, _hooks, _ledger, _scopes, _shim
from ._device import DEVICE_SAMPLE_S, LEDGER_QUIET_S, DeviceSampler, cuda_stats, private_pool_segments
from ._frames import UserLines
from ._shim import PHASE_BACKWARD, PHASE_OPTIMIZER, PHASE_OTHER

ITERATION_BEGIN = "iteration.begin"
ITERATION_END = "iteration.end"

_current = None  # the process's active Capture
_lock = threading.Lock()


def current():
    return _current


class Live:
    __slots__ = ("on",)

    def __init__(self):
        self.on = True


class Capture(_hooks.Tracker):
    """Records this process into the collector at the other end of `sock_fd`."""

    def __init__(self, lib, sock_fd, options, mode):
        self.lib = lib
        self.fd = sock_fd
        self.options = options
        self.mode = mode  # "auto" (collector trace -- ...) or "api" (MemoryTracer)
        self.enabled = False
        self.finished = False
        self.phase = PHASE_OTHER
        self.depths = {}  # thread id -> its open module calls
        # Module names, optimizers, iterations, and `holders` (who holds each storage,
        # _holders, with --holders): `_hooks.Tracker`.
        self.track(options.get("iteration_marker") or None)
        self.marks = 0
        self.notes = []
        self.handles = []
        self.patches = []
        self.live = None
        self.c_live = None  # the C module call's switch, while it is installed
        self.pid = os.getpid()
        self._ids = {}
        self.sampler = None
        self.compiled = None  # Inductor's generated code attributed to modules (_compiled)
        self.user_lines = None  # the line of the program's own code each thread is at (_frames)
        self.ledger_on = False  # the shim's CUPTI subscription (_ledger), with --ledger
        self.start_ns = 0
        self.lines_unnamed = None  # why lines outside modules cannot be named (_frames)
        self.ledger_missing = []
        self.allocator = None  # the allocator's settings and the program's changes (_allocator)
        self.begin_id = self.intern(ITERATION_BEGIN)
        self.end_id = self.intern(ITERATION_END)

    # -- strings and records -------------------------------------------------------------
    def intern(self, name):
        i = self._ids.get(name)
        if i is None:
            i = self.lib.mt_intern(name.encode("utf-8", "replace"))
            self._ids[name] = i
        return i

    def set_phase(self, phase):
        self.phase = phase
        self.lib.mt_set_phase(phase)

    def mark(self, name, value=None):
        if not self.enabled:
            return
        if value is None:
            value = self.marks
        self.marks += 1
        h = self.holders
        if h is not None:
            # What holds what at the mark, sent before it.
            h.rescan()
            for opt in list(self.optimizers.keys()):
                h.optimizer_state(opt)
            h.pending_frees()
            if h.python:
                h.python_referrers()
            h.flush()
        self.lib.mt_mark(self.intern(name), int(value))

    def begin_iteration(self):
        if self.iteration_open:
            self.end_iteration()
        self.lib.mt_mark(self.begin_id, self.iteration)
        self.iteration_open = True

    def end_iteration(self):
        if not self.iteration_open:
            return
        if self.holders is not None:
            self.holders.flush()
        self.lib.mt_mark(self.end_id, self.iteration)
        self.iteration_open = False
        self.iteration += 1

    def send(self, kind, obj):
        data = json.dumps(obj, default=str).encode()
        return self.lib.mt_stream_send(kind, data, len(data)) == 0

    # -- hooks ---------------------------------------------------------------------------
    def install(self):
        """Puts in every hook (again after a pause): holders' and the out-of-memory error's
        with `holders`, the lines outside modules, the module call (`_scopes`), new threads,
        Inductor's generated code, the optimizer's step and the backward (`_hooks`), and the
        autograd nodes of custom Functions with `capture_ops=2`."""
        import torch
        from torch.nn.modules import module as nn_module

        compiling = getattr(torch.compiler, "is_compiling", lambda: False)
        lib = self.lib
        if self.holders is None and int(self.options.get("holders", 0)) > 0:
            from ._holders import Holders
            self.holders = Holders(self, python=int(self.options.get("holders", 0)) > 1)
        holders = self.holders
        if hasattr(lib, "mt_name_workspaces"):
            # With holders, the shim names the cuBLAS workspaces the allocator hands out (no
            # tensor holds them); set either way, so a later trace in this process without
            # holders pays no backtrace.
            lib.mt_name_workspaces(int(holders is not None))
        # An allocation outside every module is named by the line of the program's own code
        # that made it; only with module scopes, like the modules' names.
        if self.user_lines is None and bool(self.options.get("module_scopes", True)):
            self.user_lines = UserLines(lib, torch)
            if self.user_lines.why:
                self.lines_unnamed = self.user_lines.why
        if holders is not None and not holders.read_data:
            self._hook_saved_tensors(torch, holders)
        # What this installation's hooks test: off once they are taken out, so one left
        # beneath someone else's patch passes calls through even after a later install.
        live = self.live = Live()
        if holders is not None:
            self._hook_out_of_memory(torch, holders, live)
        nn = nn_module.Module
        scopes = bool(self.options.get("module_scopes", True))
        module_call, wrapped_call = _scopes.replacement(self, torch, nn, live, scopes, compiling)
        self._attach_new_threads(live)
        nn.__call__ = module_call
        self.patches.append((nn, "__call__", wrapped_call, module_call))
        if scopes:
            if self.compiled is None:
                from ._compiled import Compiled
                self.compiled = Compiled(self, *_shim.scope_functions(lib), _shim.switch_functions(lib))
            self.compiled.install()
        handles, patches = _hooks.install(self, _Hooks(self, live, compiling))
        self.handles.extend(handles)
        self.patches.extend(patches)
        # Autograd nodes only (capture_ops=2): the shim finds the node at each memory record,
        # but a custom Function's node (PyNode) is named here, where the GIL is held.
        if int(self.options.get("capture_ops", 1)) == 2:
            self._name_python_nodes(live)

    def _hook_saved_tensors(self, torch, holders):
        """An older torch unpacks saved tensors to read them, which is only safe while no
        saved-tensor hook was ever entered: notes when one is."""
        hooks_cls = torch.autograd.graph.saved_tensors_hooks
        orig_enter = hooks_cls.__enter__

        def hooks_enter(self_, *args, **kwargs):
            holders.hooks_used = True
            return orig_enter(self_, *args, **kwargs)

        hooks_cls.__enter__ = hooks_enter
        self.patches.append((hooks_cls, "__enter__", orig_enter, hooks_enter))

    def _attach_new_threads(self, live):
        """A thread the program starts while tracing reports its allocations too (libtorch's
        own threads inherit the starting thread's reporter; a Python thread does not): its
        first Python call attaches it, then gives the thread the profile function it would
        have had. Threads already running when tracing starts are not recorded."""
        lib = self.lib
        previous_profile = threading.getprofile() if hasattr(threading, "getprofile") else getattr(threading, "_profile_hook", None)

        def attach_thread(frame, event, arg):
            sys.setprofile(previous_profile)
            if live.on:
                lib.mt_thread_attach()

        threading.setprofile(attach_thread)
        self.patches.append((threading, "_profile_hook", previous_profile, attach_thread))

    def _name_python_nodes(self, live):
        """Names each custom autograd Function's backward node (PyNode) as it runs."""
        from torch.autograd.function import BackwardCFunction

        lib = self.lib
        cap = self
        orig_apply = BackwardCFunction.apply
        node_ids = {}

        def backward_apply(ctx, *args):
            if not live.on:
                return orig_apply(ctx, *args)
            cls = type(ctx)
            name = node_ids.get(cls)
            if name is None:
                name = node_ids[cls] = cap.intern(cls.__name__)
            lib.mt_python_node(name)
            try:
                return orig_apply(ctx, *args)
            finally:
                lib.mt_python_node(0)

        BackwardCFunction.apply = backward_apply
        self.patches.append((BackwardCFunction, "apply", orig_apply, backward_apply))

    def _hook_out_of_memory(self, torch, holders, live):
        """`--holders`: the frees waiting for other streams, and with `--holders=python` the
        Python variables holding tensors, when an out-of-memory error is made (torch raises it
        from C++; Python 3.12 builds the exception at once, in the frames that ran out), as at
        a mark. The error itself is untouched."""
        oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
        if not isinstance(oom, type):
            return
        orig = oom.__init__

        def oom_init(self_, *args, **kwargs):
            orig(self_, *args, **kwargs)
            if live.on:
                try:
                    holders.pending_frees()
                    if holders.python:
                        holders.python_referrers()
                    holders.flush()
                except Exception:  # never in the way of the error being raised
                    pass

        try:
            oom.__init__ = oom_init
        except TypeError:  # an immutable type: nothing named at the out-of-memory
            return
        self.patches.append((oom, "__init__", orig, oom_init))

    def uninstall(self):
        if self.user_lines is not None:
            self.user_lines.close()
            self.user_lines = None
        if self.live is not None:
            self.live.on = False
        if self.c_live is not None:
            self.c_live(False)
            self.c_live = None
        for h in self.handles:
            try:
                h.remove()
            except Exception:
                pass
        self.handles.clear()
        if self.compiled is not None:
            self.compiled.uninstall()
        # A patch someone made on top of ours stays (ours beneath it passes calls through
        # once the capture is off).
        for obj, attr, orig, ours in reversed(self.patches):
            if getattr(obj, attr, None) is ours:
                setattr(obj, attr, orig)
        self.patches.clear()

    # -- life cycle ----------------------------------------------------------------------
    def start(self, hello, reset_peak_device=None):
        import torch

        lib = self.lib
        o = self.options
        max_events = int(o.get("max_events", 5_000_000))
        if lib.mt_reset(max_events, int(o.get("max_ops", max_events)), int(bool(o.get("capture_tensors", True))), int(o.get("capture_ops", 1))) != 0:
            raise RuntimeError(f"memory-tracer: the capture cannot start: {_shim.last_error(lib)}")
        if lib.mt_stream_open(self.fd, int(o.get("interval_ms", 20)), int(o.get("buffer_records", 8_000_000))) != 0:
            raise RuntimeError(f"memory-tracer: the capture cannot stream: {_shim.last_error(lib)}")
        base = []
        if reset_peak_device is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            base.append({
                "device": reset_peak_device,
                "allocated": torch.cuda.memory_allocated(reset_peak_device),
                "reserved": torch.cuda.memory_reserved(reset_peak_device),
            })
            torch.cuda.reset_peak_memory_stats(reset_peak_device)
        hello = dict(hello)
        hello.update({
            "pid": os.getpid(),
            "ppid": os.getppid(),
            "argv": list(getattr(sys, "orig_argv", sys.argv)),
            "executable": sys.executable,
            "python_version": sys.version.split()[0],
            "torch_version": torch.__version__,
            "cwd": os.getcwd(),
            "start_unix_ns": time.time_ns(),
            "base_totals": base,
            "options": o,
            "env": {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID") if k in os.environ},
            "alloc_conf_env": _allocator.env(),
        })
        # Kept while paused too: a setting changed then still decides what the replays start from.
        self.allocator = _allocator.Watch(torch, lib.mt_now_ns)
        self.allocator.install()
        self.set_phase(PHASE_OTHER)
        hello["start_ns"] = self.start_ns = lib.mt_now_ns()
        self.send(_shim.FRAME_HELLO, hello)
        if lib.mt_start() != 0:
            raise RuntimeError(f"memory-tracer: the capture cannot start: {_shim.last_error(lib)}")
        self.enabled = True
        self.install()
        nvml = None
        if int(o.get("ledger", 0)):
            why = _ledger.start(lib, torch)
            if why:
                self.ledger_missing.append(f"no driver allocations: {why}")
            else:
                self.ledger_on = True
                growth = _ledger.growth_missing(lib)
                if growth:
                    self.ledger_missing.append(growth)
                communicators = _ledger.nccl_communicators(lib)
                if communicators:
                    self.ledger_missing.append(communicators)
            nvml = _ledger.Nvml(torch)
            if nvml.why:
                self.ledger_missing.append(f"no per-process figures: {nvml.why}")
                nvml = None
            else:
                self.ledger_missing.extend(nvml.missing())
        settle = self.ledger_settled if self.ledger_on and hasattr(lib, "mt_ledger_settle") else None
        self.sampler = DeviceSampler(lib, DEVICE_SAMPLE_S, nvml, settle=settle)

    def ledger_settled(self, now_ns):
        """The ledger stopped watching first launches (none for LEDGER_QUIET_S): says so."""
        after = (now_ns - self.start_ns) / 1e9 if self.start_ns else 0.0
        self.ledger_missing.append(
            f"first kernel launches watched for {after:.1f} s, until none had come for {LEDGER_QUIET_S:g} s: a kernel launched for the first time later counts as unexplained"
        )

    def pause(self):
        """Stops recording and takes the hooks out: a paused program runs as if untraced."""
        if self.enabled:
            self.lib.mt_stop()
            self.enabled = False
            self.uninstall()

    def resume(self):
        if not self.enabled and not self.finished:
            if self.lib.mt_start() != 0:
                raise RuntimeError(f"memory-tracer: cannot resume: {_shim.last_error(self.lib)}")
            self.enabled = True
            self.install()

    def finish(self, reason="exit"):
        """Stops recording and sends the end of the stream; idempotent, never raises."""
        global _current
        if self.finished or os.getpid() != self.pid:
            return
        self.finished = True
        try:
            if self.iteration_open and self.steps == 0 and self.marker is None:
                self.end_iteration()
            self.enabled = False
            if self.holders is not None:
                self.holders.flush()
            self.lib.mt_stop()
            if self.ledger_on:
                self.lib.mt_ledger_stop()
            self.uninstall()
            end = {"reason": reason, "counters": _shim.counters(self.lib), "steps": self.steps, "iterations": self.iteration}
            if self.marker is None and self.steps == 0:
                self.notes.append("no optimizer step was seen (and no --iteration-marker given): the whole run is one iteration")
            elif self.marker is not None and self.iteration == 0:
                self.notes.append(f"the iteration marker `{self.marker}` (a module path or class name) was never called")
            end["notes"] = self.notes
            end["lines_unnamed"] = self.lines_unnamed
            if self.compiled is not None:
                end["compiled"] = self.compiled.meta()
            end["optimizers"] = sorted(e[0] for e in self.optimizers.values())
            end["cuda"] = cuda_stats()
            if self.allocator is not None:
                end["allocator"] = self.allocator.end()
                self.allocator.uninstall()
            end["private_pools"] = private_pool_segments()
            if self.sampler is not None:
                end["device_samples"] = self.sampler.stop()
                end["process_samples"] = self.sampler.process
            end["ledger_missing"] = self.ledger_missing
            self.send(_shim.FRAME_END, end)
        except Exception as e:  # never let the capture's end break the program's
            sys.stderr.write(f"memory-tracer: ending the capture failed: {e}\n")
        finally:
            self.lib.mt_stream_close()
            with _lock:
                if _current is self:
                    _current = None

    def after_fork_in_child(self):
        # The shim stopped itself in the child (pthread_atfork); keep Python quiet too.
        self.enabled = False
        self.finished = True


class _Hooks:
    """The optimizer's and the backward's hooks (`_hooks.install`) for one installation of a
    capture: they record while its `live` is on and torch.compile does not trace."""

    def __init__(self, cap, live, compiling):
        self.cap = cap
        self.live = live
        self.compiling = compiling
        self.holders = cap.holders

    def records_now(self):
        return self.live.on

    def step_begins(self, opt):
        if not self.live.on or self.compiling():
            return
        cap, holders = self.cap, self.holders
        e = cap.optimizer_entry(opt)
        if holders is not None:
            holders.rescan()
            holders.step_begins()
        cap.set_phase(PHASE_OPTIMIZER)
        cap.lib.mt_scope_enter(e[1])

    def step_ends(self, opt):
        if not self.live.on or self.compiling():
            return
        cap, holders = self.cap, self.holders
        e = cap.optimizer_entry(opt)
        cap.lib.mt_scope_exit(e[1])
        cap.set_phase(PHASE_OTHER)
        if holders is not None:
            holders.optimizer_state(opt)
        cap.after_step(opt, e)

    def backward_begins(self, args, kwargs, roots_arg):
        """Everything torch.autograd.backward/grad runs is the backward phase; with holders, the
        graph it walks is read first."""
        if not self.live.on:
            return None
        cap, holders = self.cap, self.holders
        prev = cap.phase
        cap.set_phase(PHASE_BACKWARD)
        walked = holders is not None and not self.compiling()
        if walked:
            roots = args[0] if args else kwargs.get(roots_arg)
            holders.backward_begins(roots if isinstance(roots, (list, tuple)) else (roots,))
        return prev, walked

    def backward_ends(self, began, args, kwargs, retain_at):
        prev, walked = began
        self.cap.set_phase(prev)
        if walked:
            # retain_graph defaults to create_graph (positional in Tensor.backward).
            given = [args[k] if len(args) > k else kwargs.get(n) for k, n in zip(retain_at, ("retain_graph", "create_graph"))]
            self.holders.backward_ends(bool(given[1] if given[0] is None else given[0]))


def begin(lib, sock_fd, options, mode, hello, reset_peak_device=None):
    """Starts the process's one capture."""
    global _current
    with _lock:
        if _current is not None and not _current.finished:
            raise RuntimeError("this process is already being traced (by `collector trace` or another MemoryTracer.trace)")
        cap = Capture(lib, sock_fd, options, mode)
        _current = cap
    try:
        cap.start(hello, reset_peak_device)
    except BaseException:
        with _lock:
            _current = None
        raise
    os.register_at_fork(after_in_child=cap.after_fork_in_child)
    if mode == "auto":
        atexit.register(cap.finish, "exit")
    return cap
