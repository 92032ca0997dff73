"""What both captures keep and hook alike: the native capture (`_capture.Capture`) and the
recorder fallback (`_history.Recorder`) are each a `Tracker` (modules named by path, optimizers
by the order they first step, iterations ended by the first optimizer's steps or by the
iteration marker's calls), and `install` hooks the optimizer's step, torch.autograd.backward and
grad, and GradScaler.step for either through a small backend interface:

- `step_begins(opt)`, `step_ends(opt)`: around every optimizer step;
- `backward_begins(args, kwargs, roots_arg)`: before torch.autograd.backward/grad (`roots_arg`
  names the keyword of the tensors it starts from): None when it does not record the call,
  else what `backward_ends(began, args, kwargs, retain_at)` gets after it (`retain_at`: the
  positions of `retain_graph` and `create_graph`);
- `records_now()`: whether a GradScaler step is recorded now.

Module calls are hooked apart: the native capture replaces nn.Module.__call__ (`_scopes`), the
recorder, which must never raise into the program, uses PyTorch's global forward hooks.
"""

import weakref


class Tracker:
    """Module names, optimizers and iterations, kept alike by both captures (`track` sets them
    up). A tracker also gives `intern(name)` (the id a scope is recorded with),
    `begin_iteration()` and `end_iteration()`, and holds `holders` (`_holders.Holders`, or None)."""

    def track(self, marker):
        """Starts with no module named, no optimizer stepped, iteration 0; `marker`: the module
        path or class name whose calls are the iterations (`--iteration-marker`), or None."""
        # id(module) -> (path, interned id, weakref to the module): a plain dict lookup per
        # module call (a WeakKeyDictionary costs a weakref per lookup); the weakref tells a
        # reused id from the module it was given for.
        self.names = {}
        self.holders = None
        self.main_root = None
        self.root_names = set()
        self.optimizers = weakref.WeakKeyDictionary()  # optimizer -> [name, scope id, steps]
        self.primary_optimizer = None
        self.steps = 0
        self.iteration = 0
        self.iteration_open = False
        self.marker = marker

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

    def optimizer_entry(self, opt):
        """`[name, step scope, steps]` of an optimizer: `optimizer`, `optimizer1`, … in the order
        they first step."""
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


def install(tracker, backend):
    """Hooks every optimizer step, torch.autograd.backward and grad (Tensor.backward included),
    and GradScaler.step for `tracker`, answered by `backend` (see the module's doc). Gives
    `(handles, patches)`: the step hooks' handles, and each patch made as `(object, attribute,
    original, replacement)`."""
    import torch.autograd as autograd
    from torch.optim import optimizer as optim_module

    def opt_pre(opt, args, kwargs):
        backend.step_begins(opt)
        return None

    def opt_post(opt, args, kwargs):
        backend.step_ends(opt)
        return None

    handles = [optim_module.register_optimizer_step_pre_hook(opt_pre), optim_module.register_optimizer_step_post_hook(opt_post)]
    patches = []
    for attr, roots_arg, retain_at in (("backward", "tensors", (2, 3)), ("grad", "outputs", (3, 4))):
        orig = getattr(autograd, attr)
        ours = _phased(backend, orig, roots_arg, retain_at)
        setattr(autograd, attr, ours)
        patches.append((autograd, attr, orig, ours))
    patch = _hook_grad_scaler(tracker, backend.records_now)
    if patch is not None:
        patches.append(patch)
    return handles, patches


def _phased(backend, fn, roots_arg, retain_at):
    """`fn` (torch.autograd.backward or grad) as the backward phase of `backend`."""

    def wrapper(*args, **kwargs):
        began = backend.backward_begins(args, kwargs, roots_arg)
        if began is None:
            return fn(*args, **kwargs)
        try:
            return fn(*args, **kwargs)
        finally:
            backend.backward_ends(began, args, kwargs, retain_at)

    wrapper.__wrapped__ = fn
    wrapper.__doc__ = fn.__doc__
    wrapper.__name__ = fn.__name__
    return wrapper


def _hook_grad_scaler(tracker, recording):
    """GradScaler.step skips optimizer.step when gradients overflowed (AMP's first steps): the
    iteration still ends there. `recording()` says whether it records now. Gives the patch
    `(GradScaler, "step", original, replacement)` made, or None without GradScaler."""
    try:
        from torch.amp.grad_scaler import GradScaler
    except ImportError:
        return None
    orig_step = GradScaler.step

    def scaler_step(scaler, optimizer, *args, **kwargs):
        live = recording()
        before = tracker.optimizers.get(optimizer, [None, None, 0])[2] if live else 0
        try:
            return orig_step(scaler, optimizer, *args, **kwargs)
        finally:
            if live and recording():
                e = tracker.optimizer_entry(optimizer)
                if e[2] == before:
                    tracker.after_step(optimizer, e)

    GradScaler.step = scaler_step
    return (GradScaler, "step", orig_step, scaler_step)
