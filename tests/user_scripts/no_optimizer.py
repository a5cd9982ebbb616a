"""An evaluation script: a model run over a DataLoader without training (no optimizer step)."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

model = nn.Linear(8, 1)
with torch.no_grad():
    total = sum(model(x).sum().item() for (x,) in DataLoader(TensorDataset(torch.randn(512, 8)), batch_size=64))
print(f"evaluated: {total:.3f}")
