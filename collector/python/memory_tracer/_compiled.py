"""Inductor's generated code attributed to the modules it came from.

torch.compile inlines every module call of a compiled region into one graph, and Inductor runs
it as one generated Python function (`call`, and `partition_N` where the graph is partitioned):
untraced by module scopes, every allocation it makes would land on the compiled module. Each
generated module is read once, as PyTorch loads it (`PyCodeCache.load_by_key_path`, for fresh
compiles and cache hits alike):

- Inductor writes, above each kernel call and each kernel's definition, the FX nodes it came
  from (`# Topologically Sorted Source Nodes: [linear_3, relu_1]`); the graphs being compiled
  (found on the loading thread's stack: dynamo's, AOTAutograd's forward or backward) carry each
  node's `nn_module_stack` (`fwd_nn_module_stack` for backward nodes), whose keys are the
  modules' ids, or whose paths (`L['self'].blocks[0]`) are resolved against the compiled frame.
- A buffer is attributed to the kernel that first writes it, a kernel to the innermost module
  all its nodes share (fused across modules: their common parent).
- The generated functions are recompiled from their own source with one call to a switch
  before each statement whose module differs from the previous one's, and a `finally` that
  closes the last: the shim's scope stack stays balanced when the code raises (an OOM).

A statement whose nodes name no module (a compiled function with no module in it; a backward
graph compiled by a run that was not traced, where AOTAutograd's cache could not be bypassed)
runs on the compiled module itself, never on a neighbour's: counted for
the trace's meta (`sites`, `unresolved`). AOTAutograd's cache is bypassed while traced (it
hands back a backward without its graph); Inductor's still serves the code. A fresh compile writes down its buffers' modules
(`remember`), so later cache hits of the same code are attributed as it was. Nothing here runs while a graph executes but the switches: the
program's results, graphs and recompilations are those it has untraced.
"""

import ast
import importlib.abc
import importlib.machinery
import json
import os
import re
import sys
import threading
import types

SOURCE_NODES = re.compile(r"Source Nodes: \[([^\]]*)\]")
GENERATED = re.compile(r"^(call|partition_\d+)$")
ALLOCATED = re.compile(r"^(buf|pool)\d+$")
PATH_ROOT = re.compile(r"""^(L|G)\[['"]([^'"]+)['"]\]""")
PATH_PART = re.compile(r"""\.([A-Za-z_]\w*|\d+)|\[(-?\d+)\]|\[['"]([^'"]*)['"]\]""")
HELPER = "_memory_tracer_scope"
TARGET = "torch._inductor.codecache"
UNKNOWN = object()  # nodes that name no module: the statement runs on the compiled module
ENCLOSING = ""  # the compiled module itself (nodes of several roots)


class Switch:
    """The scope switches generated code calls: one frame per running generated function on
    each thread, holding the scope it entered (0: none)."""

    __slots__ = ("enter", "leave", "cap", "local")

    def __init__(self, enter, leave, cap):
        self.enter, self.leave, self.cap = enter, leave, cap
        self.local = threading.local()

    def live(self):
        live = self.cap.live
        return live is not None and live.on

    def open(self):
        stack = getattr(self.local, "stack", None)
        if stack is None:
            stack = self.local.stack = []
        stack.append(0)

    def to(self, scope):
        stack = self.local.stack
        top = stack[-1]
        if top == scope:
            return
        if top:
            self.leave(top)
        if scope and self.live():
            self.enter(scope)
            stack[-1] = scope
        else:
            stack[-1] = 0

    def close(self):
        top = self.local.stack.pop()
        if top:
            self.leave(top)


class CSwitch:
    """The same switches as the shim's builtins (`_shim.switch_functions`): what generated code
    calls (`_memory_tracer_scope.to(3)`) is then a C call, a fraction of a Python method's
    cost; `set_live` follows the capture's hooks (on at install, off when taken out)."""

    __slots__ = ("open", "to", "close", "set_live")

    def __init__(self, functions):
        self.open, self.to, self.close, self.set_live = functions


