"""One process's capture: the shim streaming to a collector, plus the Python-side hooks that
name layers (nn.Module paths), set phases (forward, backward, optimizer) and mark iterations.

The hooks are process-wide (a wrapper around nn.Module.__call__, the global optimizer step
hooks, wrappers around torch.autograd.backward/grad), so programs need no changes. They do
nothing while torch.compile traces (so compiled graphs do not break on them) and nothing in
forked children (DataLoader workers).
"""

import atexit
import json
import os
import sys
import threading
import time
import weakref

from . import _allocator, _ledger, _shim
from ._frames import UserLines
from ._shim import PHASE_BACKWARD, PHASE_FORWARD, PHASE_OPTIMIZER, PHASE_OTHER

ITERATION_BEGIN = "iteration.begin"
ITERATION_END = "iteration.end"

# The C module call's flags (mt_shim.cpp, py::ModuleCall) and its info bit for the marker.
C_LIVE, C_DIRECT, C_SCOPES, C_TRACK = 1, 2, 4, 8
MARKER = 1 << 32
# How often the driver's used memory is sampled (DeviceSampler), in seconds.
DEVICE_SAMPLE_S = 0.1
# The ledger watches first launches (each launch then costs microseconds) until this long, and
# LEDGER_QUIET_LAUNCHES launches, passed with no function launched for the first time.
LEDGER_QUIET_S = 2.0
LEDGER_QUIET_LAUNCHES = 1000

_current = None  # the process's active Capture
_taught = set()  # ids of the C module calls torch.compile was given a Python stand-in for
_lock = threading.Lock()


def current():
    return _current


def _teach_dynamo(patches, descr, wrapped_call, module_call, hooks=()):
    """torch.compile must see the program as it is untraced. Dynamo keeps PyTorch's own
    nn.Module.__call__ (`unpatched_nn_module_call`, read when it is imported) to know the module
    calls it may trace straight into `forward`: ours (`module_call`) is made that, so the module
    calls it traces take the untraced path and it never traces ours. A compiled module's own
    frame, which dynamo skips for PyTorch's __call__ to compile `forward`'s, is skipped for ours
    too, and the Python `hooks` the shim calls (a thread's outermost module call) are skipped
    with everything they call. Where dynamo still meets the shim's C descriptor, `descr`, it
    traces PyTorch's `wrapped_call` instead (`substitute_in_graph`, once per process).
    `patches` gets what to put back."""
    try:
        import torch._dynamo.utils as dynamo_utils
        from torch._dynamo import eval_frame
        if descr is not None and id(descr) not in _taught:
            import torch._dynamo.decorators as decorators

            def traced_call(self, *args, **kwargs):
                return wrapped_call(self, *args, **kwargs)

            decorators.substitute_in_graph(descr, skip_signature_check=True)(traced_call)
            _taught.add(id(descr))
        for mod in (dynamo_utils, sys.modules.get("torch._dynamo.variables.nn_module")):
            if mod is not None and getattr(mod, "unpatched_nn_module_call", module_call) is not module_call:
                patches.append((mod, "unpatched_nn_module_call", mod.unpatched_nn_module_call, module_call))
                mod.unpatched_nn_module_call = module_call
        skip = getattr(eval_frame, "skip_code", None)
        if skip is not None:
            skip(module_call.__code__)
        strategy, action = getattr(eval_frame, "FrameExecStrategy", None), getattr(eval_frame, "FrameAction", None)
        for hook in hooks:
            if strategy is not None and action is not None and hasattr(eval_frame, "set_code_exec_strategy"):
                eval_frame.set_code_exec_strategy(hook.__code__, strategy(action.SKIP, action.SKIP))
            elif skip is not None:
                skip(hook.__code__)
    except Exception as e:  # an older or newer dynamo: compiled code breaks its graph at module calls
        sys.stderr.write(f"memory-tracer: torch.compile cannot trace through the module scopes ({e}); compiled models still run\n")


def _name_like(ours, theirs):
    """Gives the __call__ that replaces PyTorch's its name and a way back to it."""
    ours.__wrapped__ = theirs
    ours.__name__ = getattr(theirs, "__name__", "__call__")
    ours.__qualname__ = getattr(theirs, "__qualname__", "Module.__call__")


class Live:
    __slots__ = ("on",)

    def __init__(self):
        self.on = True


