"""A GAN-style loop: a generator and a discriminator, each with its own optimizer."""
import torch
import torch.nn as nn

torch.manual_seed(0)
G = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 16))
D = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
opt_d = torch.optim.Adam(D.parameters(), lr=1e-3)
opt_g = torch.optim.SGD(G.parameters(), lr=1e-2)
bce = nn.BCEWithLogitsLoss()
for step in range(3):
    real = torch.randn(16, 16)
    fake = G(torch.randn(16, 8))
    d_loss = bce(D(real), torch.ones(16, 1)) + bce(D(fake.detach()), torch.zeros(16, 1))
    opt_d.zero_grad()
    d_loss.backward()
    opt_d.step()
    g_loss = bce(D(fake), torch.ones(16, 1))
    opt_g.zero_grad()
    g_loss.backward()
    opt_g.step()
print("d", round(d_loss.item(), 3), "g", round(g_loss.item(), 3))
