"""Trial steps that leave no trace: the model, optimizer, scaler and RNGs come back as they were.

Measurements (batch search, compile timing) run real optimizer steps on the real model,
so the kernels, memory and caches are the ones training will use; this restores
everything the training starts from afterwards.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn


@contextlib.contextmanager
def preserved_rng(device: torch.device) -> Iterator[None]:
    """The CPU (and the device's CUDA) random state, put back afterwards."""
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    try:
        yield
    finally:
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng, device)


@contextlib.contextmanager
def preserved(model: nn.Module, optimizer: torch.optim.Optimizer, precision: Any, device: torch.device) -> Iterator[None]:
    """Weights, optimizer state, loss scale and RNGs put back after trial steps."""
    weights = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    optimizer_state = copy.deepcopy(optimizer.state_dict())
    precision_state = copy.deepcopy(precision.state_dict())
    was_training = model.training
    try:
        with preserved_rng(device):
            yield
    finally:
        model.load_state_dict(weights)
        optimizer.load_state_dict(optimizer_state)
        optimizer.zero_grad(set_to_none=True)
        precision.load_state_dict(precision_state)
        model.train(was_training)
