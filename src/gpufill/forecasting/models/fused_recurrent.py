"""Fused LSTM and GRU packs: K recurrent forecasters as one batched-matmul recurrence.

Why by hand: torch.func.vmap has no batching rule for nn.LSTM / nn.GRU, and the cuDNN
kernels behind them run one model (one weight set) per call, so K models would be K
sequential launches of every step. Written as batched matmuls, one `baddbmm` per time
step advances all K models at once.

Per layer, the input projection of every time step is one batched matmul before the loop;
the recurrence itself (`engine/packs/recurrences.py`) is an autograd Function with a hand-written
backward: one `baddbmm` and a few element-wise ops per step each way. Gate order and math are PyTorch's, so fused model k computes what plain model k computes:

    LSTM  i, f, g, o = chunks;  c' = σ(f) c + σ(i) tanh(g);  h' = σ(o) tanh(c')
    GRU   r, z, n = chunks;  r = σ(x_r + h_r);  z = σ(x_z + h_z)
          n = tanh(x_n + r (W_hn h + b_hn));  h' = (1 - z) n + z h

Parameters carry the plain names (`rnn.weight_ih_l0`, ..., `head.weight`) with a leading
K dimension, so `FusedModule.from_models` / `unfuse` are plain stacking and slicing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gpufill.engine.packs.fused import fuses, linear
from gpufill.forecasting.models.fused import FusedForecaster
from gpufill.forecasting.models.neural import GRUForecaster, LSTMForecaster, _Recurrent
from gpufill.engine.packs.recurrences import gru_layer, lstm_layer, oifg

__all__ = ["FusedGRU", "FusedLSTM"]


class _FusedRecurrent(FusedForecaster):
    """Stacked `rnn.*_l{n}` and `head.*` parameters; subclasses write one layer's recurrence."""

    gates: int  # gate blocks per layer: 4 for LSTM, 3 for GRU

    def __init__(self, template: nn.Module, k: int):
        super().__init__(template, k)
        assert isinstance(template, _Recurrent)
        self.hidden_size = template.hidden_size
        self.num_layers = template.num_layers
        self.dropout_p = template.dropout_p
        width = self.gates * self.hidden_size
        # Same names, same order as nn.LSTM / nn.GRU's own parameters (values come from from_models).
        self.rnn = nn.Module()
        for layer in range(self.num_layers):
            inputs = self.n_features if layer == 0 else self.hidden_size
            self.rnn.register_parameter(f"weight_ih_l{layer}", self.stacked(width, inputs))
            self.rnn.register_parameter(f"weight_hh_l{layer}", self.stacked(width, self.hidden_size))
            self.rnn.register_parameter(f"bias_ih_l{layer}", self.stacked(width))
            self.rnn.register_parameter(f"bias_hh_l{layer}", self.stacked(width))
        self.head = nn.Module()
        self.head.weight = self.stacked(self.horizon, self.hidden_size)
        self.head.bias = self.stacked(self.horizon)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        # Time-major (K, T, B, F): each step's slice of the projected inputs is then one
        # contiguous (B, G*H) block per model, and the stacked outputs are contiguous too.
        h = x.transpose(1, 2)
        last = self.num_layers - 1
        for layer in range(self.num_layers):
            h = self._layer(h, layer, keep_sequence=layer < last)
            if layer < last:
                h = self._dropout(h)  # nn.LSTM / nn.GRU: on every layer's output but the last's
        # the plain model's head(dropout(out[:, -1]))
        return linear(self._dropout(h), self.head.weight, self.head.bias)

    def _dropout(self, h: torch.Tensor) -> torch.Tensor:
        # Masks are drawn for all K models at once, so they differ from the plain models' draws.
        if not self.training or self.dropout_p == 0.0:
            return h
        return F.dropout(h, self.dropout_p, training=True)

    def _layer(self, x: torch.Tensor, layer: int, *, keep_sequence: bool) -> torch.Tensor:
        """x (K, T, B, in) -> every step's h (K, T, B, H), or only the last one's (K, B, H)."""
        raise NotImplementedError  # pragma: no cover - abstract

    def _weights(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        rnn = self.rnn
        return (
            getattr(rnn, f"weight_ih_l{layer}"),
            getattr(rnn, f"weight_hh_l{layer}"),
            getattr(rnn, f"bias_ih_l{layer}"),
            getattr(rnn, f"bias_hh_l{layer}"),
        )


@fuses(LSTMForecaster)
class FusedLSTM(_FusedRecurrent):
    """K `LSTMForecaster`s of one shape as one module."""

    gates = 4

    def _layer(self, x: torch.Tensor, layer: int, *, keep_sequence: bool) -> torch.Tensor:
        w_ih, w_hh, b_ih, b_hh = self._weights(layer)
        hidden = self.hidden_size
        # Gate rows from PyTorch's (i, f, g, o) to the layer's (o, i, f, g), once per forward.
        # Both biases enter the gates additively: folded into the input projection of every
        # step, one batched matmul before the loop.
        w_ih, w_hh, bias = (oifg(t, hidden) for t in (w_ih, w_hh, b_ih + b_hh))
        hs = lstm_layer(linear(x, w_ih, bias), w_hh)
        return hs if keep_sequence else hs[:, -1]


@fuses(GRUForecaster)
class FusedGRU(_FusedRecurrent):
    """K `GRUForecaster`s of one shape as one module."""

    gates = 3

    def _layer(self, x: torch.Tensor, layer: int, *, keep_sequence: bool) -> torch.Tensor:
        w_ih, w_hh, b_ih, b_hh = self._weights(layer)
        # b_hn sits inside r * (W_hn h + b_hn), so b_hh stays with the hidden projection.
        hs = gru_layer(linear(x, w_ih, b_ih), w_hh, b_hh)
        return hs if keep_sequence else hs[:, -1]
