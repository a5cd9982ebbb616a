"""The careful hand-written loop: what a user who knows the tricks writes in a dozen lines.

Tensors resident on the device, batches gathered by index from a fresh permutation,
`zero_grad(set_to_none=True)`, the fused optimizer kernel, no per-step sync, and validation
as one batched inference pass. `tuned=True` adds what the guides tell that user to switch on
by hand, unmeasured: bf16 autocast where the device has fast bf16, TF32 matmuls on a GPU, and
torch.compile. gpufill has to beat both: the plain loop on every model, the tuned one where its
measurements decide better than the guides' rules.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch
from torch import nn

from gpufill.bench.guides import VALIDATION_CHUNK
from gpufill.engine import losses
from gpufill.engine.backend import synchronize
from gpufill.engine.batches import map_tensors, rows, sample_count, take
from gpufill.engine.config import DEFAULTS
from gpufill.engine.hardware import detect, fused_optimizer_devices


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
    tuned: bool = False,
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
    forward: Any = model
    low_precision: Any = contextlib.nullcontext
    saved_tf32 = torch.backends.cuda.matmul.allow_tf32
    if tuned:
        forward = torch.compile(model)
        if detect(str(device)).bf16_supported:
            low_precision = lambda: torch.autocast(device.type, dtype=torch.bfloat16)  # noqa: E731
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
    n, n_val = sample_count(train, "train"), sample_count(val, "val")
    seconds = []
    try:
        for _epoch in range(epochs):
            synchronize(device)
            tick = time.perf_counter()
            model.train()
            order = torch.randperm(n, device=device)
            for start in range(0, n, batch_size):
                optimizer.zero_grad(set_to_none=True)
                with low_precision():
                    value = loss_fn(forward, take(train, order[start : start + batch_size]))["loss"]
                value.backward()
                optimizer.step()
            model.eval()
            with torch.inference_mode(), low_precision():
                for start in range(0, n_val, VALIDATION_CHUNK):  # read by nobody: no sync
                    loss_fn(forward, rows(val, start, start + VALIDATION_CHUNK))
            synchronize(device)
            seconds.append(time.perf_counter() - tick)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved_tf32
    return seconds