class Compiled:
    """Attribution of Inductor's generated code for one capture (see the module's doc)."""

    def __init__(self, cap, enter, leave, c_switch=None):
        self.cap = cap
        self.switch = Switch(enter, leave, cap)
        # What generated code is given: the C switches where the shim has them.
        self.helper = CSwitch(c_switch) if c_switch is not None else self.switch
        self.paths = {}  # (compile id, module path) -> scope name, kept for backward compiles
        self.graphs = 0
        self.sites = 0
        self.unresolved = 0
        self.modules = set()
        self.failures = []
        self.finder = None
        self.original = None
        self.autograd_cache_bypassed = False

    # -- installation --------------------------------------------------------------------
    def install(self):
        """Wraps PyCodeCache.load_by_key_path now, or when torch._inductor.codecache is
        imported (a meta-path finder, taken out once it has run)."""
        if isinstance(self.helper, CSwitch):
            self.helper.set_live(True)
        mod = sys.modules.get(TARGET)
        if mod is not None:
            self._wrap(mod)
            return
        if self.finder is None:
            self.finder = AfterImport(TARGET, self._imported)
            sys.meta_path.insert(0, self.finder)

    def uninstall(self):
        if isinstance(self.helper, CSwitch):
            self.helper.set_live(False)
        self._drop_finder()
        if self.autograd_cache_bypassed:
            try:
                import torch._functorch.config as functorch_config

                functorch_config.enable_autograd_cache = True
            except Exception:
                pass
            self.autograd_cache_bypassed = False
        if self.original is not None:
            cls, ours, orig = self.original
            if cls.__dict__.get("load_by_key_path") is ours:
                cls.load_by_key_path = orig
            self.original = None

    def _imported(self, module):
        self._drop_finder()
        if self.switch.live():
            self._wrap(module)

    def _drop_finder(self):
        if self.finder is not None:
            try:
                sys.meta_path.remove(self.finder)
            except ValueError:
                pass
            self.finder = None

    def _wrap(self, codecache):
        cls = getattr(codecache, "PyCodeCache", None)
        orig = cls.__dict__.get("load_by_key_path") if cls is not None else None
        if not isinstance(orig, classmethod) or self.original is not None:
            return
        func = orig.__func__
        this = self

        def load_by_key_path(cls, *args, **kwargs):
            mod = func(cls, *args, **kwargs)
            if this.switch.live():
                this.attribute(mod)
            return mod

        ours = classmethod(load_by_key_path)
        cls.load_by_key_path = ours
        self.original = (cls, ours, orig)
        self._bypass_autograd_cache()

    def _bypass_autograd_cache(self):
        """AOTAutograd's cache hands back a compiled backward without the graph it came from,
        so that code compiled by an untraced run would name no module (on an H200, 25 of 39
        allocation sites of a warm compiled model; 39 of 39 with the cache bypassed). While
        traced, AOTAutograd traces its graphs again (seconds); Inductor's own cache still
        serves the generated code, and what the program computes is the same."""
        try:
            import torch._functorch.config as functorch_config

            if getattr(functorch_config, "enable_autograd_cache", False):
                functorch_config.enable_autograd_cache = False
                self.autograd_cache_bypassed = True
        except Exception:
            pass

    # -- one generated module ------------------------------------------------------------
    def attribute(self, mod):
        if getattr(mod, HELPER, None) is not None:
            return
        call = getattr(mod, "call", None)
        path = getattr(mod, "__file__", None)
        code = getattr(getattr(call, "__func__", call), "__code__", None)
        if call is None or path is None or code is None or code.co_filename != path:
            return  # a kernel module, or C++ wrapper code
        try:
            with open(path, encoding="utf-8") as f:
                source = f.read()
            names, outputs, lowering = self._node_modules()
            buffers = buffer_modules(lowering, Resolver(names)) if lowering is not None else self._remembered(path)
            kept = self._instrument(mod, source, names, outputs, buffers)
        except Exception as e:  # never let attribution break a compile
            self.failures.append(f"{type(e).__name__}: {e}")
            return
        if kept is not None:
            self.graphs += 1
            if lowering is not None:
                remember(path, kept)

    def _remembered(self, path):
        """The buffers' modules a traced compile of this very code (the file is named by its
        source's hash) found, where the module names are this process's too: a cache hit has
        no graph to read them from, and older torch names no nodes in backward code."""
        known = {e[0] for e in self.cap.names.values()}
        try:
            with open(sidecar(path), encoding="utf-8") as f:
                saved = json.load(f)
        except (OSError, ValueError):
            return {}
        buffers = saved.get("buffers") if isinstance(saved, dict) else None
        if not isinstance(buffers, dict) or not all(isinstance(v, str) and (v in known or v == ENCLOSING) for v in buffers.values()):
            return {}
        return buffers

    def _node_modules(self):
        """(FX node name -> module scope name, from the graphs on this thread's stack (inner
        frames first: AOTAutograd's graph before dynamo's); the module of each output of the
        innermost graph, the one Inductor generated the code from, in order)."""
        import torch.fx

        graphs, seen = [], set()
        frame = sys._getframe(2)
        depth = 0
        while frame is not None and depth < 60:
            if frame.f_code.co_filename.find("torch") >= 0:
                for value in frame.f_locals.values():
                    if isinstance(value, torch.fx.GraphModule) and id(value) not in seen:
                        seen.add(id(value))
                        graphs.append(value)
            frame = frame.f_back
            depth += 1
        lowering = None
        try:
            from torch._inductor.virtualized import V
            from torch._inductor.graph import GraphLowering
            g = V.graph
            if isinstance(g, GraphLowering):
                lowering = g
                if isinstance(getattr(g, "module", None), torch.fx.GraphModule) and id(g.module) not in seen:
                    graphs.insert(0, g.module)
        except Exception:
            pass
        cid = compile_id()
        tx = dynamo_frame()
        names = {}
        outputs = []
        if graphs:
            for node in graphs[0].graph.nodes:
                if node.op == "output":
                    args = node.args[0] if node.args else ()
                    for a in args if isinstance(args, (tuple, list)) else (args,):
                        stack = getattr(a, "meta", {}).get("nn_module_stack") or getattr(a, "meta", {}).get("fwd_nn_module_stack")
                        outputs.append(self._module_scope(stack, cid, tx) if stack else None)
        for gm in graphs:
            for node in gm.graph.nodes:
                meta = node.meta
                stack = meta.get("nn_module_stack") or meta.get("fwd_nn_module_stack")
                if not stack:
                    continue
                scope = self._module_scope(stack, cid, tx)
                if scope is None:
                    continue
                names.setdefault(node.name, scope)
                for src in meta.get("from_node") or ():
                    n = getattr(src, "name", None) if not isinstance(src, tuple) else (src[0] if src else None)
                    if isinstance(n, str):
                        names.setdefault(n, scope)
        return names, outputs, lowering

    def _module_scope(self, stack, cid, tx):
        """The scope name of the innermost module in an `nn_module_stack`."""
        try:
            key, value = list(stack.items())[-1]
            path = value[0] if isinstance(value, tuple) else str(value)
        except Exception:
            return None
        cached = self.paths.get((cid, path))
        if cached is not None:
            return cached
        module = None
        if isinstance(key, str) and key.isdigit():
            entry = self.cap.names.get(int(key))
            if entry is not None:
                module = entry[2]()
                if module is not None and isinstance(value, tuple) and len(value) > 1 and type(module) is not value[1]:
                    module = None
        if module is None and tx is not None:
            module = resolve_path(path, tx)
        if module is None:
            return None
        entry = self.cap.names.get(id(module))
        if entry is None or entry[2]() is not module:
            entry = self.cap.name_root(module)
        self.paths[(cid, path)] = entry[0]
        return entry[0]

    def _instrument(self, mod, source, names, outputs, buffers):
        """Recompiles the generated functions with their switches; gives the module of each
        allocated buffer (None when there is nothing to instrument)."""
        lines = source.splitlines()
        tree = ast.parse(source)
        kernels = {}  # kernel name -> the names above its definition
        targets = []  # (function def, owner class name or None)
        prev_end = 0
        for stmt in tree.body:
            above = nodes_above(lines, prev_end, stmt.lineno)
            prev_end = stmt.end_lineno
            if isinstance(stmt, ast.Assign) and above is not None:
                for t in stmt.targets:
                    if isinstance(t, ast.Name):
                        kernels[t.id] = above
            elif isinstance(stmt, ast.FunctionDef) and GENERATED.match(stmt.name):
                targets.append((stmt, None))
            elif isinstance(stmt, ast.ClassDef):
                for sub in stmt.body:
                    if isinstance(sub, ast.FunctionDef) and sub.name == "call":
                        targets.append((sub, stmt.name))
        if not targets:
            return None
        resolve = Resolver(names)
        kernel_scopes = {k: resolve(v) for k, v in kernels.items()}
        replaced = {}
        kept = {}
        for fn, owner in targets:
            plan = Plan(lines, kernel_scopes, resolve, outputs if owner is not None or fn.name == "call" else [], buffers)
            plan.walk(fn.body, fn.lineno)
            self.sites += plan.sites
            self.unresolved += plan.unresolved
            for scope in plan.used:
                if scope:
                    self.modules.add(scope)
            kept.update(plan.allocated)
            fn.body = plan.rewrite(fn.body, self.cap.intern)
            fn.decorator_list = []
            module = ast.Module(body=[fn], type_ignores=[])
            ast.fix_missing_locations(module)
            ns = {}
            exec(compile(module, mod.__file__, "exec"), mod.__dict__, ns)
            replaced[(fn.name, owner)] = ns[fn.name]
        setattr(mod, HELPER, self.helper)
        for (name, owner), new in replaced.items():
            if owner is None:
                old = mod.__dict__.get(name)
                mod.__dict__[name] = new
                runner = mod.__dict__.get("runner")
                parts = getattr(runner, "partitions", None)
                if isinstance(parts, list) and old is not None:
                    runner.partitions = [new if p is old else p for p in parts]
            else:
                call = mod.__dict__.get("call")
                if isinstance(call, types.MethodType) and call.__func__.__name__ == "call":
                    mod.call = types.MethodType(new, call.__self__)
        return kept

    def meta(self):
        """What the trace's meta says about compiled code (None when none ran)."""
        if self.graphs == 0 and not self.failures:
            return None
        return {
            "graphs": self.graphs,
            "sites": self.sites,
            "unresolved": self.unresolved,
            "modules": sorted(self.modules),
            "failures": self.failures[:5],
        }


