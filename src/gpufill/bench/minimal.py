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
from typing import Any

import torch
from torch import nn

from gpufill.bench.guides import VALIDATION_CHUNK
from gpufill.engine import losses
from gpufill.engine.backend import synchronize
from gpufill.engine.batches import map_tensors, rows, sample_count, take
from gpufill.engine.config import DEFAULTS
from gpufill.engine.hardware import fused_optimizer_devices


def minimal_fit(
    model: nn.Module,
    train: Any,
    val: Any,
    *,
    epochs: int,
    loss: Any = "mse",
    lr: float = DEFAULTS.lr,
    batch_size: int = 128,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> list[float]:
    """Train `model` in place on tensors of any structure; returns each epoch's seconds (training + validation)."""
    device = torch.device(device)
    loss_fn, _ = losses.resolve(loss)
    torch.manual_seed(seed)
    model.to(device)
    train = map_tensors(lambda leaf: leaf.to(device), train)
    val = map_tensors(lambda leaf: leaf.to(device), val)
    fused = {"fused": True} if device.type in fused_optimizer_devices() else {}
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, **fused)
    n, n_val = sample_count(train, "train"), sample_count(val, "val")
    seconds = []
    for _epoch in range(epochs):
        synchronize(device)
        tick = time.perf_counter()
        model.train()
        order = torch.randperm(n, device=device)
        for start in range(0, n, batch_size):
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model, take(train, order[start : start + batch_size]))["loss"].backward()
            optimizer.step()
        model.eval()
        with torch.inference_mode():
            for start in range(0, n_val, VALIDATION_CHUNK):  # read by nobody: no sync
                loss_fn(model, rows(val, start, start + VALIDATION_CHUNK))
        synchronize(device)
        seconds.append(time.perf_counter() - tick)
    return seconds
