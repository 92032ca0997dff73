"""A training loop that keeps every step's loss tensor and last batch in Python (a leak a
user makes), and an evaluation closure that keeps its probe batch: `collector trace
--holders=python` names the list, the attribute and the closure's variable holding them
(collector/tests/python_cpu.rs)."""
import torch

import memory_tracer


class Trainer:
    def __init__(self):
        self.model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.last_batch = None

    def step(self, history):
        x = torch.randn(512, 256)
        self.last_batch = x
        loss = self.model(x).pow(2).mean()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        history.append(torch.full((4096,), float(loss.item())))  # 16 KiB a step, never freed


def make_probe(model):
    """An evaluation closure that keeps its probe batch (64 KiB) for as long as it lives."""
    probe = torch.randn(64, 256)

    def evaluate():
        with torch.no_grad():
            return float(model(probe).mean())

    return evaluate


def main():
    torch.manual_seed(0)
    trainer = Trainer()
    evaluate = make_probe(trainer.model)
    history = []
    for _ in range(8):
        trainer.step(history)
    print(evaluate())
    memory_tracer.mark("end")
    print(len(history))


if __name__ == "__main__":
    main()
