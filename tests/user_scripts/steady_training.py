"""A whole training as the guides' users run it: a DataLoader with a slow __getitem__, a loss printed
each epoch, a message at the end. `python steady_training.py EPOCHS SLEEP_S` (default 2, 0)."""

import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 2
pause = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0


class Windows(Dataset):
    def __len__(self):
        return 960

    def __getitem__(self, index):
        time.sleep(0.0003)  # reading a file
        x = torch.randn(8)
        return x, x.sum(dim=0, keepdim=True)


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Windows(), batch_size=32, shuffle=True)
steps = 0
for epoch in range(epochs):
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
        time.sleep(pause)  # a slow step (a long run in a short test)
    print(f"epoch {epoch}: loss {loss.item():.4f}", flush=True)
print(f"finished {steps} steps")
