"""A training as the guides' users write it, held back by its data: a slow __getitem__ and num_workers=0."""

import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SlowWindows(Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, index):
        time.sleep(0.002)  # decoding a file, a pandas lookup... (64 ms a batch: input-bound even on a stalled, busy box)
        x = torch.randn(16)
        return x, x.sum(dim=0, keepdim=True)


model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
loader = DataLoader(SlowWindows(), batch_size=32, shuffle=True, num_workers=0)
for epoch in range(3):
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
