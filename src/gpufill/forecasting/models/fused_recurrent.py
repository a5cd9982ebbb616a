"""Fused LSTM and GRU packs: K recurrent forecasters as one batched-matmul recurrence.

Why by hand: torch.func.vmap has no batching rule for nn.LSTM / nn.GRU, and the cuDNN
kernels behind them run one model (one weight set) per call, so K models would be K
sequential launches of every step. Written as batched matmuls, one `baddbmm` per time
step advances all K models at once.

Per layer, the input projection of every time step is one batched matmul before the loop;
the loop then does one `baddbmm` (hidden projection) and a few element-wise ops per step.
Gate order and math are PyTorch's, so fused model k computes what plain model k computes:

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

__all__ = ["FusedGRU", "FusedLSTM"]


def _ifog(t: torch.Tensor, hidden: int) -> torch.Tensor:
    """LSTM gate rows (dim 1 of a (K, 4H, ...) tensor) from (i, f, g, o) to (i, f, o, g)."""
    i_f, g, o = t.split((2 * hidden, hidden, hidden), dim=1)
    return torch.cat((i_f, o, g), dim=1)


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
        # Gate rows go from PyTorch's (i, f, g, o) to (i, f, o, g), once per forward: each step
        # then takes one sigmoid over a 3H block and one tanh over an H block.
        w_ih, w_hh, bias = (_ifog(t, hidden) for t in (w_ih, w_hh, b_ih + b_hh))
        # Both biases enter the gates additively: folded into the input projection once,
        # the step is a single baddbmm(projected input, h, W_hh^T).
        steps = linear(x, w_ih, bias).unbind(1)  # T x (K, B, 4H); backward: one stack
        w_hh_t = w_hh.transpose(1, 2)  # (K, H, 4H), a view: BLAS reads it transposed
        # Gates are cut with split/chunk, never sliced: each slice's backward zero-fills a whole
        # gate-sized tensor, a split's backward is one cat.
        # h = c = 0 at t = 0: no hidden matmul, no forget term.
        sig, g = steps[0].split((3 * hidden, hidden), dim=2)
        i, _, o = sig.sigmoid().chunk(3, dim=2)
        c = i * g.tanh()
        h = o * c.tanh()
        outputs = [h]
        for step in steps[1:]:
            sig, g = torch.baddbmm(step, h, w_hh_t).split((3 * hidden, hidden), dim=2)
            i, f, o = sig.sigmoid().chunk(3, dim=2)
            c = torch.addcmul(f * c, i, g.tanh())
            h = o * c.tanh()
            if keep_sequence:
                outputs.append(h)
        return torch.stack(outputs, dim=1) if keep_sequence else h


@fuses(GRUForecaster)
class FusedGRU(_FusedRecurrent):
    """K `GRUForecaster`s of one shape as one module."""

    gates = 3

    def _layer(self, x: torch.Tensor, layer: int, *, keep_sequence: bool) -> torch.Tensor:
        w_ih, w_hh, b_ih, b_hh = self._weights(layer)
        hidden = self.hidden_size
        steps = linear(x, w_ih, b_ih).unbind(1)  # T x (K, B, 3H); backward: one stack
        w_hh_t = w_hh.transpose(1, 2)  # (K, H, 3H), a view
        # b_hn sits inside r * (W_hn h + b_hn), so b_hh stays in the hidden projection.
        b_hh = b_hh.unsqueeze(1)  # (K, 1, 3H), broadcast over the batch
        # h = 0 at t = 0: the hidden projection is the bias alone, and h' = (1 - z) n.
        # The bias takes the gates' dtype so that h does too (bf16 under autocast, as baddbmm's
        # output is in every later step): torch.lerp wants one dtype.
        x_rz, x_n = steps[0].split((2 * hidden, hidden), dim=2)
        b_rz, b_n = b_hh.to(x_rz.dtype).split((2 * hidden, hidden), dim=2)
        r, z = (x_rz + b_rz).sigmoid().chunk(2, dim=2)
        n = torch.addcmul(x_n, r, b_n).tanh()
        h = n - z * n
        outputs = [h]
        for step in steps[1:]:
            x_rz, x_n = step.split((2 * hidden, hidden), dim=2)
            h_rz, h_n = torch.baddbmm(b_hh, h, w_hh_t).split((2 * hidden, hidden), dim=2)
            r, z = (x_rz + h_rz).sigmoid().chunk(2, dim=2)
            n = torch.addcmul(x_n, r, h_n).tanh()
            h = torch.lerp(n, h, z)  # n + z (h - n) = (1 - z) n + z h
            if keep_sequence:
                outputs.append(h)
        return torch.stack(outputs, dim=1) if keep_sequence else h
