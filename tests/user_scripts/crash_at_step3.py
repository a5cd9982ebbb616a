"""A training that crashes at its third step (a shape bug in the third batch)."""

import sys

import torch
from torch import nn

model = nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
for step in range(10):
    width = 8 if step < 3 else 9
    loss = model(torch.randn(16, width)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
sys.exit(0)
