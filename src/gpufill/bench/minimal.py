"""The careful hand-written fp32 loop: the floor the data path alone can reach.

What a user who knows the tricks writes in a dozen lines: tensors resident on the device,
batches gathered by index from a fresh permutation, the fused optimizer kernel, no
per-step sync, and validation as one batched inference pass. No mixed precision, no
compile, no tuning. Its speed over the baseline is the most that removing the data-path
and sync overheads can give at the same batch; gpufill's speed over it is what the rest
of the plan (precision, compile, batch search) adds on top (nothing, on a CPU).
"""

from __future__ import annotations

import time

import torch
from torch import nn

from gpufill.engine.hardware import fused_optimizer_devices
from gpufill.engine.backend import synchronize


def minimal_fit(
    model: nn.Module,
    train: tuple[torch.Tensor, torch.Tensor],
    val: tuple[torch.Tensor, torch.Tensor],
    *,
    epochs: int,
    lr: float = 1e-3,
    batch_size: int = 128,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> list[float]:
    """Train `model` in place; returns each epoch's seconds (training + validation)."""
    device = torch.device(device)
    torch.manual_seed(seed)
    model.to(device)
    inputs, targets = train[0].to(device), train[1].to(device)
    val_inputs, val_targets = val[0].to(device), val[1].to(device)
    fused = {"fused": True} if device.type in fused_optimizer_devices() else {}
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, **fused)
    n = inputs.shape[0]
    seconds = []
    for _epoch in range(epochs):
        synchronize(device)
        tick = time.perf_counter()
        model.train()
        order = torch.randperm(n, device=device)
        for start in range(0, n, batch_size):
            index = order[start : start + batch_size]
            optimizer.zero_grad(set_to_none=True)
            nn.functional.mse_loss(model(inputs[index]), targets[index]).backward()
            optimizer.step()
        model.eval()
        with torch.inference_mode():
            _val_loss = nn.functional.mse_loss(model(val_inputs), val_targets)  # read by nobody: one pass, no sync
        synchronize(device)
        seconds.append(time.perf_counter() - tick)
    return seconds

