"""Module scopes without global module hooks (issue 33): nn.Module.__call__ is replaced while a
trace runs and restored after; scopes stay right for the cases hooks used to get right
(exceptions inside forward, recursion, threads, per-instance forward, custom autograd
Functions in backward, torch.compile) and `module_scopes=False` keeps phases and iterations.
Every test runs twice: with the shim's C method descriptor and with the Python wrapper (what a
shim without the descriptor gets)."""

import json
import threading

import pytest
import torch
import torch.nn as nn
from torch.nn.modules import module as nn_module

from memory_tracer import MemoryTracer


@pytest.fixture(autouse=True, params=["c", "python"])
def module_call(request, monkeypatch):
    from memory_tracer import _shim

    if request.param == "python":
        monkeypatch.setattr(_shim, "module_call_functions", lambda lib: None)
    return request.param


def saved(tracer, tmp_path, name="t"):
    path = tmp_path / f"{name}.mtrace.json"
    tracer.save(path)
    return json.loads(path.read_text())["trace"]


def scopes(t):
    return [(t["strings"][s["name"]], s["depth"], s["phase"], s["thread"]) for s in t["scopes"]]


def event_layers(t):
    """(layer name, size) of every allocation and free, in order."""
    ev = t["events"]
    return [(t["strings"][l] if l is not None else None, z) for l, z in zip(ev["layer"], ev["size_bytes"])]


class Boom(nn.Module):
    def forward(self, x):
        y = x * 2
        raise ValueError("inside forward")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 64)
        self.boom = Boom()

    def forward(self, x):
        return self.fc(x)


def test_no_global_hooks_run_and_the_call_is_restored_after(module_call):
    original = nn.Module.__call__
    seen = {}
    tracer = MemoryTracer(device="cpu")
    with tracer.trace(Net()):
        seen["call"] = nn.Module.__call__
        seen["hooks"] = len(nn_module._global_forward_pre_hooks) + len(nn_module._global_forward_hooks)
    assert seen["call"] is not original, "tracing wraps nn.Module.__call__"
    # A Python function either way (torch.compile takes it for PyTorch's own); with the shim's
    # C descriptor (torch 2.10 on) it is one line calling the descriptor, else the wrapper.
    c = module_call == "c" and tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 10)
    assert type(seen["call"]).__name__ == "function"
    cells = {n: cell.cell_contents for n, cell in zip(seen["call"].__code__.co_freevars, seen["call"].__closure__ or ())}
    assert (type(cells.get("descr")).__name__ == "method_descriptor") == c, cells
    assert seen["hooks"] == 0, "global module hooks take every module call off _call_impl's fast path"
    assert nn.Module.__call__ is original


def test_a_wrapper_installed_on_top_of_ours_is_kept():
    original = nn.Module.__call__
    tracer = MemoryTracer(device="cpu")
    with tracer.trace():
        ours = nn.Module.__call__

        def theirs(self, *args, **kwargs):
            return ours(self, *args, **kwargs)

        nn.Module.__call__ = theirs
    try:
        assert nn.Module.__call__ is theirs
        assert nn.Linear(2, 2)(torch.ones(1, 2)).shape == (1, 2), "ours beneath passes calls through"
    finally:
        nn.Module.__call__ = original


def test_an_exception_inside_forward_closes_its_scopes(tmp_path):
    model = Net()
    tracer = MemoryTracer(device="cpu")
    with tracer.trace(model):
        with pytest.raises(ValueError, match="inside forward"):
            model.boom(torch.randn(8, 32))
        model(torch.randn(8, 32))
    t = saved(tracer, tmp_path)
    s = scopes(t)
    assert ("boom", 0, "forward", s[0][3]) in s
    # The call after the failed one is not nested inside it.
    assert ("Net", 0, "forward", s[0][3]) in s and ("fc", 1, "forward", s[0][3]) in s
    assert "boom" in {layer for layer, _ in event_layers(t)}


