"""LSTM and GRU layers of K models as autograd Functions with a hand-written backward.

On a GPU a pack's step is bounded by kernel launches, and an unrolled recurrence under
autograd launches ~24 operators per time step (7 forward, ~17 backward: every gate's
split, chunk and pointwise op has its own backward node). Here the backward is written
out (back-propagation through time) so that everything that does not depend on the
recurrence is computed once for all time steps, and each step does only what must be
sequential:

    LSTM  forward 7 operators per step, backward 5 (was ~17)
    GRU   forward 5 operators per step, backward 6 (was ~22)

Inputs are the input projections of every step, computed before the loop by one batched
matmul (`xproj`, (K, T, B, G*H)), and the stacked hidden weights (K, G*H, H). The math
is PyTorch's; the gate order of the LSTM is (o, i, f, g) here, so that one sigmoid
covers three gates and the gates that the cell state's gradient scales (i, f, g) are
contiguous (the caller permutes PyTorch's (i, f, g, o) rows once per forward).

Under autocast the caller casts the weights once per forward; the loop runs in the
inputs' dtype with autocast off, so no weight is recast at every step.
"""

from __future__ import annotations

from typing import Any

import torch

_sigmoid_backward = torch.ops.aten.sigmoid_backward.default  # (grad, s) -> grad * s * (1 - s)
_tanh_backward = torch.ops.aten.tanh_backward.default  # (grad, t) -> grad * (1 - t^2)


def _no_autocast(device: torch.device) -> Any:
    return torch.autocast(device_type=device.type, enabled=False)


def _previous(states: torch.Tensor) -> torch.Tensor:
    """(T, K, B, H) states at t - 1 for every t (zeros at t = 0)."""
    return torch.cat((torch.zeros_like(states[:1]), states[:-1]), dim=0)


# Buffers are time-major (T, K, B, ...): each step reads and writes one contiguous block, which
# keeps the CPU's kernels vectorised and a GPU's accesses coalesced. Inputs and outputs keep
# the (K, T, B, ...) layout of the callers (transposed views).


def oifg(t: torch.Tensor, hidden: int) -> torch.Tensor:
    """LSTM gate rows (dim 1 of a (K, 4H, ...) tensor) from PyTorch's (i, f, g, o) to the layer's (o, i, f, g)."""
    i_f, g, o = t.split((2 * hidden, hidden, hidden), dim=1)
    return torch.cat((o, i_f, g), dim=1)


