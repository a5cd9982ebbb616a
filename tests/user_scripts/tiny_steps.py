"""A small model at batch 8, as the guides' forecasters run: every step is a few hundred tiny
operators, so the fixed cost per step (dispatch, Python, the optimizer's loop) is the time."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
data = TensorDataset(torch.randn(4096, 16), torch.randn(4096, 1))
loader = DataLoader(data, batch_size=8, shuffle=True)
layers = []
for _ in range(6):
    layers += [nn.Linear(16, 16), nn.Tanh()]
model = nn.Sequential(*layers, nn.Linear(16, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(3):
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
