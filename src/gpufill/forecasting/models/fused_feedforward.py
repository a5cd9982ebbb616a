"""Fused packs of the feed-forward families: TCN, Transformer, MLP.

Each fused module mirrors its plain model's module tree, so its state dict has exactly
the plain names (``blocks.0.conv1.weight``, ``layers.1.qkv.weight``, ``head.bias``) with a
leading model dimension K; `FusedModule.from_models` and `unfuse` work on them unchanged.

The K models run as one set of kernels, never as a Python loop over K:

- linears and LayerNorms are per-model batched matmuls / affine maps (`fused.linear`,
  `fused.layer_norm`);
- TCN convolutions are grouped convolutions: the K models' channels sit side by side,
  ``(batch, K * channels, time)``, and ``groups=K`` keeps each model on its own channels;
- attention runs over a merged ``K * batch`` batch: it has no weights, so the models only
  share the kernel launch.

Dropout draws its own masks, so with dropout > 0 a fused model matches its plain
twin in distribution, not mask for mask.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from gpufill.errors import InputError
from gpufill.engine.packs import fused
from gpufill.engine.packs.fused import fuses
from gpufill.forecasting.models.fused import FusedForecaster
from gpufill.forecasting.models.neural import (
    EncoderBlock,
    MLPForecaster,
    TCNForecaster,
    TemporalBlock,
    TransformerForecaster,
    sinusoidal_positions,
)

__all__ = ["FusedMLP", "FusedTCN", "FusedTransformer"]

Stacked = Callable[..., nn.Parameter]


def _params(stacked: Stacked, **shapes: tuple[int, ...]) -> nn.Module:
    """A container holding stacked (K, *shape) parameters under the given names (weight, bias)."""
    module = nn.Module()
    for name, shape in shapes.items():
        setattr(module, name, stacked(*shape))
    return module


def _linear(stacked: Stacked, layer: nn.Linear) -> nn.Module:
    return _params(stacked, weight=(layer.out_features, layer.in_features), bias=(layer.out_features,))


def _layer_norm(stacked: Stacked, norm: nn.LayerNorm) -> nn.Module:
    return _params(stacked, weight=tuple(norm.normalized_shape), bias=tuple(norm.normalized_shape))


def _conv(stacked: Stacked, conv: nn.Conv1d) -> nn.Module:
    return _params(stacked, weight=tuple(conv.weight.shape), bias=(conv.out_channels,))


# --- MLP -------------------------------------------------------------------------------------


@fuses(MLPForecaster)
class FusedMLP(FusedForecaster):
    """K `MLPForecaster`s: the flattened windows through per-model linears."""

    def __init__(self, template: MLPForecaster, k: int):
        super().__init__(template, k)
        self.dropout_p = template.dropout_p
        self.layers = nn.ModuleList(_linear(self.stacked, layer) for layer in template.layers)
        self.head = _linear(self.stacked, template.head)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        k, batch, time, features = x.shape
        if time != self.lookback:
            raise InputError(f"mlp was built for lookback {self.lookback}, got a window of {time}",
                             fix="build the mlp with the lookback of the windows it is given", field="input")
        h = x.reshape(k, batch, time * features)  # per model, as the plain flatten(1)
        for layer in self.layers:
            h = F.dropout(F.relu(fused.linear(h, layer.weight, layer.bias)), self.dropout_p, self.training)
        return fused.linear(h, self.head.weight, self.head.bias)


# --- TCN -------------------------------------------------------------------------------------


class _FusedTemporalBlock(nn.Module):
    """K `TemporalBlock`s as grouped convolutions over (batch, K * channels, time)."""

    def __init__(self, stacked: Stacked, block: TemporalBlock, k: int):
        super().__init__()
        self.k = k
        self.left_pad = block.left_pad
        self.dilation = block.conv1.dilation[0]
        self.dropout_p = block.dropout.p
        self.conv1 = _conv(stacked, block.conv1)
        self.conv2 = _conv(stacked, block.conv2)
        self.downsample = None if block.downsample is None else _conv(stacked, block.downsample)

    def _conv(self, x: torch.Tensor, conv: nn.Module, dilation: int) -> torch.Tensor:
        weight = conv.weight  # (K, out, in, width) -> (K * out, in, width): group k is model k
        return F.conv1d(
            x, weight.reshape(-1, *weight.shape[2:]), conv.bias.reshape(-1), dilation=dilation, groups=self.k
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (batch, K * channels, time)
        pad = (self.left_pad, 0)  # causal: output t sees inputs <= t only
        y = F.dropout(F.relu(self._conv(F.pad(x, pad), self.conv1, self.dilation)), self.dropout_p, self.training)
        y = F.dropout(F.relu(self._conv(F.pad(y, pad), self.conv2, self.dilation)), self.dropout_p, self.training)
        residual = x if self.downsample is None else self._conv(x, self.downsample, 1)
        return F.relu(y + residual)


@fuses(TCNForecaster)
class FusedTCN(FusedForecaster):
    """K `TCNForecaster`s: grouped dilated causal convolutions, per-model head."""

    def __init__(self, template: TCNForecaster, k: int):
        super().__init__(template, k)
        self.channels = template.channels
        self.blocks = nn.ModuleList(_FusedTemporalBlock(self.stacked, block, k) for block in template.blocks)
        self.head = _linear(self.stacked, template.head)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        k, batch, time, features = x.shape
        h = x.permute(1, 0, 3, 2).reshape(batch, k * features, time)  # model k: channels k*F .. (k+1)*F - 1
        for block in self.blocks:
            h = block(h)
        last = h[:, :, -1].reshape(batch, k, self.channels).transpose(0, 1)  # (K, batch, channels)
        return fused.linear(last, self.head.weight, self.head.bias)


# --- Transformer -----------------------------------------------------------------------------


class _FusedEncoderBlock(nn.Module):
    """K pre-LayerNorm `EncoderBlock`s; attention over a merged (K * batch) batch."""

    def __init__(self, stacked: Stacked, block: EncoderBlock):
        super().__init__()
        self.nhead = block.nhead
        self.dropout_p = block.dropout_p
        self.eps1 = block.norm1.eps
        self.eps2 = block.norm2.eps
        self.norm1 = _layer_norm(stacked, block.norm1)
        self.qkv = _linear(stacked, block.qkv)
        self.proj = _linear(stacked, block.proj)
        self.norm2 = _layer_norm(stacked, block.norm2)
        self.ff1 = _linear(stacked, block.ff1)
        self.ff2 = _linear(stacked, block.ff2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (K, batch, time, d_model)
        k, batch, time, d_model = x.shape
        p, training = self.dropout_p, self.training
        normed = fused.layer_norm(x, self.norm1.weight, self.norm1.bias, self.eps1)
        qkv = fused.linear(normed, self.qkv.weight, self.qkv.bias)
        qkv = qkv.reshape(k * batch, time, 3, self.nhead, d_model // self.nhead)
        q, key, value = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (K * batch, nhead, time, head_dim)
        # not causal, default scale: as the plain block
        attn = F.scaled_dot_product_attention(q, key, value, dropout_p=p if training else 0.0)
        attn = attn.transpose(1, 2).reshape(k, batch, time, d_model)
        x = x + F.dropout(fused.linear(attn, self.proj.weight, self.proj.bias), p, training)
        normed = fused.layer_norm(x, self.norm2.weight, self.norm2.bias, self.eps2)
        ff = F.dropout(F.gelu(fused.linear(normed, self.ff1.weight, self.ff1.bias)), p, training)
        return x + F.dropout(fused.linear(ff, self.ff2.weight, self.ff2.bias), p, training)


@fuses(TransformerForecaster)
class FusedTransformer(FusedForecaster):
    """K `TransformerForecaster`s: per-model projections and norms, shared attention kernel."""

    def __init__(self, template: TransformerForecaster, k: int):
        super().__init__(template, k)
        self.d_model = template.d_model
        self.input_proj = _linear(self.stacked, template.input_proj)
        # fixed, the same for every model: not in the state dict, as in the plain model
        self.register_buffer("positions", sinusoidal_positions(self.lookback, self.d_model), persistent=False)
        self.layers = nn.ModuleList(_FusedEncoderBlock(self.stacked, layer) for layer in template.layers)
        self.norm = _layer_norm(self.stacked, template.norm)
        self.norm_eps = template.norm.eps
        self.head = _linear(self.stacked, template.head)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        time = x.shape[2]
        positions = self.positions
        if time != positions.shape[0]:
            positions = sinusoidal_positions(time, self.d_model, device=x.device)
        h = fused.linear(x, self.input_proj.weight, self.input_proj.bias)
        h = h + positions.to(h.dtype)
        for layer in self.layers:
            h = layer(h)
        last = fused.layer_norm(h[:, :, -1], self.norm.weight, self.norm.bias, self.norm_eps)
        return fused.linear(last, self.head.weight, self.head.bias)