class Resolver:
    """FX node names -> a scope name (their modules' common parent), ENCLOSING, or UNKNOWN."""

    def __init__(self, names):
        self.names = names

    def __call__(self, nodes):
        scopes = {self.names[n] for n in nodes if n in self.names}
        if not scopes:
            return UNKNOWN
        if len(scopes) == 1:
            return next(iter(scopes))
        parts = [s.split(".") for s in scopes]
        common = []
        for segs in zip(*parts):
            if any(s != segs[0] for s in segs):
                break
            common.append(segs[0])
        return ".".join(common)


class Plan:
    """Which module each statement of a generated function runs for (see the module's doc)."""

    def __init__(self, lines, kernels, resolve, outputs, buffers):
        self.lines = lines
        self.outputs = outputs
        self.buffers = buffers  # buffer name -> module, from Inductor's own buffers' origins
        self.allocated = {}  # buffer name -> the module its allocation was given
        self.kernels = kernels
        self.resolve = resolve
        self.scope = {}  # id(statement) -> scope name, ENCLOSING or UNKNOWN
        self.sites = 0
        self.unresolved = 0
        self.used = set()

    def walk(self, body, prev_end):
        """Gives each statement its module: its own comment's or kernel's, or, for an
        allocation, that of the first later kernel statement that writes the buffer."""
        pending = {}  # buffer name -> its allocating statements waiting for a kernel
        unknown = {}  # buffer name -> its allocating statements, written by a kernel of no module
        allocations = []
        for stmt in flatten(body, prev_end, self.lines):
            if compound(stmt):
                continue
            own = self.own_scope(stmt)
            names = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)}
            allocated = allocated_name(stmt)
            if own is not None:
                for n in names & pending.keys():
                    for s in pending.pop(n):
                        self.scope[id(s)] = own
                        if own is UNKNOWN:
                            unknown.setdefault(n, []).append(s)
                self.scope[id(stmt)] = own
            if allocated is not None:
                allocations.append(stmt)
                known = self.buffers.get(allocated)
                if isinstance(own, str):
                    pass
                elif isinstance(known, str):
                    self.scope[id(stmt)] = known
                elif own is None:
                    pending.setdefault(allocated, []).append(stmt)
            if isinstance(stmt, ast.Return) and isinstance(stmt.value, ast.Tuple) and len(stmt.value.elts) == len(self.outputs):
                # A buffer no kernel with known nodes wrote (a CPU kernel, which carries no
                # comment): the graph's output it is (a gradient, in a backward graph).
                for elt, scope in zip(stmt.value.elts, self.outputs):
                    if isinstance(elt, ast.Call) and elt.args:
                        elt = elt.args[0]
                    if isinstance(elt, ast.Name) and scope is not None:
                        for s in pending.pop(elt.id, []) + unknown.pop(elt.id, []):
                            self.scope[id(s)] = scope
        for stmt in allocations:
            self.sites += 1
            scope = self.scope.get(id(stmt))
            if isinstance(scope, str):
                self.allocated[allocated_name(stmt)] = scope
            if scope is None or scope is UNKNOWN or scope == ENCLOSING:
                self.unresolved += 1
                self.scope[id(stmt)] = ENCLOSING
            else:
                self.used.add(scope)

    def own_scope(self, stmt):
        above = getattr(stmt, "_mt_above", None)
        if above is not None:
            return self.resolve(above)
        for n in ast.walk(stmt):
            if isinstance(n, ast.Call):
                f = n.func
                if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
                    f = f.value
                if isinstance(f, ast.Name) and f.id in self.kernels:
                    return self.kernels[f.id]
        return None

    def rewrite(self, body, intern):
        """The body with a switch before each statement whose module differs from the one
        before it, inside `open() ... try: ... finally: close()`."""
        last = [None]

        def go(stmts, fresh):
            if fresh:
                last[0] = None
            out = []
            for stmt in stmts:
                scope = self.scope.get(id(stmt))
                if scope is UNKNOWN:
                    scope = ENCLOSING
                if scope is not None and scope != last[0]:
                    out.append(helper_call("to", intern(scope) if scope else 0, stmt))
                    last[0] = scope
                for field in ("body", "orelse", "finalbody"):
                    sub = getattr(stmt, field, None)
                    if isinstance(sub, list) and sub and isinstance(sub[0], ast.stmt):
                        setattr(stmt, field, go(sub, not isinstance(stmt, ast.With)))
                if isinstance(stmt, ast.Try):
                    for h in stmt.handlers:
                        h.body = go(h.body, True)
                    last[0] = None
                elif not isinstance(stmt, ast.With) and any(getattr(stmt, f, None) for f in ("body", "orelse")):
                    last[0] = None
                out.append(stmt)
            return out

        first = body[0]
        inner = go(body, True)
        opened = helper_call("open", None, first)
        closed = helper_call("close", None, first)
        guarded = ast.Try(body=inner, handlers=[], orelse=[], finalbody=[closed])
        ast.copy_location(guarded, first)
        return [opened, guarded]