class Capture:
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
        # id(module) -> (path, interned id, weakref to the module): a plain dict lookup per
        # module call (a WeakKeyDictionary costs a weakref per lookup); the weakref tells a
        # reused id from the module it was given for.
        self.names = {}
        self.main_root = None
        self.root_names = set()
        self.optimizers = weakref.WeakKeyDictionary()  # optimizer -> (name, scope id, steps)
        self.primary_optimizer = None
        self.steps = 0
        self.iteration = 0
        self.iteration_open = False
        self.marker = options.get("iteration_marker") or None
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
        self.holders = None  # who holds each storage (_holders), with --holders
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

    # -- module names --------------------------------------------------------------------
    def name_root(self, module, main=False):
        """Names `module` and its submodules by their paths (`layer1.0.conv1`). The first root
        (the model) keeps bare paths; other roots (a loss, a second model) are prefixed with
        their class name."""
        inner = getattr(module, "_orig_mod", None)  # torch.compile's OptimizedModule
        cls = type(inner if inner is not None else module).__name__
        if self.main_root is not None and not main:
            main_obj = self.main_root()
            main = main_obj is None or any(sub is main_obj for sub in module.modules())
        elif self.main_root is None:
            main = True
        if main:
            prefix = ""
            self.main_root = weakref.ref(module)
            self.root_names.add(cls)
        else:
            prefix = cls
            n = 2
            while prefix in self.root_names:
                prefix = f"{cls}#{n}"
                n += 1
        if prefix:
            self.root_names.add(prefix)
        seen = set()
        for path, sub in module.named_modules(remove_duplicate=False):
            if id(sub) in seen:  # a shared module keeps its first path, as named_modules() gives it
                continue
            seen.add(id(sub))
            if inner is not None:
                path = path[len("_orig_mod."):] if path.startswith("_orig_mod.") else ("" if path == "_orig_mod" else path)
            if path:
                # A child of a root that names none (nn.Sequential's `0`, `1`) is named with the
                # root's class (`Sequential.1`), never a bare index.
                head = path.split(".", 1)[0]
                full = f"{prefix}.{path}" if prefix else (f"{cls}.{path}" if head.isdigit() else path)
            else:
                full = prefix or cls
            if inner is not None and sub is module:
                full = f"compiled({full})"
            self.names[id(sub)] = (full, self.intern(full), weakref.ref(sub))
            if self.holders is not None:
                self.holders.name_module(sub, full)
        return self.names[id(module)]


    def is_marker(self, module, path):
        m = self.marker
        return m == path or m == type(module).__name__

    # -- hooks ---------------------------------------------------------------------------
    def install(self):
        import torch
        from torch.nn.modules import module as nn_module
        from torch.optim import optimizer as optim_module

        compiling = getattr(torch.compiler, "is_compiling", lambda: False)
        cap = self
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
            # An older torch unpacks saved tensors to read them, which is only safe while no
            # saved-tensor hook was ever entered: note when one is.
            hooks_cls = torch.autograd.graph.saved_tensors_hooks
            orig_enter = hooks_cls.__enter__

            def hooks_enter(self_, *args, **kwargs):
                holders.hooks_used = True
                return orig_enter(self_, *args, **kwargs)

            hooks_cls.__enter__ = hooks_enter
            self.patches.append((hooks_cls, "__enter__", orig_enter, hooks_enter))
        # What this installation's hooks test: off once they are taken out, so one left
        # beneath someone else's patch passes calls through even after a later install.
        live = self.live = Live()
        if holders is not None:
            self._hook_out_of_memory(torch, holders, live)

        # Module scopes: nn.Module.__call__ itself is replaced, not hooked globally (global
        # module hooks take every module call off _call_impl's fast path, which costs more than
        # the scope). The replacement also opens each forward pass (phase, iteration) at a
        # thread's outermost module call; with `module_scopes` off it does only that. It is a
        # one-line Python function calling the shim's C method descriptor where the shim has
        # one (a module call then costs that frame, in place of PyTorch's own, a C call and a
        # lookup; the rest of Python runs only at a thread's outermost call, for a module not
        # yet named and for the iteration marker), else a Python wrapper. Either is what
        # torch.compile takes for PyTorch's own (`_teach_dynamo`): it adds no graph break.
        nn = nn_module.Module
        wrapped_call = nn.__call__
        # PyTorch's own __call__ (no one else's patch beneath ours): its one step, choosing
        # the compiled or the plain _call_impl, is done here, so the wrapper costs no frame
        # more than it.
        direct = wrapped_call is getattr(nn, "_wrapped_call_impl", None)
        scopes = bool(self.options.get("module_scopes", True))
        names = self.names
        marker = self.marker
        depths = self.depths
        get_ident = threading.get_ident
        # The C descriptor is one per process: it replaces only PyTorch's own __call__ (on top
        # of someone else's patch, which may call a paused descriptor of ours, it would call
        # itself); torch.compile before 2.10 cannot trace a C descriptor in a compiled
        # module's own frame; and it keeps its state under the GIL (a free-threaded Python gets
        # the wrapper).
        fast = None
        if direct and getattr(sys, "_is_gil_enabled", lambda: True)() and (_shim.parse_version(torch.__version__) or (0, 0))[:2] >= (2, 10):
            fast = _shim.module_call_functions(lib)
        if fast is not None:
            module_call = self._c_module_call(fast, nn, wrapped_call, direct, scopes)
        else:
            enter, leave = _shim.scope_functions(lib)

            def module_call(module, *args, **kwargs):
                if not live.on or compiling():
                    return wrapped_call(module, *args, **kwargs)
                thread = get_ident()
                depth = depths.get(thread, 0)
                if depth == 0:
                    if not taught[0] and "torch._dynamo" in sys.modules:
                        taught[0] = True
                        _teach_dynamo(cap.patches, None, wrapped_call, module_call)
                    if cap.phase == PHASE_OTHER:
                        cap.set_phase(PHASE_FORWARD)
                    if marker is None and not cap.iteration_open:
                        cap.begin_iteration()
                if scopes or marker is not None:
                    entry = names.get(id(module))
                    if entry is None or entry[2]() is not module:
                        entry = cap.name_root(module)
                    if marker is not None and cap.is_marker(module, entry[0]):
                        cap.begin_iteration()
                depths[thread] = depth + 1
                if scopes:
                    enter(entry[1])
                try:
                    if direct:
                        compiled = module._compiled_call_impl
                        if compiled is None:
                            return module._call_impl(*args, **kwargs)
                        return compiled(*args, **kwargs)
                    return wrapped_call(module, *args, **kwargs)
                finally:
                    if scopes:
                        leave(entry[1])
                    depths[thread] = depth
                    if depth == 0 and cap.phase == PHASE_FORWARD:
                        cap.set_phase(PHASE_OTHER)
                    if marker is not None and cap.is_marker(module, entry[0]):
                        cap.end_iteration()

            _name_like(module_call, wrapped_call)
            taught = [False]
            if "torch._dynamo" in sys.modules:
                taught[0] = True
                _teach_dynamo(self.patches, None, wrapped_call, module_call)

        # A thread the program starts while tracing reports its allocations too (libtorch's
        # own threads inherit the starting thread's reporter; a Python thread does not): its
        # first Python call attaches it, then gives the thread the profile function it would
        # have had. Threads already running when tracing starts are not recorded.
        previous_profile = threading.getprofile() if hasattr(threading, "getprofile") else getattr(threading, "_profile_hook", None)

        def attach_thread(frame, event, arg):
            sys.setprofile(previous_profile)
            if live.on:
                lib.mt_thread_attach()

        threading.setprofile(attach_thread)
        self.patches.append((threading, "_profile_hook", previous_profile, attach_thread))

        nn.__call__ = module_call
        self.patches.append((nn, "__call__", wrapped_call, module_call))

        if scopes:
            if self.compiled is None:
                from ._compiled import Compiled
                self.compiled = Compiled(self, *_shim.scope_functions(lib))
            self.compiled.install()

        opt_entry = cap.optimizer_entry

        def opt_pre(opt, args, kwargs):
            if not live.on or compiling():
                return None
            e = opt_entry(opt)
            if holders is not None:
                holders.rescan()
                holders.step_begins()
            cap.set_phase(PHASE_OPTIMIZER)
            lib.mt_scope_enter(e[1])
            return None

        def opt_post(opt, args, kwargs):
            if not live.on or compiling():
                return None
            e = opt_entry(opt)
            lib.mt_scope_exit(e[1])
            cap.set_phase(PHASE_OTHER)
            if holders is not None:
                holders.optimizer_state(opt)
            cap.after_step(opt, e)
            return None

        self.handles.append(optim_module.register_optimizer_step_pre_hook(opt_pre))
        self.handles.append(optim_module.register_optimizer_step_post_hook(opt_post))

        # Backward: everything torch.autograd.backward/grad runs (Tensor.backward included)
        # is the backward phase.
        import torch.autograd as autograd

        def phased(fn, roots_arg, retain_at):
            def wrapper(*args, **kwargs):
                if not live.on:
                    return fn(*args, **kwargs)
                prev = cap.phase
                cap.set_phase(PHASE_BACKWARD)
                walked = holders is not None and not compiling()
                if walked:
                    roots = args[0] if args else kwargs.get(roots_arg)
                    holders.backward_begins(roots if isinstance(roots, (list, tuple)) else (roots,))
                try:
                    return fn(*args, **kwargs)
                finally:
                    cap.set_phase(prev)
                    if walked:
                        # retain_graph defaults to create_graph (positional in Tensor.backward).
                        given = [args[k] if len(args) > k else kwargs.get(n) for k, n in zip(retain_at, ("retain_graph", "create_graph"))]
                        holders.backward_ends(bool(given[1] if given[0] is None else given[0]))

            wrapper.__wrapped__ = fn
            wrapper.__doc__ = fn.__doc__
            wrapper.__name__ = fn.__name__
            return wrapper

        for attr, roots_arg, retain_at in (("backward", "tensors", (2, 3)), ("grad", "outputs", (3, 4))):
            orig = getattr(autograd, attr)
            setattr(autograd, attr, phased(orig, roots_arg, retain_at))
            self.patches.append((autograd, attr, orig, getattr(autograd, attr)))

        # Autograd nodes only (capture_ops=2): the shim finds the node at each memory record,
        # but a custom Function's node (PyNode) is named here, where the GIL is held.
        if int(self.options.get("capture_ops", 1)) == 2:
            from torch.autograd.function import BackwardCFunction

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

        patch = hook_grad_scaler(cap, lambda: live.on)
        if patch is not None:
            self.patches.append(patch)

    def _c_module_call(self, fast, nn, wrapped_call, direct, scopes):
        """nn.Module.__call__ as a Python function that calls the shim's C method descriptor
        (see `install`): the function stands where PyTorch's own `_wrapped_call_impl` frame
        stood (the descriptor calls `_call_impl` itself), so a module call costs no frame more
        than untraced, and torch.compile, which traces Python, is taught it (`_teach_dynamo`)."""
        setup, live_fn = fast
        cap = self
        names = self.names
        marker = self.marker
        track = scopes or marker is not None
        taught = [False]

        def before(module, depth):
            if not taught[0] and "torch._dynamo" in sys.modules:
                taught[0] = True
                _teach_dynamo(cap.patches, descr, wrapped_call, module_call, (before, after))
            if depth == 0:
                if cap.phase == PHASE_OTHER:
                    cap.set_phase(PHASE_FORWARD)
                if marker is None and not cap.iteration_open:
                    cap.begin_iteration()
            if not track:
                return 0
            entry = names.get(id(module))
            if entry is None or entry[2]() is not module:
                entry = cap.name_root(module)
            info = entry[1] if scopes else 0
            if marker is not None and cap.is_marker(module, entry[0]):
                cap.begin_iteration()
                info |= MARKER
            return info

        def after(module, depth, info):
            if depth == 0 and cap.phase == PHASE_FORWARD:
                cap.set_phase(PHASE_OTHER)
            if info & MARKER:
                cap.end_iteration()

        flags = C_LIVE | (C_DIRECT if direct else 0) | (C_SCOPES if scopes else 0) | (C_TRACK if track else 0)
        descr = setup(nn, wrapped_call, before, after, flags)

        def module_call(self, *args, **kwargs):
            return descr(self, *args, **kwargs)

        _name_like(module_call, wrapped_call)
        if "torch._dynamo" in sys.modules:
            taught[0] = True
            _teach_dynamo(self.patches, descr, wrapped_call, module_call, (before, after))
        self.c_live = live_fn
        return module_call

    def optimizer_entry(self, opt):
        """`[name, step scope, steps]` of an optimizer: `optimizer`, `optimizer1`, … in the order
        they first step (both captures name them so; the recorder fallback borrows this)."""
        e = self.optimizers.get(opt)
        if e is None:
            name = "optimizer" if len(self.optimizers) == 0 else f"optimizer{len(self.optimizers)}"
            e = [name, self.intern(f"{name}.step"), 0]
            self.optimizers[opt] = e
        return e

    def after_step(self, opt, entry):
        entry[2] += 1
        self.steps += 1
        if self.primary_optimizer is None:
            self.primary_optimizer = weakref.ref(opt)
        if self.marker is None and self.primary_optimizer() is opt:
            if not self.iteration_open:
                self.begin_iteration()
            self.end_iteration()

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
            end["cuda"] = _cuda_stats()
            if self.allocator is not None:
                end["allocator"] = self.allocator.end()
                self.allocator.uninstall()
            end["private_pools"] = _private_pool_segments()
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


