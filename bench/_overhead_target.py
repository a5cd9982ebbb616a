"""The training bench/doctor_overhead.py times with and without gpufill's instrumentation: a plain
PyTorch loop with a DataLoader, .to(), .item() every step; prints its median step time as JSON."""

import json
import statistics
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

steps, width = int(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(0)
torch.set_num_threads(1)
data = TensorDataset(torch.randn(steps * 64 + 64, width), torch.randn(steps * 64 + 64, 1))
loader = DataLoader(data, batch_size=64, shuffle=True)
model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
times, tick = [], time.perf_counter()
for x, y in loader:
    x, y = x.to("cpu"), y.to("cpu")
    loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    loss.item()
    now = time.perf_counter()
    times.append(now - tick)
    tick = now
    if len(times) >= steps:
        break
print(json.dumps({"median_step_s": statistics.median(times[10:]), "steps": len(times)}))