def compound(stmt):
    return any(isinstance(s, list) and s and isinstance(s[0], ast.stmt) for s in (getattr(stmt, f, None) for f in ("body", "orelse", "finalbody")))


def flatten(body, prev_end, lines):
    """The statements of `body` in source order, nested blocks' included, each with the FX
    nodes named in the comment just above it (`_mt_above`)."""
    for stmt in body:
        stmt._mt_above = nodes_above(lines, prev_end, stmt.lineno)
        prev_end = stmt.lineno
        subs = [getattr(stmt, f, None) for f in ("body", "orelse", "finalbody")]
        if compound(stmt):
            yield stmt
            for s in subs:
                if isinstance(s, list) and s and isinstance(s[0], ast.stmt):
                    yield from flatten(s, stmt.lineno, lines)
                    prev_end = s[-1].end_lineno
        else:
            yield stmt
            prev_end = stmt.end_lineno


def nodes_above(lines, start, lineno):
    """The node names of the `Source Nodes` comment between line `start` and `lineno`
    (1-based, exclusive), or None."""
    if lines is None:
        return None
    for i in range(lineno - 2, max(start, lineno - 12) - 1, -1):
        text = lines[i].strip() if 0 <= i < len(lines) else ""
        if not text.startswith("#"):
            if text:
                break
            continue
        m = SOURCE_NODES.search(text)
        if m:
            return [n.strip() for n in m.group(1).split(",") if n.strip()]
    return None


