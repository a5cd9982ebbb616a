"""Neural forecasters: ``(batch, lookback, n_features)`` -> ``(batch, horizon)``.

Feature 0 is the (scaled) target, the others are covariates. Every family takes
``(n_features, lookback, horizon, *, <family params>, last_value_norm=True)`` and is
named ``lstm``, ``gru``, ``tcn``, ``transformer``, ``mlp`` in ``builtin.py``.

Modules are plain ``nn.Linear`` / ``nn.LSTM`` / ``nn.GRU`` / ``nn.Conv1d`` / ``nn.LayerNorm``
with PyTorch's default initialisation, created in forward order: the fused versions
(``fused.py``) rebuild K copies and must draw the same initial weights from the same seed.
Every family's output layer is called ``head``.
"""

from __future__ import annotations

import math
import numbers
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from gpufill.errors import InputError
from gpufill.forecasting.models.checks import whole_number, window_dims

__all__ = [
    "Forecaster",
    "GRUForecaster",
    "LSTMForecaster",
    "MLPForecaster",
    "TCNForecaster",
    "TransformerForecaster",
    "sinusoidal_positions",
    "tcn_auto_levels",
    "tcn_receptive_field",
]


# --- parameter checks ------------------------------------------------------------------------


def _dropout(family: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= value < 1.0:
        raise InputError(f"dropout must be a number in [0, 1), got {value!r}",
                         fix="set dropout to e.g. 0.0 or 0.1", field=f"{family}.dropout")
    return float(value)


# --- shared base: shape checks and last-value normalisation ----------------------------------


class Forecaster(nn.Module):
    """Base of every family: checks shapes and applies last-value normalisation.

    With ``last_value_norm`` (NLinear, Zeng et al. 2023) the last observed target value
    ``x[:, -1, 0]`` is subtracted from the target channel of the window and added back to
    every output step, so a head that outputs zero is exactly the naive forecast: training
    starts from the naive baseline, which keeps small models sane on short trainings.
    Subclasses implement :meth:`_forward` on the normalised window.
    """

    family: ClassVar[str] = "model"

    def __init__(self, n_features: int, lookback: int, horizon: int, *, last_value_norm: bool):
        super().__init__()
        self.n_features, self.lookback, self.horizon, self.last_value_norm = window_dims(
            self.family, n_features, lookback, horizon, last_value_norm, norm_meaning="start from the naive forecast"
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3 or x.shape[-1] != self.n_features:
            raise InputError(f"{self.family} expects input (batch, lookback, {self.n_features}), got {tuple(x.shape)}",
                             fix="pass windows shaped (batch, lookback, n_features) with the n_features the model was built for", field="input")
        if not self.last_value_norm:
            return self._forward(x)
        last = x[:, -1:, :1]  # (batch, 1, 1): last observed target value
        x = torch.cat((x[..., :1] - last, x[..., 1:]), dim=-1)
        return self._forward(x) + last[:, 0]  # (batch, 1) broadcasts over the horizon

    def _forward(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError


# --- recurrent: LSTM, GRU --------------------------------------------------------------------


class _Recurrent(Forecaster):
    """nn.LSTM / nn.GRU over the window; the last step's output feeds the head."""

    rnn_type: ClassVar[type[nn.RNNBase]]

    def __init__(
        self,
        n_features: int,
        lookback: int,
        horizon: int,
        *,
        hidden_size: int = 64,
        num_layers: int = 1,
        dropout: float = 0.0,
        last_value_norm: bool = True,
    ):
        super().__init__(n_features, lookback, horizon, last_value_norm=last_value_norm)
        self.hidden_size = whole_number(self.family, "hidden_size", hidden_size)
        self.num_layers = whole_number(self.family, "num_layers", num_layers)
        self.dropout_p = _dropout(self.family, dropout)
        # nn.LSTM/GRU apply dropout between layers only (and warn when there is one layer);
        # the same rate also drops the last output before the head, so it acts with one layer too.
        self.rnn = self.rnn_type(
            n_features,
            self.hidden_size,
            self.num_layers,
            batch_first=True,
            dropout=self.dropout_p if self.num_layers > 1 else 0.0,
        )
        self.dropout = nn.Dropout(self.dropout_p)
        self.head = nn.Linear(self.hidden_size, self.horizon)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(self.dropout(out[:, -1]))


class LSTMForecaster(_Recurrent):
    family = "lstm"
    rnn_type = nn.LSTM


class GRUForecaster(_Recurrent):
    family = "gru"
    rnn_type = nn.GRU


# --- TCN -------------------------------------------------------------------------------------


def tcn_receptive_field(kernel_size: int, num_levels: int) -> int:
    """Time steps one output sees: two convolutions per level, dilation 2**level."""
    return 1 + 2 * (kernel_size - 1) * (2**num_levels - 1)


def tcn_auto_levels(lookback: int, kernel_size: int) -> int:
    """Fewest levels (at least one) whose receptive field covers the lookback."""
    levels = 1
    while tcn_receptive_field(kernel_size, levels) < lookback:
        levels += 1
    return levels


class TemporalBlock(nn.Module):
    """Two dilated causal convolutions (left padding only) with a residual connection."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int, dropout: float):
        super().__init__()
        self.left_pad = (kernel_size - 1) * dilation  # causal: output t sees inputs <= t only
        self.conv1 = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation)
        self.conv2 = nn.Conv1d(out_channels, out_channels, kernel_size, dilation=dilation)
        self.dropout = nn.Dropout(dropout)
        # 1x1 convolution so the residual matches the block's channel count
        self.downsample = nn.Conv1d(in_channels, out_channels, 1) if in_channels != out_channels else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (batch, channels, time)
        y = self.dropout(F.relu(self.conv1(F.pad(x, (self.left_pad, 0)))))
        y = self.dropout(F.relu(self.conv2(F.pad(y, (self.left_pad, 0)))))
        residual = x if self.downsample is None else self.downsample(x)
        return F.relu(y + residual)


class TCNForecaster(Forecaster):
    """Temporal convolutional network (Bai et al. 2018); the last step feeds the head."""

    family = "tcn"

    def __init__(
        self,
        n_features: int,
        lookback: int,
        horizon: int,
        *,
        channels: int = 64,
        kernel_size: int = 3,
        num_levels: int | None = None,
        dropout: float = 0.0,
        last_value_norm: bool = True,
    ):
        super().__init__(n_features, lookback, horizon, last_value_norm=last_value_norm)
        self.channels = whole_number(self.family, "channels", channels)
        # a kernel of 1 sees no history, and no number of levels would cover the lookback
        self.kernel_size = whole_number(self.family, "kernel_size", kernel_size, minimum=2)
        if num_levels is None:
            self.num_levels = tcn_auto_levels(self.lookback, self.kernel_size)
        else:
            self.num_levels = whole_number(self.family, "num_levels", num_levels)
        self.receptive_field = tcn_receptive_field(self.kernel_size, self.num_levels)
        self.dropout_p = _dropout(self.family, dropout)
        self.blocks = nn.ModuleList(
            TemporalBlock(n_features if i == 0 else self.channels, self.channels, self.kernel_size, 2**i, self.dropout_p)
            for i in range(self.num_levels)
        )
        self.head = nn.Linear(self.channels, self.horizon)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.transpose(1, 2)  # Conv1d wants (batch, channels, time)
        for block in self.blocks:
            h = block(h)
        return self.head(h[:, :, -1])


# --- Transformer -----------------------------------------------------------------------------


def sinusoidal_positions(length: int, d_model: int, *, device: torch.device | None = None) -> torch.Tensor:
    """Fixed sinusoidal position encoding (Vaswani et al. 2017), ``(length, d_model)`` float32."""
    position = torch.arange(length, dtype=torch.float32, device=device).unsqueeze(1)
    inv_freq = torch.exp(
        torch.arange(0, d_model, 2, dtype=torch.float32, device=device) * (-math.log(10000.0) / d_model)
    )
    angles = position * inv_freq  # (length, ceil(d_model / 2))
    pe = torch.zeros(length, d_model, device=device)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])  # odd d_model: one fewer cosine column
    return pe


class EncoderBlock(nn.Module):
    """Pre-LayerNorm encoder block: fused qkv, scaled_dot_product_attention, GELU feed-forward."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int, dropout: float):
        super().__init__()
        self.nhead = nhead
        self.dropout_p = dropout
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.ff1 = nn.Linear(d_model, dim_feedforward)
        self.ff2 = nn.Linear(dim_feedforward, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (batch, time, d_model)
        batch, time, d_model = x.shape
        qkv = self.qkv(self.norm1(x)).view(batch, time, 3, self.nhead, d_model // self.nhead)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (batch, nhead, time, head_dim)
        # looked up on the module at call time so Flash / memory-efficient kernels are used on GPU
        attn = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout_p if self.training else 0.0)
        x = x + self.dropout(self.proj(attn.transpose(1, 2).reshape(batch, time, d_model)))
        return x + self.dropout(self.ff2(self.dropout(F.gelu(self.ff1(self.norm2(x))))))


class TransformerForecaster(Forecaster):
    """Encoder-only transformer; the last token feeds the head."""

    family = "transformer"

    def __init__(
        self,
        n_features: int,
        lookback: int,
        horizon: int,
        *,
        d_model: int = 64,
        nhead: int = 4,
        num_layers: int = 2,
        dim_feedforward: int | None = None,
        dropout: float = 0.0,
        last_value_norm: bool = True,
    ):
        super().__init__(n_features, lookback, horizon, last_value_norm=last_value_norm)
        self.d_model = whole_number(self.family, "d_model", d_model)
        self.nhead = whole_number(self.family, "nhead", nhead)
        if self.d_model % self.nhead:
            raise InputError(f"d_model ({self.d_model}) must be divisible by nhead ({self.nhead})",
                             fix="choose d_model a multiple of nhead, e.g. d_model 64 with nhead 4", field=f"{self.family}.d_model")
        self.num_layers = whole_number(self.family, "num_layers", num_layers)
        # None: the usual 4 x d_model of Vaswani et al.
        self.dim_feedforward = 4 * self.d_model if dim_feedforward is None else whole_number(
            self.family, "dim_feedforward", dim_feedforward
        )
        self.dropout_p = _dropout(self.family, dropout)
        self.input_proj = nn.Linear(n_features, self.d_model)
        # not in the state_dict: fixed, and recomputed for a window of another length
        self.register_buffer("positions", sinusoidal_positions(self.lookback, self.d_model), persistent=False)
        self.layers = nn.ModuleList(
            EncoderBlock(self.d_model, self.nhead, self.dim_feedforward, self.dropout_p) for _ in range(self.num_layers)
        )
        self.norm = nn.LayerNorm(self.d_model)
        self.head = nn.Linear(self.d_model, self.horizon)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        time = x.shape[1]
        positions = self.positions
        if time != positions.shape[0]:
            positions = sinusoidal_positions(time, self.d_model, device=x.device)
        h = self.input_proj(x)
        h = h + positions.to(h.dtype)
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h[:, -1]))


# --- MLP -------------------------------------------------------------------------------------


class MLPForecaster(Forecaster):
    """The flattened window through ``num_layers`` x [Linear, ReLU, dropout], then the head."""

    family = "mlp"

    def __init__(
        self,
        n_features: int,
        lookback: int,
        horizon: int,
        *,
        hidden_size: int = 128,
        num_layers: int = 2,
        dropout: float = 0.0,
        last_value_norm: bool = True,
    ):
        super().__init__(n_features, lookback, horizon, last_value_norm=last_value_norm)
        self.hidden_size = whole_number(self.family, "hidden_size", hidden_size)
        self.num_layers = whole_number(self.family, "num_layers", num_layers)
        self.dropout_p = _dropout(self.family, dropout)
        self.layers = nn.ModuleList(
            nn.Linear(self.lookback * n_features if i == 0 else self.hidden_size, self.hidden_size)
            for i in range(self.num_layers)
        )
        self.dropout = nn.Dropout(self.dropout_p)
        self.head = nn.Linear(self.hidden_size, self.horizon)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] != self.lookback:
            raise InputError(f"mlp was built for lookback {self.lookback}, got a window of {x.shape[1]}",
                             fix="build the mlp with the lookback of the windows it is given", field="input")
        h = x.flatten(1)
        for layer in self.layers:
            h = self.dropout(F.relu(layer(h)))
        return self.head(h)
