"""A user's own model factories, resolved by tests/forecasting/test_registry.py as 'custom_model_fixture:NAME'."""

from __future__ import annotations

import torch
from torch import nn


class TinyLinear(nn.Module):
    """The flattened window through one linear layer, times ``scale``."""

    def __init__(self, n_features: int, lookback: int, horizon: int, *, scale: float = 1.0):
        super().__init__()
        self.scale = scale
        self.linear = nn.Linear(n_features * lookback, horizon)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * self.linear(x.flatten(1))


def make_tiny(n_features: int, lookback: int, horizon: int, *, scale: float = 1.0, bias: bool = True):
    model = TinyLinear(n_features, lookback, horizon, scale=scale)
    if not bias:
        model.linear.bias.requires_grad_(False).zero_()
    return model


class MeanForecaster:
    """A CPU-lane model: predicts the window mean of the target."""

    gpufill_kind = "classical"

    def __init__(self, n_features: int, lookback: int, horizon: int, *, alpha: float = 0.5):
        self.horizon = horizon
        self.alpha = alpha


class Factories:
    @staticmethod
    def make(n_features: int, lookback: int, horizon: int, *, depth: int = 2):
        return {"n_features": n_features, "lookback": lookback, "horizon": horizon, "depth": depth}


def make_any(n_features, lookback, horizon, **params):
    return {"n_features": n_features, "lookback": lookback, "horizon": horizon, **params}


NOT_CALLABLE = 42


def needs_default(n_features, lookback, horizon, *, width):
    return width


def no_lookback(n_features, horizon, *, width=4):
    return width


def odd_kind(n_features, lookback, horizon):
    return None


odd_kind.gpufill_kind = "quantum"


def make_not_a_module(n_features: int, lookback: int, horizon: int):
    """A factory that forgot to return its model (neural by default): gpufill train must say so in one line."""
    return {"n_features": n_features}


class ReadsItem(nn.Module):
    """A forward that branches on a tensor's value (`.item()`): vmap cannot run it, so it trains unfused."""

    def __init__(self, n_features: int, lookback: int, horizon: int):
        super().__init__()
        self.linear = nn.Linear(n_features * lookback, horizon)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.linear(x.flatten(1))
        return out * 0.5 if x.mean().item() > 1e6 else out


def make_reads_item(n_features: int, lookback: int, horizon: int):
    return ReadsItem(n_features, lookback, horizon)