def allocated_name(stmt):
    """The buffer a statement allocates (`buf3 = empty_strided_cuda(...)`, a fallback op's
    output), or None (an alias such as `buf4 = buf3; del buf3  # reuse`)."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.value, ast.Call):
        t = stmt.targets[0]
        if isinstance(t, ast.Name) and ALLOCATED.match(t.id):
            f = stmt.value.func
            name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", "")
            if name not in ("reinterpret_tensor", "as_strided"):
                return t.id
    return None


def helper_call(method, arg, at):
    call = ast.Call(
        func=ast.Attribute(value=ast.Name(id=HELPER, ctx=ast.Load()), attr=method, ctx=ast.Load()),
        args=[] if arg is None else [ast.Constant(value=arg)],
        keywords=[],
    )
    stmt = ast.Expr(value=call)
    return ast.copy_location(stmt, at)


def buffer_modules(lowering, resolve):
    """Buffer name -> module, from the FX nodes Inductor made each buffer from (a fresh
    compile's GraphLowering)."""
    out = {}
    for name, buf in getattr(lowering, "name_to_buffer", {}).items():
        try:
            origins = buf.get_origins() if hasattr(buf, "get_origins") else getattr(buf, "origins", ())
        except Exception:
            continue
        scope = resolve([n.name for n in origins or () if hasattr(n, "name")])
        if isinstance(scope, str):
            out[name] = scope
    return out


def sidecar(path):
    """Where the buffers' modules of the generated file `path` are remembered."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "memory-tracer", "inductor", os.path.basename(path) + ".json")


def remember(path, buffers):
    """Writes the sidecar (atomically; a failure only costs a later cache hit its names)."""
    try:
        target = sidecar(path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        tmp = f"{target}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"buffers": buffers}, f)
        os.replace(tmp, target)
    except OSError:
        pass


def compile_id():
    try:
        import torch._guards
        return str(torch._guards.CompileContext.current_compile_id())
    except Exception:
        return None


def dynamo_frame():
    """The frame dynamo is compiling (its locals and globals), where there is one."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator
        tx = InstructionTranslator.current_tx()
    except Exception:
        return None
    return tx


def resolve_path(path, tx):
    """The module a dynamo source path (`L['self'].blocks[0]`, `G['model']._modules['fc']`)
    names in the compiled frame, without calling properties; None when it names none."""
    import torch.nn

    m = PATH_ROOT.match(path)
    if m is None:
        return None
    scope = getattr(tx, "f_locals", None) if m.group(1) == "L" else getattr(tx, "f_globals", None)
    if not isinstance(scope, dict):
        return None
    obj = scope.get(m.group(2))
    rest = path[m.end():]
    pos = 0
    while pos < len(rest) and obj is not None:
        p = PATH_PART.match(rest, pos)
        if p is None:
            return None
        pos = p.end()
        attr, index, key = p.group(1), p.group(2), p.group(3)
        if attr == "_modules":
            continue
        name = attr if attr is not None else key
        if name is None:  # [i]: a ModuleList or Sequential
            subs = list(obj._modules.values()) if isinstance(obj, torch.nn.Module) else None
            i = int(index)
            obj = subs[i] if subs is not None and -len(subs) <= i < len(subs) else None
        elif isinstance(obj, torch.nn.Module) and name in obj._modules:
            obj = obj._modules[name]
        else:
            obj = vars(obj).get(name) if hasattr(obj, "__dict__") else None
    return obj if isinstance(obj, torch.nn.Module) else None


class AfterImport(importlib.abc.MetaPathFinder):
    """Runs `then(module)` once `name` has been imported (its loader's exec_module wrapped)."""

    def __init__(self, name, then):
        self.name = name
        self.then = then
        self.busy = False

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name or self.busy:
            return None
        self.busy = True
        try:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        finally:
            self.busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        loader, then = spec.loader, self.then
        run = loader.exec_module

        def exec_module(module):
            run(module)
            try:
                then(module)
            except Exception as e:
                sys.stderr.write(f"memory-tracer: compiled code will not be attributed to modules ({e})\n")

        loader.exec_module = exec_module
        return spec
