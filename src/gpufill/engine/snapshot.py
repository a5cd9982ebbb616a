"""Trial steps that leave no trace: weights, buffers, train mode and random state put back.

Measurements (the probe's candidates, a graph capture's warm-up steps) run real optimizer
steps on the real model, so the kernels, memory and caches are the ones training will use;
these put back everything the training starts from, by copying into the same tensors, so a
CUDA graph that recorded their addresses stays valid.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

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
def preserved_weights(model: nn.Module, device: torch.device, extra: tuple[torch.Tensor, ...] = ()) -> Iterator[None]:
    """Parameters, buffers (and `extra` tensors), gradients, the train/eval mode and RNGs put back in place afterwards.

    Gradients too: a measurement cut off between a backward and its optimizer's zero_grad (past the probe's deadline, or
    a candidate that raised mid-step) leaves them on the parameters, and the training's first step, whose backward
    accumulates into them, would add a probe step's gradient to its own (a forecast trained again differed from the
    campaign's by 0.5 where the probe happened to stop there)."""
    live = [*model.state_dict().values(), *extra]
    saved = [tensor.detach().clone() for tensor in live]
    parameters = list(model.parameters())
    grads = [(p.grad, None if p.grad is None else p.grad.detach().clone()) for p in parameters]
    was_training = model.training
    try:
        with preserved_rng(device):
            yield
    finally:
        with torch.no_grad():
            for tensor, copy in zip(live, saved, strict=True):
                tensor.copy_(copy)
            for parameter, (grad, copy) in zip(parameters, grads, strict=True):
                if grad is not None:
                    grad.copy_(copy)  # into the same tensor, as the weights
                parameter.grad = grad
        model.train(was_training)
