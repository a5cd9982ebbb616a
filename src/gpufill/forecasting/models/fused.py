"""Fused forecasters' shared base: shape checks and last-value normalisation, per model.

The family kernels (`fused_recurrent.py`: LSTM, GRU as batched-matmul recurrences, since
torch.func.vmap has no batching rule for nn.LSTM/nn.GRU; `fused_feedforward.py`: TCN,
Transformer, MLP) subclass it and register with the engine's `fuses`.
"""

from __future__ import annotations

import torch
from torch import nn

from gpufill.engine.packs.fused import FusedModule
from gpufill.errors import InputError
from gpufill.forecasting.models.neural import Forecaster


class FusedForecaster(FusedModule):
    """Fused counterpart of `Forecaster`: shape checks and last-value normalisation, per model."""

    def __init__(self, template: nn.Module, k: int):
        super().__init__(template, k)
        assert isinstance(template, Forecaster)
        self.n_features = template.n_features
        self.lookback = template.lookback
        self.horizon = template.horizon
        self.last_value_norm = template.last_value_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(K, batch, lookback, features) -> (K, batch, horizon)."""
        if x.dim() != 4 or x.shape[0] != self.k or x.shape[-1] != self.n_features:
            raise InputError(f"a pack of {self.k} expects input (K={self.k}, batch, lookback, {self.n_features}), got {tuple(x.shape)}",
                             fix="stack one batch per model on a leading dimension", field="input")
        if not self.last_value_norm:
            return self._forward(x)
        last = x[:, :, -1:, :1]  # (K, batch, 1, 1)
        x = torch.cat((x[..., :1] - last, x[..., 1:]), dim=-1)
        return self._forward(x) + last[:, :, 0]

    def _forward(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError
