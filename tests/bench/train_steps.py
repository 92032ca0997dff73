"""One training program for the overhead benchmark (tests/bench/overhead.py): trains STEPS
steps and prints `STEP_MS <median>` of the steps after the first 10 (each step timed with the
device synchronized at its end), as a user times them, and `HOST_MS <median>`: the time until
the step's work was queued (before the synchronization), the CPU side that tracing adds to.

    python train_steps.py --model resnet50|llama|mlp [--batch N] [--steps 60] [--device cuda]
        [--recorder off|all|python|none]

With 300 steps or more it also prints `FLAT_MS first100 <ms> last100 <ms>`: the medians of
steps 11-110 and of the last 100 (a trace that grows must not make steps slower).

`--recorder` turns on PyTorch's own recorder (`_record_memory_history(max_entries=100000)`)
with stacks="all" (its default), stacks="python", or context=None. Models: torchvision
ResNet-50 (SGD, 224x224), a transformers Llama-architecture LM (6 layers, width 512, 8 heads,
4 key/value heads, sequence 512, AdamW, bf16 autocast on CUDA), an MLP (SGD; the CPU proxy).
"""
import argparse
import resource
import statistics
import time

import torch
import torch.nn as nn


def build(name, batch, dev, compile=False):
    """The model, a function giving one step's loss, its optimizer and whether it trains
    under bf16 autocast; with `compile`, the model is `torch.compile`d (default mode)."""
    torch.manual_seed(0)
    amp = False
    if name == "resnet50":
        import torchvision

        model = torchvision.models.resnet50().to(dev)
        batch = batch or 32
        x = torch.randn(batch, 3, 224, 224, device=dev)
        y = torch.randint(0, 1000, (batch,), device=dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def loss_fn():
            return nn.functional.cross_entropy(model(x), y)

    elif name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(hidden_size=512, intermediate_size=1376, num_hidden_layers=6, num_attention_heads=8,
                             num_key_value_heads=4, vocab_size=32000, max_position_embeddings=1024, attn_implementation="sdpa")
        model = LlamaForCausalLM(config).to(dev)
        batch = batch or 8
        ids = torch.randint(0, config.vocab_size, (batch, 512), device=dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        amp = dev.type == "cuda"

        def loss_fn():
            return model(input_ids=ids, labels=ids).loss

    else:
        batch = batch or 64
        model = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.ReLU()) for _ in range(8)], nn.Linear(256, 10)).to(dev)
        x = torch.randn(batch, 256, device=dev)
        y = torch.randint(0, 10, (batch,), device=dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def loss_fn():
            return nn.functional.cross_entropy(model(x), y)

    if compile:
        model = torch.compile(model)  # loss_fn calls `model`, which is now the compiled one
    return model, loss_fn, opt, amp


def timed_step(dev, loss_fn, opt, amp):
    """Runs one step; (ms until its work was queued, ms until the device finished it, CPU ms
    the calling thread spent queuing it: unlike wall time, not lengthened by the thread
    waiting for a core)."""
    sync(dev)
    t, c = time.perf_counter(), time.thread_time()
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=amp):
        loss = loss_fn()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    queued, cpu = (time.perf_counter() - t) * 1000, (time.thread_time() - c) * 1000
    sync(dev)
    return queued, (time.perf_counter() - t) * 1000, cpu


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def recorder(kind):
    """Turns PyTorch's own recorder on ("all", "python", "none": context=None) or off (None)."""
    if kind is None:
        torch.cuda.memory._record_memory_history(enabled=None)
    elif kind == "none":
        torch.cuda.memory._record_memory_history(max_entries=100000, context=None)
    else:
        torch.cuda.memory._record_memory_history(max_entries=100000, stacks=kind)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True, choices=["resnet50", "llama", "mlp"])
    p.add_argument("--batch", type=int)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--recorder", default="off", choices=["off", "all", "python", "none"])
    a = p.parse_args()
    dev = torch.device(a.device)
    if dev.type == "cpu":
        # One compute thread: the collector and the capture's sender get the other cores, so
        # the proxy measures the capture's work, not a fight for cores.
        torch.set_num_threads(1)
    _, loss_fn, opt, amp = build(a.model, a.batch, dev)
    if a.recorder != "off":
        recorder(a.recorder)
    times, host = [], []
    for _ in range(a.steps):
        queued, done, _ = timed_step(dev, loss_fn, opt, amp)
        host.append(queued)
        times.append(done)
    print(f"STEP_MS {statistics.median(times[10:]):.3f}", flush=True)
    print(f"HOST_MS {statistics.median(host[10:]):.3f}", flush=True)
    if a.steps >= 300:  # long runs: does a step cost more as the trace grows?
        print(f"FLAT_MS first100 {statistics.median(times[10:110]):.3f} last100 {statistics.median(times[-100:]):.3f}", flush=True)
    print(f"MAXRSS_MB {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f}", flush=True)


if __name__ == "__main__":
    main()
