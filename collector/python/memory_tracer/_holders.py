"""Who holds each tensor's storage (`collector trace --holders`): parameters and buffers (by
module path and name), gradients (`.grad` of which parameter), optimizer state (which key of
which parameter) and tensors saved for backward (by the autograd node that saved them), each
sent as an `MtHolder` (record/shim/mt_shim.h) when it takes or lets go of a storage; the
collector joins each to the allocation live at its address then (record/src/assemble.rs).

It only reads what the program already has, at moments the capture already hooks: a model's
first call (its parameters and buffers), the start of each backward (the autograd graph, read
through each node's saved variables' `data`, which runs no unpack hook, so activation
checkpointing recomputes nothing and the user's own hooks run as often as untraced), the end
of each backward (gradients), each optimizer step (its state) and each mark. It installs no
hook of its own on tensors, autograd or saved tensors, so what the program computes, and every
check autograd makes, stay as they are untraced.
"""

import struct
import sys
import threading
import time
import types
import weakref

from . import _shim

_RECORD = struct.Struct(_shim.HOLDER_FORMAT)
_FLUSH_BYTES = 1 << 16
# torch.device.type -> c10::DeviceType.
_DEVICE_TYPES = {"cpu": 0, "cuda": 1, "hip": 6, "xla": 9, "xpu": 12, "mps": 13, "hpu": 15, "mtia": 19, "privateuseone": 20}
_SAVED_PREFIX = "_raw_saved_"


