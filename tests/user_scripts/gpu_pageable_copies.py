"""A GPU training whose time is its matmuls, fed from host tensors with a plain `.to('cuda')` each
step and no host read of the loss: the host runs ahead, and every pageable copy waits for the
queued kernels. Timed on the host, that wait looks like copying; the GPU is busy computing."""

import torch
from torch import nn

torch.manual_seed(0)
x, y = torch.randn(8192, 4096), torch.randn(8192, 4096)
model = nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, 4096)).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(60):
    index = torch.randint(0, 8192, (512,))
    inputs, targets = x[index].to("cuda"), y[index].to("cuda")
    loss = nn.functional.mse_loss(model(inputs), targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