class LSTMLayer(torch.autograd.Function):
    """h for every step (K, T, B, H) of K LSTM layers and the last step's cell state c (K, B, H); gate rows in
    (o, i, f, g) order, biases in xproj."""

    @staticmethod
    def forward(ctx: Any, xproj: torch.Tensor, w_hh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.set_materialize_grads(False)  # a caller that reads only h sends no gradient for c
        k, steps, batch, width = xproj.shape
        hidden = width // 4
        x = xproj.transpose(0, 1)  # (T, K, B, 4H) view
        acts = xproj.new_empty(steps, k, batch, width)  # sigmoid(o, i, f), tanh(g) per step
        cells = xproj.new_empty(steps, k, batch, hidden)
        cells_tanh = torch.empty_like(cells)
        hs = torch.empty_like(cells)
        w_t = w_hh.transpose(1, 2)
        with _no_autocast(xproj.device):
            for t in range(steps):
                pre = x[t] if t == 0 else torch.baddbmm(x[t], hs[t - 1], w_t)
                torch.sigmoid(pre[..., : 3 * hidden], out=acts[t, ..., : 3 * hidden])
                torch.tanh(pre[..., 3 * hidden :], out=acts[t, ..., 3 * hidden :])
                o, i, f, g = acts[t].split(hidden, dim=-1)
                if t == 0:  # c = 0 before the first step: no forget term
                    torch.mul(i, g, out=cells[t])
                else:
                    torch.addcmul(f * cells[t - 1], i, g, out=cells[t])
                torch.tanh(cells[t], out=cells_tanh[t])
                torch.mul(o, cells_tanh[t], out=hs[t])
        ctx.save_for_backward(acts, cells, cells_tanh, hs, w_hh)
        return hs.transpose(0, 1), cells[steps - 1].clone()

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor | None, grad_cell: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        acts, cells, cells_tanh, hs, w_hh = ctx.saved_tensors
        steps, k, batch, width = acts.shape
        hidden = width // 4
        grad_hs = torch.zeros_like(hs) if grad_out is None else grad_out.transpose(0, 1)
        o, i, f, g = acts.split(hidden, dim=-1)
        # Every factor that does not depend on the recurrence, for all steps at once:
        # d pre_o = dh * tanh(c) o (1 - o); d pre_(i, f, g) = dc * (g i (1 - i), c_prev f (1 - f), i (1 - g^2));
        # dc gains dh * o (1 - tanh(c)^2).
        by_dh = _sigmoid_backward(cells_tanh, o)
        by_dc = torch.cat((_sigmoid_backward(g, i), _sigmoid_backward(_previous(cells), f), _tanh_backward(i, g)), dim=-1)
        dc_from_dh = _tanh_backward(o, cells_tanh)
        grad_pre = torch.empty_like(acts)
        dh = grad_hs[steps - 1]
        dc = None
        for t in range(steps - 1, -1, -1):
            if t == steps - 1:  # the last cell state's own gradient (c_n read by the caller) starts the chain
                dc = dh * dc_from_dh[t] if grad_cell is None else torch.addcmul(grad_cell, dh, dc_from_dh[t])
            else:
                dc = torch.addcmul(dc * f[t + 1], dh, dc_from_dh[t])
            torch.mul(by_dh[t], dh, out=grad_pre[t, ..., :hidden])
            torch.mul(by_dc[t].unflatten(-1, (3, hidden)), dc.unsqueeze(2), out=grad_pre[t, ..., hidden:].unflatten(-1, (3, hidden)))
            if t > 0:  # through the hidden projection, plus what h_(t-1) gets from above
                dh = torch.baddbmm(grad_hs[t - 1], grad_pre[t], w_hh)
        return grad_pre.transpose(0, 1), _summed_outer(grad_pre, hs)


class GRULayer(torch.autograd.Function):
    """h for every step (K, T, B, H) of K GRU layers; gate rows (r, z, n) as PyTorch's, b_ih in xproj."""

    @staticmethod
    def forward(ctx: Any, xproj: torch.Tensor, w_hh: torch.Tensor, b_hh: torch.Tensor) -> torch.Tensor:
        k, steps, batch, width = xproj.shape
        hidden = width // 3
        x = xproj.transpose(0, 1)  # (T, K, B, 3H) view
        with _no_autocast(xproj.device):
            # The hidden projection's additive term per step: (x_r + b_hr, x_z + b_hz, b_hn), so that one
            # baddbmm gives the r and z pre-activations and W_hn h + b_hn (which r scales) at once.
            base = torch.cat((x[..., : 2 * hidden] + b_hh[:, None, : 2 * hidden],
                              b_hh[:, None, 2 * hidden :].expand(steps, k, batch, hidden)), dim=-1)
            projected = torch.empty_like(base)  # (r, z pre-activations, W_hn h + b_hn) per step
            gates = xproj.new_empty(steps, k, batch, 2 * hidden)  # sigmoid(r, z)
            news = xproj.new_empty(steps, k, batch, hidden)  # n
            hs = torch.empty_like(news)
            zero = xproj.new_zeros(k, batch, hidden)
            w_t = w_hh.transpose(1, 2)
            for t in range(steps):
                if t == 0:  # h = 0 before the first step: the projection is the bias alone
                    projected[0] = base[0]
                else:
                    torch.baddbmm(base[t], hs[t - 1], w_t, out=projected[t])
                torch.sigmoid(projected[t, ..., : 2 * hidden], out=gates[t])
                r, z = gates[t].split(hidden, dim=-1)
                torch.tanh(torch.addcmul(x[t, ..., 2 * hidden :], r, projected[t, ..., 2 * hidden :]), out=news[t])
                torch.lerp(news[t], zero if t == 0 else hs[t - 1], z, out=hs[t])  # (1 - z) n + z h
        ctx.save_for_backward(projected, gates, news, hs, w_hh)
        return hs.transpose(0, 1)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        projected, gates, news, hs, w_hh = ctx.saved_tensors
        steps, k, batch, width = projected.shape
        hidden = width // 3
        grad_hs = grad_out.transpose(0, 1)
        r, z = gates.split(hidden, dim=-1)
        hidden_n = projected[..., 2 * hidden :]
        # For all steps at once: d pre_n = dh (1 - z)(1 - n^2); d pre_z = dh (h_prev - n) z (1 - z);
        # d pre_r = d pre_n (W_hn h + b_hn) r (1 - r); d(W_hn h + b_hn) = d pre_n r; dh_prev gains dh z.
        n_factor = _tanh_backward(1 - z, news)
        z_factor = _sigmoid_backward(_previous(hs) - news, z)
        r_factor = _sigmoid_backward(hidden_n, r)
        grad_projected = torch.empty_like(projected)  # also d(x_r, x_z): they enter the same sums
        grad_x_n = torch.empty_like(news)
        dh = grad_hs[steps - 1]
        for t in range(steps - 1, -1, -1):
            torch.mul(dh, n_factor[t], out=grad_x_n[t])
            torch.mul(dh, z_factor[t], out=grad_projected[t, ..., hidden : 2 * hidden])
            torch.mul(grad_x_n[t], r_factor[t], out=grad_projected[t, ..., :hidden])
            torch.mul(grad_x_n[t], r[t], out=grad_projected[t, ..., 2 * hidden :])
            if t > 0:
                dh = torch.baddbmm(torch.addcmul(grad_hs[t - 1], dh, z[t]), grad_projected[t], w_hh)
        grad_xproj = torch.cat((grad_projected[..., : 2 * hidden], grad_x_n), dim=-1)
        grad_b_hh = grad_projected.sum(dim=(0, 2))
        return grad_xproj.transpose(0, 1), _summed_outer(grad_projected, hs), grad_b_hh


def _summed_outer(grad_pre: torch.Tensor, hs: torch.Tensor) -> torch.Tensor:
    """Sum over steps t >= 1 and the batch of grad_pre_t^T h_(t-1): the hidden weights' gradient (K, G*H, H).
    Time-major inputs (T, K, B, ...)."""
    steps, k, batch, width = grad_pre.shape
    if steps == 1:
        return grad_pre.new_zeros(k, width, hs.shape[-1])
    later = grad_pre[1:].transpose(0, 1).reshape(k, (steps - 1) * batch, width)
    earlier = hs[:-1].transpose(0, 1).reshape(k, (steps - 1) * batch, hs.shape[-1])
    return torch.bmm(later.transpose(1, 2), earlier)


def lstm_layer(xproj: torch.Tensor, w_hh: torch.Tensor) -> torch.Tensor:
    """Every step's h (K, T, B, H); w_hh is cast to xproj's dtype once (autocast's matmul dtype)."""
    return LSTMLayer.apply(xproj, w_hh.to(xproj.dtype))[0]


def lstm_layer_and_cell(xproj: torch.Tensor, w_hh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Every step's h (K, T, B, H) and the last cell state (K, B, H), as nn.LSTM returns c_n."""
    return LSTMLayer.apply(xproj, w_hh.to(xproj.dtype))


def gru_layer(xproj: torch.Tensor, w_hh: torch.Tensor, b_hh: torch.Tensor) -> torch.Tensor:
    return GRULayer.apply(xproj, w_hh.to(xproj.dtype), b_hh.to(xproj.dtype))
