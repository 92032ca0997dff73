"""torchvision ResNet-18 training, a few SGD steps on random images (CPU or CUDA)."""
import argparse

import torch
import torchvision

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=2)
p.add_argument("--size", type=int, default=64)
p.add_argument("--iters", type=int, default=2)
p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
a = p.parse_args()
torch.manual_seed(0)
model = torchvision.models.resnet18(num_classes=10).to(a.device)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
loss_fn = torch.nn.CrossEntropyLoss()
for i in range(a.iters):
    x = torch.randn(a.batch, 3, a.size, a.size, device=a.device)
    y = torch.randint(0, 10, (a.batch,), device=a.device)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(f"trained {a.iters} iterations, loss {loss.item():.3f}")
