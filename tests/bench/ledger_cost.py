"""What the device ledger costs a training step on a GPU, in pairs (issue 67): the default
capture with the ledger runs until first launches settle (the ledger then stops watching
launches and kernel lookups); then blocks of steps with CUPTI subscribed (the capture paused)
alternate with blocks where it is not (mt_ledger_stop / mt_ledger_start), and the default
capture's own cost is read the same way (resumed against paused). Needs PYTHONPATH to hold the
memory_tracer package.

    python tests/bench/ledger_cost.py [resnet50|llama] [--pairs 40] [--block 5]"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import train_steps  # noqa: E402

from memory_tracer import _capture, _ledger, _shim  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("model", nargs="?", default="resnet50")
p.add_argument("--pairs", type=int, default=40)
p.add_argument("--block", type=int, default=5, help="steps in a block (its median is compared)")
a = p.parse_args()
dev = torch.device("cuda")
model, loss_fn, opt, amp = train_steps.build(a.model, 0, dev)
for _ in range(5):
    train_steps.timed_step(dev, loss_fn, opt, amp)


def steps(n):
    return [train_steps.timed_step(dev, loss_fn, opt, amp)[1] for _ in range(n)]


def pairs(first, second):
    """Median over the pairs of block(first) / block(second) - 1, and its interquartile range;
    `first(on)` switches what is measured on or off."""
    ratios = []
    for k in range(a.pairs):
        times = {}
        for on in ((True, False) if k % 2 else (False, True)):
            first(on)
            times[on] = statistics.median(steps(a.block))
        second()
        ratios.append(times[True] / times[False] - 1)
    q = statistics.quantiles(ratios, n=4)
    return f"{statistics.median(ratios):+.2%} ({q[0]:+.2%} … {q[2]:+.2%}, {a.pairs} pairs of {a.block}-step blocks)"


lib = _shim.load()
untraced = statistics.median(steps(20))
cap = _capture.begin(lib, os.open(os.devnull, os.O_WRONLY), {"capture_ops": 2, "ledger": 1, "max_events": 100_000_000}, "api", {"mode": "bench"})
t0, watched = time.time(), []
while time.time() - t0 < 8:
    watched.append(train_steps.timed_step(dev, loss_fn, opt, amp)[1])
print(f"{a.model}: untraced {untraced:.2f} ms; default with the ledger, first 8 s: {statistics.median(watched):.2f} ms, "
      f"its last 20 steps {statistics.median(watched[-20:]):.2f} ms; {'; '.join(cap.ledger_missing) or 'first launches not settled'}", flush=True)
cap.pause()
cupti = _ledger.cupti_path(torch).encode()


def subscribed(on):
    if not on:
        lib.mt_ledger_stop()


def resubscribe():
    if lib.mt_ledger_start(cupti) != 0:
        sys.exit(f"the ledger could not start again: {_shim.last_error(lib)}")


print(f"{a.model}: CUPTI subscribed (settled, capture paused) against not: {pairs(subscribed, resubscribe)}", flush=True)
print(f"{a.model}: default capture with the ledger, resumed against paused: "
      f"{pairs(lambda on: (cap.resume if on else cap.pause)(), cap.pause)}", flush=True)
cap.finish("bench")
