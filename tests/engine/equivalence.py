"""The reference for the equivalence tests: a hand-written training loop that draws the same
batches fit does (shared by test_equivalence.py and the torchrun script ddp_fit_script.py).

fit's batch order for resident tensors: one `torch.randperm(n, generator=Generator(device).manual_seed(seed))`
per epoch (one generator for the whole training), consecutive slices of `batch_size`.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from tests.engine.common import regression

N = 90
"""Batches of 32: 32, 32 and a short last batch of 26."""
SETTINGS = dict(epochs=3, batch_size=32, lr=0.05, optimizer_kernel="for-loop", precision="fp32", seed=3)


def data(n: int = N) -> dict[str, torch.Tensor]:
    x, y = regression(n=n, seed=5)
    return {"x": x, "y": torch.cat([y, -y], dim=1)}  # two targets per sample


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))


def dict_loss(model, batch):
    """A callable loss on dict batches, with a metric: a mean over the batch."""
    error = model(batch["x"]) - batch["y"]
    return {"loss": error.pow(2).mean(), "mae": error.abs().mean()}


def hand_loop(model: nn.Module, batches: dict[str, torch.Tensor], *, epochs: int, batch_size: int, lr: float, seed: int,
              optimizer: str = "sgd", grad_clip: float | None = None, device: str = "cpu", **_ignored) -> list[float]:
    """Plain PyTorch: whole batches, one backward and one step each; returns each epoch's sample-weighted mean loss."""
    if optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, foreach=False)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=lr, foreach=False)
    generator = torch.Generator(device).manual_seed(seed)
    n = len(batches["x"])
    means = []
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator, device=device)
        total = 0.0
        for start in range(0, n, batch_size):
            index = order[start : start + batch_size]
            loss = dict_loss(model, {name: value[index] for name, value in batches.items()})["loss"]
            loss.backward()
            if grad_clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            opt.step()
            opt.zero_grad()
            total += loss.item() * len(index)
        means.append(total / n)
    return means


def mse(model, batch):
    return F.mse_loss(model(batch["x"]), batch["y"])