def hook_grad_scaler(tracer, recording):
    """GradScaler.step skips optimizer.step when gradients overflowed (AMP's first steps): the
    iteration still ends there. `tracer` is either capture (`optimizers`, `optimizer_entry`,
    `after_step`); `recording()` says whether it records now. Gives the patch
    `(GradScaler, "step", original, replacement)` made, or None without GradScaler."""
    try:
        from torch.amp.grad_scaler import GradScaler
    except ImportError:
        return None
    orig_step = GradScaler.step

    def scaler_step(scaler, optimizer, *args, **kwargs):
        live = recording()
        before = tracer.optimizers.get(optimizer, [None, None, 0])[2] if live else 0
        try:
            return orig_step(scaler, optimizer, *args, **kwargs)
        finally:
            if live and recording():
                e = tracer.optimizer_entry(optimizer)
                if e[2] == before:
                    tracer.after_step(optimizer, e)

    GradScaler.step = scaler_step
    return (GradScaler, "step", orig_step, scaler_step)


class DeviceSampler:
    """The driver's used and total memory (cudaMemGetInfo) of every CUDA device this process
    holds memory on, every `interval` seconds, on the shim's clock: what the allocator never
    sees (CUDA context, NCCL, cuBLAS workspaces) is the gap to PyTorch's reserved bytes.

    Devices the process has not allocated on are skipped: asking them would create a CUDA
    context there. At most `limit` samples are kept; past it every other one is dropped."""

    def __init__(self, lib, interval, nvml=None, limit=100_000, settle=None):
        self.lib = lib
        self.settle = settle  # with the ledger: told when first launches stop being watched
        self.interval = interval
        self.limit = limit
        self.samples = []
        self.nvml = nvml  # with the ledger: NVML's bytes of this process and of the others
        self.process = []
        self.every = 1
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.run, name="memory-tracer-device-sampler", daemon=True)
        self.thread.start()

    def run(self):
        import torch

        n = 0
        while not self.stopping.wait(self.interval):
            try:
                if self.settle is not None and self.lib.mt_ledger_settle(int(LEDGER_QUIET_S * 1e9), LEDGER_QUIET_LAUNCHES) == 1:
                    self.settle(self.lib.mt_now_ns())
                    self.settle = None
                if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
                    continue
                for d in range(torch.cuda.device_count()):
                    if torch.cuda.memory_reserved(d) == 0:
                        continue
                    free, total = torch.cuda.mem_get_info(d)
                    n += 1
                    if n % self.every == 0:
                        now = self.lib.mt_now_ns()
                        self.samples.append((now, d, total - free, total))
                        usage = self.nvml.usage(d) if self.nvml is not None else None
                        if usage is not None:
                            self.process.append((now, d, usage[0], usage[1]))
                if len(self.samples) >= self.limit:
                    self.samples = self.samples[::2]
                    self.process = self.process[::2]
                    self.every *= 2
            except Exception:  # a device gone bad: stop sampling, keep the program running
                return

    def stop(self):
        self.stopping.set()
        self.thread.join(timeout=2 * self.interval + 1)
        return list(self.samples)