class Recursive(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x, depth):
        x = self.fc(x)
        return self(x, depth - 1) if depth > 1 else x


def test_a_module_calling_itself_nests_its_scopes(tmp_path):
    model = Recursive()
    tracer = MemoryTracer(device="cpu")
    with tracer.trace(model):
        model(torch.randn(4, 16), 3)
    depths = sorted(d for name, d, _, _ in scopes(saved(tracer, tmp_path)) if name == "Recursive")
    assert depths == [0, 1, 2], "each call of the module opens one scope inside the last"


def test_modules_called_from_two_threads_keep_their_own_scopes(tmp_path):
    a, b = nn.Linear(64, 512), nn.Linear(64, 1024)
    tracer = MemoryTracer(device="cpu")
    barrier = threading.Barrier(2)

    def run(m):
        barrier.wait()
        for _ in range(20):
            m(torch.randn(32, 64))

    with tracer.trace(a):
        threads = [threading.Thread(target=run, args=(m,)) for m in (a, b)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    t = saved(tracer, tmp_path)
    by_layer = {}
    for layer, size in event_layers(t):
        if size > 0:
            by_layer.setdefault(layer, set()).add(size)
    # Each output (32 x 512 or 32 x 1024 floats) is attributed to the module that made it.
    assert 32 * 512 * 4 in by_layer["Linear"] and 32 * 1024 * 4 not in by_layer["Linear"]
    assert 32 * 1024 * 4 in by_layer["Linear#2"] and 32 * 512 * 4 not in by_layer["Linear#2"]


def test_a_forward_replaced_on_the_instance_keeps_its_scope(tmp_path):
    model = Net()
    plain = model.fc.forward
    model.fc.forward = lambda x: plain(x) * 3  # as checkpoint wrappers and accelerate do
    tracer = MemoryTracer(device="cpu")
    with tracer.trace(model):
        model(torch.randn(8, 32))
    s = {name for name, _, _, _ in scopes(saved(tracer, tmp_path))}
    assert "fc" in s


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


class Squarer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(32, 256)

    def forward(self, x):
        return Square.apply(self.fc(x))


def test_backward_nodes_are_found_at_their_allocations_and_named(tmp_path):
    model = Squarer()
    tracer = MemoryTracer(device="cpu")  # ops="backward", the default
    with tracer.trace(model):
        model(torch.randn(64, 32)).sum().backward()
    t = saved(tracer, tmp_path)
    names = {t["strings"][o["name"]] for o in t["ops"] if o["phase"] == "backward"}
    assert "SquareBackward" in names, names  # a custom Function's node, named by Python
    assert "AddmmBackward0" in names, names
    # The custom Function's backward allocations (2 * x * g: 64 x 256 floats) belong to the
    # module whose forward made its node.
    squarer = [o for o in t["ops"] if t["strings"][o["name"]] == "SquareBackward"]
    assert all(t["strings"][o["layer"]] == "Squarer" for o in squarer), [t["strings"][o["layer"]] for o in squarer]


def test_module_scopes_off_keeps_phases_and_iterations(tmp_path):
    model = Net()
    opt = torch.optim.Adam(model.parameters())  # allocates its state: optimizer-phase events
    tracer = MemoryTracer(device="cpu", ops="none", module_scopes=False)
    with tracer.trace(model):
        for _ in range(3):
            model(torch.randn(16, 32)).sum().backward()
            opt.step()
            opt.zero_grad()
    t = saved(tracer, tmp_path)
    layers = {name for name, _, _, _ in scopes(t)}
    assert "fc" not in layers and "Net" not in layers, layers
    assert len(t["iterations"]) == 3
    phases = {PHASES[tag >> 5] for tag in t["events"]["tag"]}  # shared/src/model/events.rs: phase << 5
    assert {"forward", "backward", "optimizer"} <= phases, phases


PHASES = ["forward", "backward", "optimizer", "other"]


def test_pause_takes_the_hooks_out_and_resume_puts_them_back(tmp_path):
    import memory_tracer

    original = nn.Module.__call__
    model = Net()
    tracer = MemoryTracer(device="cpu")
    try:
        with tracer.trace(model):
            model(torch.randn(8, 32))
            memory_tracer.pause()
            assert nn.Module.__call__ is original, "a paused program runs untouched"
            model(torch.randn(8, 32))  # neither recorded nor scoped
            memory_tracer.resume()
            first = nn.Module.__call__

            def theirs(self, *args, **kwargs):  # someone patches on top of ours...
                return first(self, *args, **kwargs)

            nn.Module.__call__ = theirs
            memory_tracer.pause()  # ...so ours stays beneath theirs, off
            memory_tracer.resume()  # and a new one wraps theirs
            assert nn.Module.__call__ not in (theirs, first)
            model(torch.randn(8, 32))
    finally:
        nn.Module.__call__ = original
    s = [(name, depth) for name, depth, _, _ in scopes(saved(tracer, tmp_path))]
    # Two recorded calls, each one Net scope with its fc inside: none while paused, and none
    # twice (the wrapper left beneath stays off).
    assert s.count(("Net", 0)) == 2 and s.count(("fc", 1)) == 2, s


def test_scope_calls_are_python_builtins_not_ctypes_calls():
    from memory_tracer import _shim

    enter, leave = _shim.scope_functions(_shim.load())
    # A builtin call costs a fraction of a ctypes call; the ctypes fallback is for a shim that
    # cannot find the C API.
    assert type(enter).__name__ == type(len).__name__ and type(leave).__name__ == type(len).__name__
    enter(7)
    leave(7)
    with pytest.raises(OverflowError):
        enter(-1)


def test_generated_code_switches_are_builtins_that_keep_their_scopes_balanced(tmp_path):
    """Inductor's generated code calls `_memory_tracer_scope.open/to/close`: the shim's builtins
    (a compiled step makes hundreds), entering a scope per module change only while live and
    leaving each one it entered, as the Python Switch does."""
    from memory_tracer import _capture, _compiled, _shim

    lib = _shim.load()
    functions = _shim.switch_functions(lib)
    assert functions is not None and all(type(f).__name__ == type(len).__name__ for f in functions)
    model = Net()
    tracer = MemoryTracer(device="cpu")
    with tracer.trace(model):
        cap = _capture._current
        a, b = cap.intern("gen.a"), cap.intern("gen.b")
        c = _compiled.CSwitch(functions)
        c.set_live(True)
        c.open()
        c.to(a)
        c.to(a)  # the same module: nothing
        c.to(b)
        c.open()  # a nested generated function has its own frame
        c.to(a)
        c.close()
        c.to(0)  # a statement of no module
        c.set_live(False)
        c.to(a)  # not live: nothing entered
        c.close()
        c.set_live(True)
        with pytest.raises(OverflowError):
            c.to(-1)
    s = [name for name, _, _, _ in scopes(saved(tracer, tmp_path)) if name.startswith("gen.")]
    assert s == ["gen.a", "gen.b", "gen.a"], s


def test_torch_compile_traces_through_the_module_call_without_a_graph_break(tmp_path):
    torch._dynamo.reset()
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    tracer = MemoryTracer(device="cpu")
    with tracer.trace(model):
        # fullgraph=True raises at a graph break: inner module calls are traced, not called
        compiled = torch.compile(model, fullgraph=True, backend="eager")
        out = compiled(torch.randn(2, 8))
        inner = torch.compile(lambda x: model[2](model[1](model[0](x))), fullgraph=True, backend="eager")
        again = inner(torch.randn(2, 8))
        model(torch.randn(2, 8))  # and eager calls still open scopes
    assert out.shape == again.shape == (2, 4)
    names = {n for n, _, _, _ in scopes(saved(tracer, tmp_path))}
    assert {"Sequential.0", "Sequential.1", "Sequential.2"} <= names, names
