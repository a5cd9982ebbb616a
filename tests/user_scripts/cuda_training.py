"""A small image classifier trained the way the guides start: host tensors in a DataLoader, .to(device)
each step, fp32, a plain Adam, the loss read every step. Runs on CUDA when there is one.
`python cuda_training.py [EPOCHS]`"""

import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 2
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
images, labels = torch.randn(4096, 3, 32, 32), torch.randint(0, 10, (4096,))
loader = DataLoader(TensorDataset(images, labels), batch_size=128, shuffle=True)
model = nn.Sequential(
    nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10),
).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(epochs):
    total = 0.0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item()
    print(f"epoch {epoch}: mean loss {total / len(loader):.4f}", flush=True)
