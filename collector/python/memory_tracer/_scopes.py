"""Module scopes: the native capture's nn.Module.__call__ (`replacement`).

nn.Module.__call__ itself is replaced, not hooked globally (global module hooks take every
module call off _call_impl's fast path, which costs more than the scope). The replacement also
opens each forward pass (phase, iteration) at a thread's outermost module call; with
`module_scopes` off it does only that. It is a one-line Python function calling the shim's C
method descriptor where the shim has one (a module call then costs that frame, in place of
PyTorch's own, a C call and a lookup; the rest of Python runs only at a thread's outermost call,
for a module not yet named and for the iteration marker), else a Python wrapper. Either is what
torch.compile takes for PyTorch's own (`_teach_dynamo`): it adds no graph break.
"""

import sys
import threading

from . import _shim
from ._shim import PHASE_FORWARD, PHASE_OTHER

# The C module call's flags (mt_shim.cpp, py::ModuleCall) and its info bit for the marker.
C_LIVE, C_DIRECT, C_SCOPES, C_TRACK = 1, 2, 4, 8
MARKER = 1 << 32

_taught = set()  # ids of the C module calls torch.compile was given a Python stand-in for


def replacement(cap, torch, nn, live, scopes, compiling):
    """`(ours, theirs)`: the __call__ to put on `nn` (nn.Module) for the capture `cap` and the one
    it replaces. `live`: the installation's switch; `scopes`: name module scopes (else only
    phases and iterations); `compiling()`: whether torch.compile traces now."""
    wrapped_call = nn.__call__
    # PyTorch's own __call__ (no one else's patch beneath ours): its one step, choosing
    # the compiled or the plain _call_impl, is done here, so the wrapper costs no frame
    # more than it.
    direct = wrapped_call is getattr(nn, "_wrapped_call_impl", None)
    # The C descriptor is one per process: it replaces only PyTorch's own __call__ (on top
    # of someone else's patch, which may call a paused descriptor of ours, it would call
    # itself); torch.compile before 2.10 cannot trace a C descriptor in a compiled
    # module's own frame; and it keeps its state under the GIL (a free-threaded Python gets
    # the wrapper).
    fast = None
    if direct and getattr(sys, "_is_gil_enabled", lambda: True)() and (_shim.parse_version(torch.__version__) or (0, 0))[:2] >= (2, 10):
        fast = _shim.module_call_functions(cap.lib)
    if fast is not None:
        return _c_module_call(cap, fast, nn, wrapped_call, direct, scopes), wrapped_call
    return _python_module_call(cap, wrapped_call, direct, scopes, live, compiling), wrapped_call


def _python_module_call(cap, wrapped_call, direct, scopes, live, compiling):
    """nn.Module.__call__ as a Python wrapper around `wrapped_call` (see the module's doc)."""
    enter, leave = _shim.scope_functions(cap.lib)
    names = cap.names
    marker = cap.marker
    depths = cap.depths
    get_ident = threading.get_ident

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
        _teach_dynamo(cap.patches, None, wrapped_call, module_call)
    return module_call


def _c_module_call(cap, fast, nn, wrapped_call, direct, scopes):
    """nn.Module.__call__ as a Python function that calls the shim's C method descriptor
    (see the module's doc): the function stands where PyTorch's own `_wrapped_call_impl` frame
    stood (the descriptor calls `_call_impl` itself), so a module call costs no frame more
    than untraced, and torch.compile, which traces Python, is taught it (`_teach_dynamo`)."""
    setup, live_fn = fast
    names = cap.names
    marker = cap.marker
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
        _teach_dynamo(cap.patches, descr, wrapped_call, module_call, (before, after))
    cap.c_live = live_fn
    return module_call


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