class Holders:
    def __init__(self, cap, python=False):
        import torch

        self.torch = torch
        self.cap = cap
        self.lib = cap.lib
        self.python = python
        self.buf = bytearray()
        self.lock = threading.Lock()
        # id(param) -> (weakref, name id, module id, full name) of every parameter and buffer
        self.params = {}
        self.buffers = {}
        # (kind, id(owner), key) -> (storage pointer, weakref to the tensor, its data pointer)
        # last sent, so each change is sent once (Python holders: the data pointer)
        self.sent = {}
        # Saved storages taken at a backward's start, let go at its end
        self.saved = []
        self.saved_names = {}  # node class -> [raw saved attribute names]
        self.node_names = {}  # node class -> interned id of its name
        self.python_held = {}  # data pointer -> its storage, of what Python variables hold
        self.pending = {}  # (device, address) -> the block of a free waiting for another stream
        self.pending_off = False  # reading the allocator's state proved slow: not read again
        self.step_began = -1  # when the optimizer step under way began (mt_now_ns)
        # Whether a saved variable shows what it keeps without unpacking (`data`: torch 2.11 and
        # newer); older ones are unpacked (`_saved_*`), which runs no hook only while no
        # saved-tensor hook was ever entered, so after one their saved tensors go unread.
        # (The class, not an instance: a saved variable's Python object points into its node
        # and must not outlive it.)
        self.read_data = hasattr(getattr(torch._C._autograd, "SavedTensor", None), "data")
        self.hooks_used = False
        self.unread_noted = False

    # -- records -------------------------------------------------------------------------
    def _storage(self, t):
        """(ptr, bytes, device type, device index) of a dense tensor's storage, else None."""
        try:
            local = getattr(t, "_local_tensor", None)  # a DTensor's shard
            if local is not None:
                t = local
            st = t.untyped_storage()
            ptr = st.data_ptr()
            if not ptr:
                return None
            dev = t.device
            code = _DEVICE_TYPES.get(dev.type)
            if code is None:
                return None
            return ptr, st.nbytes(), code, dev.index or 0
        except Exception:  # sparse, meta, fake and functional tensors have no storage of their own
            return None

    def _send(self, kind, take, where, name=0, module=0, seq=-1, ts=None):
        ptr, nbytes, dt, di = where
        rec = _RECORD.pack(self.lib.mt_now_ns() if ts is None else ts, ptr, nbytes, seq, name, module, kind, take, dt, di, 0)
        with self.lock:
            self.buf += rec
            if len(self.buf) >= _FLUSH_BYTES:
                self._flush_locked()

    def _take(self, kind, owner_id, key, t, name, module, since=-1):
        """Sends that `t` is held as `key` of `owner_id`, if its storage changed since. `since`:
        when the backward or optimizer step that made it began (it held the block from its
        allocation, if that came after: a gradient from the moment autograd made it)."""
        # Sent again for another tensor or storage, even at the same address (a new gradient
        # where the last one was freed). The same tensor at the same data pointer is the same
        # storage (a new one is made before the old is let go): most parameters, each rescan,
        # at the cost of one call.
        k = (kind, owner_id, key)
        prev = self.sent.get(k)
        same = prev is not None and prev[1]() is t
        try:
            at = t.data_ptr()
        except Exception:  # no storage of its own: read in full below
            at = None
        if same and at is not None and at == prev[2]:
            return
        where = self._storage(t)
        if where is None or (same and prev[0] == where[0]):
            return
        self.sent[k] = (where[0], weakref.ref(t), at)
        self._send(kind, 1, where, name, module, since)

    def flush(self):
        with self.lock:
            self._flush_locked()

    def _flush_locked(self):
        if self.buf:
            data = bytes(self.buf)
            self.buf.clear()
            # Queued for the stream thread; a frame of its own (a shim without the queue)
            # drains every record first, on this thread.
            queue = getattr(self.lib, "mt_holders_queue", None)
            if queue is None or queue(data, len(data)) != 0:
                self.lib.mt_stream_send(_shim.FRAME_HOLDERS, data, len(data))

    # -- parameters, buffers, gradients and optimizer state ----------------------------------
    def name_module(self, module, path):
        """A named module's own parameters and buffers (`cap.name_root` calls it for each)."""
        intern = self.cap.intern
        mid = intern(path)
        try:
            params = list(module.named_parameters(recurse=False))
            buffers = list(module.named_buffers(recurse=False))
        except Exception:
            return
        for attr, p in params:
            if p is None or id(p) in self.params:
                continue
            self.params[id(p)] = (weakref.ref(p), intern(attr), mid, f"{path}.{attr}" if path else attr)
            self._take(_shim.HOLDER_PARAMETER, id(p), None, p, self.params[id(p)][1], mid)
        for attr, b in buffers:
            if b is None or id(b) in self.buffers:
                continue
            self.buffers[id(b)] = (weakref.ref(b), intern(attr), mid, f"{path}.{attr}" if path else attr)
            self._take(_shim.HOLDER_BUFFER, id(b), None, b, self.buffers[id(b)][1], mid)

    def rescan(self, since=-1):
        """Parameters and buffers moved or replaced (`.to()`, `p.data = ...`), and gradients
        (held since their allocation, if after `since`: the backward that made them began)."""
        for table, kind in ((self.params, _shim.HOLDER_PARAMETER), (self.buffers, _shim.HOLDER_BUFFER)):
            gone = []
            for key, (ref, name, module, _) in table.items():
                t = ref()
                if t is None:
                    gone.append(key)
                    continue
                self._take(kind, key, None, t, name, module)
                if kind == _shim.HOLDER_PARAMETER:
                    g = t.grad
                    if g is not None:
                        self._take(_shim.HOLDER_GRADIENT, key, None, g, name, module, since)
            for key in gone:
                del table[key]

    def step_begins(self):
        self.step_began = self.lib.mt_now_ns()
        if self.python:
            self.python_referrers()

    def optimizer_state(self, opt):
        """Every tensor in `opt.state`, by key, of its parameter (after each step; state the
        step made was held from its allocation)."""
        intern = self.cap.intern
        try:
            state = list(opt.state.items())
        except Exception:
            return
        for p, st in state:
            if not isinstance(st, dict):
                continue
            entry = self.params.get(id(p))
            if entry is not None and entry[0]() is p:
                attr, module = entry[3].rsplit(".", 1)[-1], entry[2]
            else:
                attr, module = "param", 0
            for key, v in st.items():
                if isinstance(v, self.torch.Tensor):
                    self._take(_shim.HOLDER_OPTIMIZER_STATE, id(p), key, v, intern(f"{attr}.{key}"), module, self.step_began)

    # -- tensors saved for backward ----------------------------------------------------------
    def _saved_attrs(self, cls):
        names = self.saved_names.get(cls)
        if names is None:
            names = self.saved_names[cls] = [n for n in dir(cls) if n.startswith(_SAVED_PREFIX)]
        return names

    def _node_name(self, cls):
        i = self.node_names.get(cls)
        if i is None:
            i = self.node_names[cls] = self.cap.intern(cls.__name__)
        return i

    def walk(self, roots):
        """Takes the storages every node of the graph below `roots` (tensors) saved, without
        unpacking them: a saved variable's `data` is the tensor it keeps (or what a user's pack
        hook made of it: a tensor is kept, anything else keeps none). What a saved-tensor hook
        keeps for later (activation checkpointing's inputs, saved by a node of its own that no
        output leads to) is found through the unpack hook's closure. Parameters (leaves) are
        not saved tensors of theirs."""
        torch = self.torch
        stack = [r.grad_fn for r in roots if isinstance(r, torch.Tensor) and r.grad_fn is not None]
        # Nodes are kept alive while walking: a node's Python object may die and its id be
        # given to another's.
        seen, kept = set(), []
        hooks, searched = {}, set()
        taken = []
        params = self.params
        while stack:
            while stack:
                node = stack.pop()
                if id(node) in seen:
                    continue
                seen.add(id(node))
                kept.append(node)
                self._node(node, stack, seen, hooks, taken, params)
            for key, hook in list(hooks.items()):
                if key in searched:
                    continue
                searched.add(key)
                # What the hook keeps: tensors (checkpoint's inputs, as torch 2.15 keeps them),
                # and nodes that saved them (torch 2.11's, through an output of no size).
                name = self.cap.intern("kept by " + getattr(hook, "__qualname__", "a saved-tensor hook").split(".")[0])
                for t in _reachable_tensors(hook, torch):
                    if t.grad_fn is not None and id(t.grad_fn) not in seen:
                        stack.append(t.grad_fn)
                    where = self._storage(t) if id(t) not in params else None
                    if where is not None:
                        taken.append((where, name, -1))
        # Earliest node first: of two nodes saving one storage, the first made holds it.
        taken.sort(key=lambda x: x[2])
        now = self.lib.mt_now_ns()
        for where, name, seq in taken:
            self._send(_shim.HOLDER_SAVED, 1, where, name, 0, seq, now)
        return taken

    def _node(self, node, stack, seen, hooks, taken, params):
        """One node of `walk`: its next nodes onto `stack`, its saved storages into `taken`,
        its saved variables' unpack hooks into `hooks`."""
        torch = self.torch
        cls = type(node)
        try:
            nexts = node.next_functions
        except Exception:
            nexts = ()
        for nxt, _ in nexts:
            if nxt is not None and id(nxt) not in seen:
                stack.append(nxt)
        saved = []
        for attr in self._saved_attrs(cls):
            try:
                v = getattr(node, attr)
            except Exception:  # released, or undefined
                continue
            if isinstance(v, (list, tuple)):
                saved.extend(v)
            elif v is not None:
                saved.append(v)
        if not saved:
            return
        try:
            seq = node._sequence_nr()
        except Exception:
            seq = -1
        name = self._node_name(cls)
        if not self.read_data:
            self._unpacked(node, cls, name, seq, taken, params)
            return
        for sv in saved:
            hook = getattr(sv, "unpack_hook", None)
            if hook is not None:
                hooks.setdefault(id(hook), hook)
            data = getattr(sv, "data", None)
            for t in data if isinstance(data, (list, tuple)) else (data,):
                if not isinstance(t, torch.Tensor) or id(t) in params:
                    continue
                where = self._storage(t)
                if where is not None:
                    taken.append((where, name, seq))

    def backward_begins(self, roots):
        began = self.lib.mt_now_ns()
        if self.python:
            # What Python keeps through the step (its input batch), once the graph that also
            # saved it is gone.
            self.python_referrers()
        try:
            taken = self.walk(roots)
        except Exception as e:  # never let the capture break a backward
            sys.stderr.write(f"memory-tracer: reading the autograd graph failed: {e}\n")
            taken = []
        self.saved.append((taken, began))

    def backward_ends(self, retained):
        taken, began = self.saved.pop() if self.saved else ([], -1)
        if not retained:
            now = self.lib.mt_now_ns()
            for where, name, seq in taken:
                self._send(_shim.HOLDER_SAVED, 0, where, name, 0, seq, now)
        self.rescan(began)

    def _unpacked(self, node, cls, name, seq, taken, params):
        """A node's saved tensors on a torch whose saved variables do not show them: unpacked,
        as long as no saved-tensor hook was ever entered (unpacking would run it)."""
        torch = self.torch
        if self.hooks_used:
            if not self.unread_noted:
                self.unread_noted = True
                self.cap.notes.append(
                    f"torch {torch.__version__} cannot show a saved tensor without unpacking it: after the program "
                    "entered a saved-tensor hook (activation checkpointing, save_on_cpu, its own), tensors saved for "
                    "backward were not read (`collector why` infers them)")
            return
        for attr in self._saved_attrs(cls):
            plain = "saved_tensors" if attr == "_raw_saved_tensors" else "_saved_" + attr[len(_SAVED_PREFIX):]
            try:
                v = getattr(node, plain)
            except Exception:
                continue
            for t in v if isinstance(v, (list, tuple)) else (v,):
                if isinstance(t, torch.Tensor) and id(t) not in params:
                    where = self._storage(t)
                    if where is not None:
                        taken.append((where, name, seq))

    # -- frees waiting for other streams ---------------------------------------------------
    def pending_frees(self):
        """Blocks the CUDA caching allocator keeps for frees that wait on another stream
        (`record_stream`), read from its own state (`torch.cuda.memory_snapshot()`, which needs
        no memory history and costs a walk of the segments): each is sent once while pending and
        let go of at the first look that finds it done, so its completion is known to lie
        between the two looks. Called at marks and out-of-memory errors; not again once a read
        took over 0.1 s (the program's own memory history makes it symbolize every stack)."""
        torch = self.torch
        if self.pending_off:
            return
        try:
            if not torch.cuda.is_initialized():
                return
            began = time.perf_counter()
            segments = torch.cuda.memory_snapshot()
        except Exception:  # no CUDA, another allocator backend: nothing to read
            return
        # With the program's own memory history on, the snapshot symbolizes every block's stack
        # (seconds on a large run): then pending frees are not read again.
        self.pending_off = time.perf_counter() - began > 0.1
        now = {}
        for seg in segments:
            address, device = seg.get("address"), seg.get("device")
            if not isinstance(address, int) or not isinstance(device, int):
                continue
            for b in seg.get("blocks", ()):
                size = b.get("size", 0)
                if b.get("state") == "active_pending_free":
                    now[(device, address)] = (address, size, _DEVICE_TYPES["cuda"], device)
                address += size
        for key in [k for k in self.pending if k not in now]:
            self._send(_shim.HOLDER_PENDING_FREE, 0, self.pending.pop(key))
        for key, where in now.items():
            if key not in self.pending:
                self.pending[key] = where
                self._send(_shim.HOLDER_PENDING_FREE, 1, where)

    # -- Python variables (--holders=python) ------------------------------------------------
    def python_referrers(self):
        """Tensors that Python variables and attributes hold at a mark, a backward's start and an
        optimizer step's start: every frame's locals
        (of every thread) and `__main__`'s globals, with one level of containers, of objects'
        attributes and of functions' closures (`trainer.last_batch`, `batches[3]`,
        `main:step:x`). Each is sent once while it
        holds the storage; one gone by the next look is let go of then."""
        torch = self.torch
        found = {}

        def visit(path, v, depth):
            if isinstance(v, torch.Tensor):
                where = self._storage(v)
                if where is not None and where[0] not in found:
                    found[where[0]] = (path, where)
                return
            if depth == 0:
                return
            if isinstance(v, (list, tuple)):
                for k, x in enumerate(v[:64]):
                    visit(f"{path}[{k}]", x, depth - 1)
            elif isinstance(v, dict):
                for k, x in list(v.items())[:64]:
                    visit(f"{path}[{k!r}]", x, depth - 1)
            elif isinstance(v, types.FunctionType):
                # A closure's variables (a training step that keeps its batch): `main:step:x`.
                for k, cell in zip(v.__code__.co_freevars, v.__closure__ or ()):
                    try:
                        x = cell.cell_contents
                    except ValueError:  # not set yet
                        continue
                    visit(f"{path}:{k}", x, depth - 1)
            elif hasattr(v, "__dict__") and not isinstance(v, (type, torch.nn.Module)) and type(v).__module__ not in ("builtins",):
                try:
                    attrs = list(vars(v).items())[:64]
                except TypeError:
                    return
                for k, x in attrs:
                    visit(f"{path}.{k}", x, depth - 1)

        main = sys.modules.get("__main__")
        if main is not None:
            for k, v in list(vars(main).items()):
                if not k.startswith("__"):
                    visit(k, v, 2)
        me = threading.get_ident()
        frames = sys._current_frames()
        try:
            for tid, frame in frames.items():
                chain, f = [], frame.f_back if tid == me else frame
                while f is not None:
                    chain.append(f)
                    f = f.f_back
                # Outermost first: a tensor the loop keeps is named by the loop's variable
                # (`main:history[3]`), not by the step's that also points at it.
                for f in reversed(chain):
                    code = f.f_code
                    # Not the package's own frames, nor a module's top level (its globals, above).
                    if "memory_tracer" not in (code.co_filename or "") and f.f_locals is not f.f_globals:
                        for k, v in list(f.f_locals.items()):
                            visit(f"{code.co_name}:{k}", v, 2)
        finally:
            # This frame's own frame object is among them: a reference to it from its own
            # locals would keep it, the frames it was called from and their variables (the
            # program's tensors) alive after it returns, until the garbage collector runs.
            frames = frame = f = chain = visit = None
        # What parameters, buffers, gradients and optimizer state hold now: an entry whose
        # tensor is gone (a gradient zero_grad let go) or moved holds nothing, and its old
        # address may be a Python variable's tensor's now.
        held = set()
        for (kind, _, _), v in self.sent.items():
            if kind == _shim.HOLDER_PYTHON:
                continue
            t = v[1]()
            try:
                if t is not None and (v[2] is None or t.data_ptr() == v[2]):
                    held.add(v[0])
            except Exception:
                held.add(v[0])
        intern = self.cap.intern
        current = {ptr: (intern(path), where) for ptr, (path, where) in found.items() if ptr not in held}
        # Gone, or held under another name now (a step's `self.batch` is `trainer.batch` once the
        # step returned): the old name lets go.
        for key in [k for k in self.sent if k[0] == _shim.HOLDER_PYTHON and current.get(k[1], (None,))[0] != k[2]]:
            ptr = self.sent.pop(key)
            where = self.python_held.get(ptr)
            if where is not None:
                self._send(_shim.HOLDER_PYTHON, 0, where, key[2], 0)
        for ptr, (name, where) in current.items():
            if self.sent.get((_shim.HOLDER_PYTHON, ptr, name)) == ptr:
                continue
            self.sent[(_shim.HOLDER_PYTHON, ptr, name)] = ptr
            self.python_held[ptr] = where
            self._send(_shim.HOLDER_PYTHON, 1, where, name, 0)


