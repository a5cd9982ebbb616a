"""A training whose time is its matmuls: wide layers, data already in memory, batches by index."""

import torch
from torch import nn

torch.manual_seed(0)
x, y = torch.randn(4096, 1024), torch.randn(4096, 1024)
model = nn.Sequential(nn.Linear(1024, 2048), nn.Linear(2048, 2048), nn.Linear(2048, 1024))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(100):
    index = torch.randint(0, 4096, (512,))
    loss = nn.functional.mse_loss(model(x[index]), y[index])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
