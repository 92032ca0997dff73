"""Two training steps of a model, with marks after the second forward and backward, and what
PyTorch's own objects hold at each mark as one JSON line (`FACTS {...}`) for `collector why`
to be checked against (collector/tests/python_cpu.rs):

- parameter and buffer bytes: the storages of `named_parameters()` and `named_buffers()`;
- optimizer state: the storages of every tensor in `optimizer.state`;
- gradients (after backward): the storages of every parameter's `.grad`;
- saved for backward (after forward): the storages reachable from `loss.grad_fn` through the
  nodes' `_saved_*` attributes (unpacked, except where a saved-tensor hook packed them: then
  what it packed, if a tensor), each once, parameters' and buffers' excluded, by the module
  whose forward made the node (found with module hooks that read autograd's sequence
  numbers), a storage saved twice counted for the earliest node; with checkpointing, also
  the inputs (and, on the CPU, the random number generator's state) each checkpointed call
  keeps, recorded by wrapping `torch.utils.checkpoint`.

The facts are read after each mark, so the reading does not change what was live at it.

    holders_check.py MODEL [--checkpoint] [--compile] [--user-hooks] [--device cuda] [--large]
--large: a ResNet-50 at 224 px, a 12-layer LM of width 768 and an MoE of width 1024 (the GPU
runs), in place of the small models the CPU tests run.
MODEL: resnet (torchvision ResNet-18), lm (a transformers causal LM with AdamW and bf16
autocast), moe (a mixture of experts with Adam).
"""

import argparse
import json
import os

import torch

try:
    import memory_tracer
except ImportError:  # untraced
    memory_tracer = None


def mark(name):
    if memory_tracer is not None:
        memory_tracer.mark(name)


# The device whose memory the trace keeps (its CPU-side tensors, such as Adam's step counts on
# a GPU run, are another device's).
DEVICE = "cpu"


def storages(tensors):
    """{data pointer: bytes} of the tensors' storages on DEVICE (what they asked for: on CUDA
    the caching allocator's blocks are larger, and `collector why` gives both)."""
    out = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type == DEVICE:
            s = t.untyped_storage()
            if s.data_ptr():
                out[s.data_ptr()] = s.nbytes()
    return out


class Expert(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


class MoE(torch.nn.Module):
    def __init__(self, d=128, n=4):
        super().__init__()
        self.router = torch.nn.Linear(d, n)
        self.experts = torch.nn.ModuleList(Expert(d) for _ in range(n))
        self.head = torch.nn.Linear(d, 10)

    def forward(self, x):
        choice = self.router(x).argmax(-1)
        out = torch.zeros_like(x)
        for k, e in enumerate(self.experts):
            rows = (choice == k).nonzero().flatten()
            if rows.numel():
                out = out.index_add(0, rows, e(x[rows]))
        return self.head(out + x)


def build(name, checkpoint, device, large):
    torch.manual_seed(0)
    if name == "resnet":
        import torchvision

        model = torchvision.models.resnet50(num_classes=1000) if large else torchvision.models.resnet18(num_classes=10)
        if checkpoint:
            for k in range(1, 5):
                layer = getattr(model, f"layer{k}")
                layer.forward = checkpointed(layer.forward)
        model.to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        size, batch = (224, 32) if large else (64, 4)
        x, y = torch.randn(batch, 3, size, size, device=device), torch.randint(0, 10, (batch,), device=device)

        def step():
            return torch.nn.functional.cross_entropy(model(x), y)

    elif name == "lm":
        from transformers import LlamaConfig, LlamaForCausalLM

        if large:
            cfg = LlamaConfig(vocab_size=32000, hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                              num_key_value_heads=12, max_position_embeddings=512)
        else:
            cfg = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=512, num_hidden_layers=3, num_attention_heads=4,
                              num_key_value_heads=4, max_position_embeddings=64)
        model = LlamaForCausalLM(cfg)
        if checkpoint:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ids = torch.randint(0, cfg.vocab_size, (8, 512) if large else (4, 32), device=device)

        def step():
            with torch.autocast(device, dtype=torch.bfloat16):
                return model(input_ids=ids, labels=ids).loss

    else:
        model = MoE(1024, 8) if large else MoE()
        if checkpoint:
            for e in model.experts:
                e.forward = checkpointed(e.forward)
        model.to(device)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        d, rows = (1024, 4096) if large else (128, 64)
        x, y = torch.randn(rows, d, device=device), torch.randint(0, 10, (rows,), device=device)

        def step():
            return torch.nn.functional.cross_entropy(model(x), y)

    return model, opt, step


def checkpointed(fn):
    from torch.utils.checkpoint import checkpoint

    return lambda *a, **k: checkpoint(fn, *a, use_reentrant=False, **k)


# Whether the program enters saved-tensor hooks (checkpointing, --user-hooks).
HOOKED = False

# The inputs every checkpointed call keeps for its recomputation, by storage, last forward's.
CHECKPOINT_INPUTS = {}


def remember_checkpoint_inputs():
    import torch.utils.checkpoint as ckpt

    real = ckpt.checkpoint

    def flat(v):
        if isinstance(v, (list, tuple)):
            return [t for x in v for t in flat(x)]
        if isinstance(v, dict):
            return flat(list(v.values()))
        return [v]

    def checkpoint(fn, *args, **kwargs):
        if torch.is_grad_enabled():
            CHECKPOINT_INPUTS.update(storages(flat(list(args) + list(kwargs.values()))))
            if DEVICE == "cpu" and kwargs.get("preserve_rng_state", True):
                # It also keeps the CPU's random number generator state, a tensor, to replay.
                CHECKPOINT_INPUTS[("rng state", len(CHECKPOINT_INPUTS))] = torch.get_rng_state().untyped_storage().nbytes()
        return real(fn, *args, **kwargs)

    ckpt.checkpoint = checkpoint


