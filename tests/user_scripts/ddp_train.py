"""A DDP training as the guides write it, launched with torchrun --nproc_per_node 2 (gloo on a CPU)."""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

dist.init_process_group("gloo")
torch.manual_seed(0)
data = TensorDataset(torch.randn(2048, 16), torch.randn(2048, 1))
sampler = DistributedSampler(data)
loader = DataLoader(data, batch_size=32, sampler=sampler, num_workers=0)
model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
try:
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
finally:
    dist.destroy_process_group()
