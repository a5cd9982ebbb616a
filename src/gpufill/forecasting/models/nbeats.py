"""N-BEATS (Oreshkin et al., ICLR 2020): a stack of fully connected blocks with backward and forward residual links.

Each block reads what the blocks before it left of the window (the residual), passes it through `layers` fully
connected ReLU layers of width `width`, and emits coefficients of two bases: a backcast of the window, which is
subtracted from the residual the next block reads, and a forecast of the horizon; the model's forecast is the sum of
every block's. `stacks: generic` learns both bases (linear layers: N-BEATS-G); `stacks: interpretable` uses a
polynomial trend stack (degree `trend_degree`) then a Fourier seasonality stack (`harmonics` harmonics of the
window, N-BEATS-I), so each block's part of the forecast is a trend or a season one can plot; `stacks: mixed` is
neuralforecast's default NBEATS: generic blocks, then trend, then seasonality (a third of the blocks each).

The target channel is the residual; covariates (features 1..) are read by every block beside it, never backcast.
Plain `nn.Linear` layers only: packs of N-BEATS trainings run through torch.func (engine/packs/stacked.py).
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal, get_args

import torch
import torch.nn.functional as F
from torch import nn

from gpufill.errors import InputError
from gpufill.forecasting.models.checks import whole_number
from gpufill.forecasting.models.neural import Forecaster

__all__ = ["NBeatsBlock", "NBeatsForecaster", "fourier_basis", "trend_basis"]

Stacks = Literal["generic", "interpretable", "mixed"]
FEWEST_BLOCKS: dict[str, int] = dict(zip(get_args(Stacks), (1, 2, 3), strict=True))
"""Each stack layout and the fewest blocks it holds (interpretable: a trend and a season; mixed: one of each kind)."""


def trend_basis(degree: int, lookback: int, horizon: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Polynomials t^0..t^degree over the window (t in [-1, 0)) and the horizon (t in [0, 1)): (degree+1, length) each."""
    back = torch.arange(-lookback, 0, dtype=torch.float32) / lookback
    fore = torch.arange(0, horizon, dtype=torch.float32) / horizon
    powers = torch.arange(degree + 1, dtype=torch.float32)[:, None]
    return back[None, :] ** powers, fore[None, :] ** powers


def fourier_basis(harmonics: int, lookback: int, horizon: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A constant, then cos and sin of 1..harmonics cycles per window length, on one time axis: (1 + 2*harmonics, length) each."""
    t = torch.arange(-lookback, horizon, dtype=torch.float32) / lookback
    rows = [torch.ones_like(t)]
    for k in range(1, harmonics + 1):
        rows += [torch.cos(2 * math.pi * k * t), torch.sin(2 * math.pi * k * t)]
    basis = torch.stack(rows)
    return basis[:, :lookback], basis[:, lookback:]


class NBeatsBlock(nn.Module):
    """`layers` x [Linear, ReLU] on (residual, covariates), then the coefficients of a backcast and a forecast."""

    def __init__(self, inputs: int, width: int, layers: int, lookback: int, horizon: int, basis: tuple[torch.Tensor, torch.Tensor] | None):
        super().__init__()
        self.fc = nn.ModuleList(nn.Linear(inputs if i == 0 else width, width) for i in range(layers))
        if basis is None:  # generic: the bases are learned
            self.backcast, self.forecast = nn.Linear(width, lookback), nn.Linear(width, horizon)
            self.register_buffer("back_basis", None)
            self.register_buffer("fore_basis", None)
        else:  # fixed bases: the block learns their coefficients
            self.backcast, self.forecast = nn.Linear(width, basis[0].shape[0], bias=False), nn.Linear(width, basis[1].shape[0], bias=False)
            self.register_buffer("back_basis", basis[0].clone())
            self.register_buffer("fore_basis", basis[1].clone())

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for layer in self.fc:
            h = F.relu(layer(h))
        back, fore = self.backcast(h), self.forecast(h)
        if self.back_basis is not None:
            back, fore = back @ self.back_basis, fore @ self.fore_basis
        return back, fore


class NBeatsForecaster(Forecaster):
    """N-BEATS: `blocks` blocks of `layers` fully connected layers of `width`, doubly residual (module docstring)."""

    family: ClassVar[str] = "nbeats"

    def __init__(
        self,
        n_features: int,
        lookback: int,
        horizon: int,
        *,
        stacks: Stacks = "generic",
        blocks: int = 3,
        layers: int = 4,
        width: int = 256,
        trend_degree: int = 3,
        harmonics: int | None = None,
        last_value_norm: bool = False,
    ):
        super().__init__(n_features, lookback, horizon, last_value_norm=last_value_norm)
        if stacks not in FEWEST_BLOCKS:
            raise InputError(f"stacks must be one of {', '.join(FEWEST_BLOCKS)}, got {stacks!r}", field="nbeats.stacks",
                             fix="set stacks to generic (learned bases), interpretable (trend, then seasonality) or mixed "
                                 "(generic, trend, seasonality)")
        self.stacks = stacks
        # trend and season blocks forecast through bases over the horizon's time points: the model's outputs are
        # those steps, not any other layout of values (a quantile loss's; forecasting/run.py: build_model)
        self.horizon_basis = stacks != "generic"
        self.blocks = whole_number(self.family, "blocks", blocks, minimum=FEWEST_BLOCKS[stacks])
        self.layers = whole_number(self.family, "layers", layers)
        self.width = whole_number(self.family, "width", width)
        self.trend_degree = whole_number(self.family, "trend_degree", trend_degree, minimum=0)
        self.harmonics = whole_number(self.family, "harmonics", harmonics) if harmonics is not None else max(1, lookback // 2 - 1)
        inputs = lookback * n_features
        bases: list[tuple[torch.Tensor, torch.Tensor] | None]
        if stacks == "generic":
            bases = [None] * self.blocks
        else:
            trend, season = trend_basis(self.trend_degree, lookback, horizon), fourier_basis(self.harmonics, lookback, horizon)
            if stacks == "interpretable":  # the first half of the blocks model the trend, the rest the season (the paper's two stacks)
                bases = [trend if i < self.blocks // 2 else season for i in range(self.blocks)]
            else:  # mixed: a third each of generic, trend and season blocks, in that order (neuralforecast's stack_types)
                bases = [(None, trend, season)[i * 3 // self.blocks] for i in range(self.blocks)]
        self.stack = nn.ModuleList(NBeatsBlock(inputs, self.width, self.layers, lookback, horizon, basis) for basis in bases)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] != self.lookback:
            raise InputError(f"nbeats was built for lookback {self.lookback}, got a window of {x.shape[1]}",
                             fix="build the model with the lookback of the windows it is given", field="input")
        residual, covariates = x[..., 0], x[..., 1:].flatten(1)
        forecast = x.new_zeros(x.shape[0], self.horizon)
        for block in self.stack:
            back, fore = block(torch.cat((residual, covariates), dim=1))
            residual = residual - back
            forecast = forecast + fore
        return forecast