class Ranges:
    """The autograd sequence numbers [first, end) of each module call (a module called twice,
    as ResNet's shared ReLU, has two), read by making a node (a multiplication of a 0-d tensor)
    before and after it."""

    def __init__(self, model):
        self.ranges = []
        # The capture names the model itself by its class.
        self.names = {id(m): n or type(m).__name__ for n, m in model.named_modules()}
        self.handles = []
        for m in model.modules():
            self.handles.append(m.register_forward_pre_hook(self.pre))
            self.handles.append(m.register_forward_hook(self.post))
        self.open = {}
        self.probe = torch.zeros((), requires_grad=True)  # on the CPU: a node, no device memory

    def seq(self):
        with torch.enable_grad():
            return (self.probe * 1).grad_fn._sequence_nr()

    def pre(self, m, args):
        self.open.setdefault(id(m), []).append(self.seq())

    def post(self, m, args, out):
        first = self.open[id(m)].pop()
        self.ranges.append((self.names[id(m)], first, self.seq()))

    def module_of(self, seq):
        best = None
        for name, a, b in self.ranges:
            if a <= seq < b and (best is None or b - a < best[1]):
                best = (name, b - a)
        return best[0] if best else ""


def saved_by_module(loss, ranges, exclude):
    """Storages the graph below `loss` saved (see the module's docstring), by module; what
    only checkpoints keep (their inputs), under "checkpoint inputs"."""
    # Nodes kept alive while walking: a node's Python object may die and its id be reused.
    seen, stack, found, kept = set(), [loss.grad_fn], [], []
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        kept.append(node)
        stack.extend(n for n, _ in node.next_functions)
        tensors = []
        for attr in dir(node):
            if not attr.startswith("_raw_saved_"):
                continue
            try:
                raw = getattr(node, attr)
            except RuntimeError:
                continue
            for sv in raw if isinstance(raw, (list, tuple)) else [raw]:
                if sv is None:
                    continue
                if not hasattr(sv, "data") and HOOKED:
                    continue  # an older torch (2.6) cannot show what a hook packed without running it
                if getattr(sv, "unpack_hook", None) is None:
                    # A custom Function's (torch.compile's, checkpoint's) are `saved_tensors`.
                    plain = "saved_tensors" if attr == "_raw_saved_tensors" else "_saved_" + attr[len("_raw_saved_"):]
                    try:
                        v = getattr(node, plain)
                    except RuntimeError:
                        continue
                    vs = v if isinstance(v, (list, tuple)) else [v]
                    tensors.extend(vs)
                else:
                    d = sv.data
                    tensors.extend(d if isinstance(d, (list, tuple)) else [d])
        if tensors:
            found.append((node._sequence_nr(), storages(tensors)))
    found.sort(key=lambda f: f[0])
    claimed, by_module = set(exclude), {}
    for seq, st in found:
        module = ranges.module_of(seq) if ranges else ""
        for ptr, n in st.items():
            if ptr not in claimed:
                claimed.add(ptr)
                by_module[module] = by_module.get(module, 0) + n
    for ptr, n in CHECKPOINT_INPUTS.items():
        if ptr not in claimed:
            claimed.add(ptr)
            by_module["checkpoint inputs"] = by_module.get("checkpoint inputs", 0) + n
    return by_module


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model", choices=["resnet", "lm", "moe"])
    p.add_argument("--checkpoint", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--user-hooks", action="store_true")
    p.add_argument("--device", default="cpu")
    p.add_argument("--large", action="store_true")
    p.add_argument("--deterministic", action="store_true", help="deterministic kernels (a GPU's atomics otherwise vary the loss run to run)")
    a = p.parse_args()
    if a.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    # The same results traced and untraced, also on a GPU.
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    torch.set_num_threads(1)
    global HOOKED, DEVICE
    HOOKED = a.checkpoint or a.user_hooks
    DEVICE = torch.device(a.device).type
    if a.checkpoint:
        remember_checkpoint_inputs()
    model, opt, step = build(a.model, a.checkpoint, a.device, a.large)
    if a.compile:
        model.forward = torch.compile(model.forward, backend="aot_eager")
    ranges = None if a.compile else Ranges(model)
    counts = {"pack": 0, "unpack": 0}

    def pack(t):
        counts["pack"] += 1
        return t

    def unpack(t):
        counts["unpack"] += 1
        return t

    facts = {}
    for it in range(2):
        opt.zero_grad(set_to_none=True)
        CHECKPOINT_INPUTS.clear()
        if a.user_hooks:
            with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                loss = step()
        else:
            loss = step()
        if it == 1:
            mark("after_forward")
            params = storages(t for _, t in model.named_parameters())
            buffers = storages(t for _, t in model.named_buffers())
            state = storages(v for s in opt.state.values() for v in s.values())
            saved = saved_by_module(loss, ranges, set(params) | set(buffers))
            facts["after_forward"] = {
                "parameter": sum(params.values()),
                "buffer": sum(buffers.values()),
                "optimizer_state": sum(state.values()),
                "saved_for_backward": saved,
            }
        loss.backward()
        if it == 1:
            mark("after_backward")
            grads = storages(t.grad for t in model.parameters() if t.grad is not None)
            facts["after_backward"] = {"gradient": sum(grads.values())}
        opt.step()
    facts["loss"] = round(loss.item(), 5)
    facts["hooks"] = counts
    print("FACTS " + json.dumps(facts, sort_keys=True))


if __name__ == "__main__":
    main()
