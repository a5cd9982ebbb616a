"""A training that reads its loss on the host every step, as logging loops do."""

import torch
from torch import nn

torch.manual_seed(0)
x, y = torch.randn(2048, 32), torch.randn(2048, 1)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
running = 0.0
for step in range(200):
    index = torch.randint(0, 2048, (64,))
    loss = nn.functional.mse_loss(model(x[index]), y[index])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    running += loss.item()