def _private_pool_segments(limit=100000):
    """The CUDA allocator's segments of private pools (CUDA graphs, `torch.cuda.MemPool`) at
    the end: the collector gives the allocations made inside them their pool."""
    import torch

    out = []
    try:
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return out
        for seg in torch.cuda.memory_snapshot():
            pool = tuple(seg.get("segment_pool_id") or (0, 0))
            if pool == (0, 0) or len(pool) != 2:
                continue
            out.append({"device": int(seg["device"]), "address": int(seg["address"]), "size": int(seg["total_size"]), "pool": [int(pool[0]), int(pool[1])]})
            if len(out) >= limit:
                break
    except Exception:
        pass
    return out


def _cuda_stats():
    import torch

    out = []
    try:
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return out
        for d in range(torch.cuda.device_count()):
            s = torch.cuda.memory_stats(d)
            if not s or s.get("allocated_bytes.all.peak", 0) == 0:
                continue
            props = torch.cuda.get_device_properties(d)
            out.append({
                "device": d,
                "name": props.name,
                "total_memory": props.total_memory,
                "allocated_current": s.get("allocated_bytes.all.current", 0),
                "allocated_peak": s.get("allocated_bytes.all.peak", 0),
                "reserved_current": s.get("reserved_bytes.all.current", 0),
                "reserved_peak": s.get("reserved_bytes.all.peak", 0),
                "num_alloc_retries": s.get("num_alloc_retries", 0),
                "num_ooms": s.get("num_ooms", 0),
            })
    except Exception as e:
        out.append({"error": str(e)})
    return out


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