def _reachable_tensors(root, torch, limit=256):
    """Tensors reachable from a function through its closure, the objects and containers in
    it and their attributes (at most `limit` objects; modules, types and modules' parameters
    are not followed)."""
    out, seen, queue = [], set(), [root]
    saved_tensor = getattr(torch._C._autograd, "SavedTensor", None)
    while queue and len(seen) < limit:
        obj = queue.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            out.append(obj)
        elif saved_tensor is not None and isinstance(obj, saved_tensor):
            # One the program made itself (torch 2.15's checkpoint keeps its inputs so): it
            # owns what it saved, and `data` shows it without unpacking.
            queue.append(getattr(obj, "data", None))
        elif isinstance(obj, (type(sys), type, torch.nn.Module, str, bytes, int, float)):
            continue
        elif isinstance(obj, (list, tuple, set, frozenset)):
            queue.extend(list(obj)[:64])
        elif isinstance(obj, dict):
            queue.extend(list(obj.values())[:64])
        elif callable(obj) and hasattr(obj, "__code__"):
            for cell in obj.__closure__ or ():
                try:
                    queue.append(cell.cell_contents)
                except ValueError:  # an empty cell
                    pass
        else:
            inner = getattr(obj, "__func__", None)  # a bound method
            if inner is not None:
                queue.append(inner)
                queue.append(getattr(obj, "__self__", None))
            try:
                queue.extend(list(vars(obj).values())[:64])
            except TypeError:
                pass
    return out
